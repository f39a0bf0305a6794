"""The plan validator: counts and local dependencies, checked before anything runs.

Cross-rank progress (deadlock freedom) is the simulator's job (simulate.py): the runtime runs both.
"""
from __future__ import annotations

from collections import Counter

from .plan import Action, Kind, Plan, producer_of_input


class PlanError(ValueError):
    """A plan that cannot run: wrong counts, a missing or extra transfer, or an order that breaks a dependency."""


def _expected_comm(plan: Plan) -> Counter:
    """Each transfer between stages on different ranks, as the SEND on one side and the RECV on the other."""
    want = Counter()
    for s in range(plan.num_stages - 1):
        if plan.rank_of(s) == plan.rank_of(s + 1):
            continue
        for m in range(plan.num_microbatches):
            want[Action(Kind.SEND_F, s, m)] += 1
            want[Action(Kind.RECV_F, s + 1, m)] += 1
            if not plan.forward_only:
                want[Action(Kind.SEND_B, s + 1, m)] += 1
                want[Action(Kind.RECV_B, s, m)] += 1
    return want


def _local_predecessors(plan: Plan, a: Action) -> list[Action]:
    """Actions that must come before `a` in the same rank's program (when they live on that rank)."""
    s, m = a.stage, a.microbatch
    if a.kind == Kind.F:
        return [Action(Kind.RECV_F, s, m)] + ([Action(Kind.F, s - 1, m)] if s > 0 else [])
    if a.kind == Kind.SEND_F:
        return [Action(Kind.F, s, m)]
    if a.kind in (Kind.B, Kind.I):
        before = [Action(Kind.F, s, m), Action(Kind.RECV_B, s, m)]
        dep = producer_of_input(plan, a)
        return before + ([dep] if dep is not None else [])
    if a.kind == Kind.W:
        return [Action(Kind.I, s, m)]
    if a.kind == Kind.SEND_B:
        return [Action(Kind.I if plan.split_backward else Kind.B, s, m)]
    return []


def validate(plan: Plan) -> None:
    """Raises PlanError listing what is wrong with `plan` (up to 10 problems); returns None if it is valid."""
    problems = []
    p, n, m = plan.num_ranks, plan.num_stages, plan.num_microbatches
    if p < 1 or m < 1 or n < p or n % p:
        raise PlanError(f"{plan.name}: need num_ranks >= 1, num_microbatches >= 1 and num_stages a multiple of "
                        f"num_ranks; got ranks={p}, stages={n}, microbatches={m}")
    if len(plan.actions) != p:
        raise PlanError(f"{plan.name}: {len(plan.actions)} programs for {p} ranks")
    seen = Counter()
    for r, row in enumerate(plan.actions):
        for a in row:
            if not (0 <= a.stage < n and 0 <= a.microbatch < m):
                problems.append(f"rank {r}: {a} names a stage or microbatch out of range")
            elif plan.rank_of(a.stage) != r:
                problems.append(f"rank {r}: {a} belongs to stage {a.stage}, which lives on rank {plan.rank_of(a.stage)}")
            seen[a] += 1
    kinds = {a.kind for a in seen}
    if Kind.B in kinds and kinds & {Kind.I, Kind.W}:
        problems.append("the plan mixes B with I/W: use B everywhere or I and W everywhere")
    backward = () if plan.forward_only else (Kind.I, Kind.W) if plan.split_backward else (Kind.B,)
    want = _expected_comm(plan)
    for s in range(n):
        for mb in range(m):
            for k in (Kind.F,) + backward:
                want[Action(k, s, mb)] += 1
    for a in sorted(set(want) | set(seen), key=lambda a: (a.stage, a.microbatch, a.kind.value)):
        if seen[a] != want[a]:
            problems.append(f"{a} appears {seen[a]} times, expected {want[a]}")
    for r, row in enumerate(plan.actions):
        index = {a: i for i, a in enumerate(row)}
        for i, a in enumerate(row):
            for before in _local_predecessors(plan, a):
                j = index.get(before)
                if j is not None and j > i:
                    problems.append(f"rank {r}: {a} at step {i} comes before {before} at step {j}, which it needs")
    if problems:
        more = f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else ""
        raise PlanError(f"invalid plan {plan.name}:\n  " + "\n  ".join(problems[:10]) + more)
