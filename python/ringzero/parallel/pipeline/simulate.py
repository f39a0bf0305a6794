"""The plan simulator: runs a plan with given action costs, reports the bubble, finds deadlocks.

Model (the runtime's semantics, plan.py): each rank runs its program in order; SEND and RECV only
post (no time); a transfer starts when both sides have posted and takes `comm` time; a compute action
starts when the rank is free and its input has arrived. A rank whose next compute waits for a transfer
that no rank will ever post is deadlocked: the simulator then raises DeadlockError naming each
stuck rank and what it waits for.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Callable

from .plan import COMPUTE, Action, Kind, Plan, producer_of_input

Timeline = list[list[tuple[Action, float, float]]]
"""Per rank: (compute action, start, end), in execution order. Simulated (cost units) or measured (s)."""


class DeadlockError(RuntimeError):
    """The plan cannot finish: some rank waits for a transfer that is never posted."""


def uniform_costs(F: float = 1.0, B: float = 2.0, I: float = 1.0, W: float = 1.0,  # noqa: N803, E741
                  comm: float = 0.0) -> Callable[[Action], float]:
    """A cost function with one cost per kind (the same for every stage); comm is the transfer time."""
    table = {Kind.F: F, Kind.B: B, Kind.I: I, Kind.W: W, Kind.SEND_F: comm, Kind.SEND_B: comm}
    return lambda a: table.get(a.kind, 0.0)


def measured_costs(timeline: Timeline, comm: float = 0.0) -> Callable[[Action], float]:
    """A cost function from a measured timeline: the mean duration of each (kind, stage)."""
    sums, counts = defaultdict(float), defaultdict(int)
    for row in timeline:
        for a, start, end in row:
            sums[a.kind, a.stage] += end - start
            counts[a.kind, a.stage] += 1
    means = {k: sums[k] / counts[k] for k in sums}
    return lambda a: comm if a.kind in (Kind.SEND_F, Kind.SEND_B) else means.get((a.kind, a.stage), 0.0)


@dataclasses.dataclass
class SimResult:
    timeline: Timeline
    makespan: float
    """From the first start to the last end, over all ranks."""
    bubble: float
    """Idle fraction of the ranks' time: 1 - sum(compute time) / (ranks * makespan)."""
    peak_in_flight: list[int]
    """Per rank, the most microbatches held at once between their F and the end of their backward."""


def bubble_fraction(timeline: Timeline) -> float:
    """1 - busy / (ranks * span) over a timeline; the same definition for simulated and measured runs."""
    starts = [s for row in timeline for _, s, _ in row]
    ends = [e for row in timeline for _, _, e in row]
    if not starts:
        return 0.0
    span = max(ends) - min(starts)
    busy = sum(e - s for row in timeline for _, s, e in row)
    return 1.0 - busy / (len(timeline) * span) if span > 0 else 0.0


def simulate(plan: Plan, cost: Callable[[Action], float] | None = None) -> SimResult:
    """Runs `plan` in simulated time; cost(action) gives each action's duration (uniform_costs() by default)."""
    cost = cost or uniform_costs()
    p = plan.num_ranks
    pc, clock = [0] * p, [0.0] * p
    posted: dict[Action, float] = {}  # SEND_*/RECV_* -> time posted
    finished: dict[Action, float] = {}  # compute -> end time
    timeline: Timeline = [[] for _ in range(p)]
    held, peak = [set() for _ in range(p)], [0] * p
    release = Kind.W if plan.split_backward else Kind.B

    def arrival(r: int, a: Action):
        """When the input of compute action `a` is on rank r, or None if not known yet."""
        src = producer_of_input(plan, a)
        if src is None:
            return 0.0
        if plan.rank_of(src.stage) == r:
            return finished.get(src)
        send = Action(Kind.SEND_F if a.kind == Kind.F else Kind.SEND_B, src.stage, a.microbatch)
        recv = Action(Kind.RECV_F if a.kind == Kind.F else Kind.RECV_B, a.stage, a.microbatch)
        if send not in posted or recv not in posted:
            return None
        return max(posted[send], posted[recv]) + cost(send)

    progress = True
    while progress:
        progress = False
        for r in range(p):
            row = plan.actions[r]
            while pc[r] < len(row):
                a = row[pc[r]]
                if a.kind not in COMPUTE:
                    posted[a] = clock[r]
                else:
                    ready = arrival(r, a)
                    if ready is None:
                        break
                    start = max(clock[r], ready)
                    clock[r] = start + cost(a)
                    finished[a] = clock[r]
                    timeline[r].append((a, start, clock[r]))
                    if a.kind == Kind.F:
                        held[r].add((a.stage, a.microbatch))
                        peak[r] = max(peak[r], len(held[r]))
                    elif a.kind == release:
                        held[r].discard((a.stage, a.microbatch))
                pc[r] += 1
                progress = True
    stuck = [r for r in range(p) if pc[r] < len(plan.actions[r])]
    if stuck:
        lines = []
        for r in stuck:
            a = plan.actions[r][pc[r]]
            src = producer_of_input(plan, a)
            lines.append(f"rank {r} stuck at step {pc[r]} ({a}), waiting for the output of {src}")
        raise DeadlockError(f"plan {plan.name} deadlocks:\n  " + "\n  ".join(lines))
    makespan = max((e for row in timeline for _, _, e in row), default=0.0) - \
        min((s for row in timeline for _, s, _ in row), default=0.0)
    return SimResult(timeline, makespan, bubble_fraction(timeline), peak)
