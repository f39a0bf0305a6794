"""The schedule IR: a plan is a list of actions per pipeline rank, each tagged with stage and microbatch.

Compute actions: F (forward), B (whole backward), I (input-gradient half of the backward) and W
(weight-gradient half), as in zero-bubble pipelining. Communication actions: SEND_F / RECV_F move a
stage's output activation to the next stage, SEND_B / RECV_B move a stage's input gradient to the
previous stage. A RECV only posts the receive; the compute that consumes it waits for the data, and
a SEND is posted right after its producer and never waited on before the end of the step (sends
never block a rank). The simulator (simulate.py) and the runtime (runtime.py) share these semantics.

Stage s lives on pipeline rank s % num_ranks ("loop" placement: one stage per rank, or several
"virtual" stages per rank for the interleaved schedule).
"""
from __future__ import annotations

import dataclasses
import enum


class Kind(enum.Enum):
    F = "F"
    B = "B"
    I = "I"  # noqa: E741 (the name the zero-bubble paper uses)
    W = "W"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"


COMPUTE = (Kind.F, Kind.B, Kind.I, Kind.W)
COMM = (Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B)


@dataclasses.dataclass(frozen=True)
class Action:
    """One step of one rank: `kind` applied to (stage, microbatch)."""

    kind: Kind
    stage: int
    microbatch: int

    def __str__(self):
        return f"{self.kind.value}{self.stage}.{self.microbatch}"


@dataclasses.dataclass
class Plan:
    """A schedule as data. actions[r] is pipeline rank r's program, executed in order."""

    name: str
    num_ranks: int
    """Pipeline ranks (the size of the "pp" group)."""
    num_stages: int
    """Model stages; a multiple of num_ranks (stages_per_rank > 1 for interleaved schedules)."""
    num_microbatches: int
    actions: list[list[Action]]

    @property
    def stages_per_rank(self) -> int:
        return self.num_stages // self.num_ranks

    def rank_of(self, stage: int) -> int:
        """The pipeline rank that holds `stage` (loop placement)."""
        return stage % self.num_ranks

    def stages_of(self, rank: int) -> list[int]:
        """The stages held by pipeline rank `rank`, in model order."""
        return list(range(rank, self.num_stages, self.num_ranks))

    @property
    def forward_only(self) -> bool:
        """True for an evaluation plan: forwards and their transfers only (see forward_plan)."""
        return not any(a.kind in (Kind.B, Kind.I, Kind.W) for row in self.actions for a in row)

    @property
    def split_backward(self) -> bool:
        """True when the plan uses I and W instead of B (zero-bubble)."""
        return any(a.kind in (Kind.I, Kind.W) for row in self.actions for a in row)

    def table(self) -> str:
        """The plan as a text table: one column per rank, one row per step, communication omitted."""
        cols = [[str(a) for a in row if a.kind in COMPUTE] for row in self.actions]
        depth = max((len(c) for c in cols), default=0)
        width = max([len(s) for c in cols for s in c] + [6])
        lines = [f"{self.name}: {self.num_ranks} ranks, {self.num_stages} stages, {self.num_microbatches} microbatches",
                 "step " + " ".join(f"rank{r}".ljust(width) for r in range(self.num_ranks))]
        for i in range(depth):
            cells = [(c[i] if i < len(c) else "").ljust(width) for c in cols]
            lines.append(f"{i:4d} " + " ".join(cells))
        return "\n".join(lines)


def producer_of_input(plan: Plan, a: Action) -> Action | None:
    """The compute action on another stage whose result `a` (a compute action) consumes, or None.

    F(s, m) consumes F(s-1, m)'s output; B or I (s, m) consume the input gradient of stage s+1's B or I.
    """
    if a.kind == Kind.F and a.stage > 0:
        return Action(Kind.F, a.stage - 1, a.microbatch)
    if a.kind in (Kind.B, Kind.I) and a.stage < plan.num_stages - 1:
        kind = Kind.I if plan.split_backward else Kind.B
        return Action(kind, a.stage + 1, a.microbatch)
    return None


def add_communication(name: str, num_ranks: int, num_stages: int, num_microbatches: int,
                      compute: list[list[Action]]) -> Plan:
    """Builds a Plan from compute-only programs by inserting SEND/RECV between stages on different ranks.

    A SEND goes right after its producer. A RECV goes before the compute action that precedes its
    consumer on the same rank, so that the transfer overlaps that compute (prefetch by one).
    """
    plan = Plan(name, num_ranks, num_stages, num_microbatches, [[] for _ in range(num_ranks)])
    for r, row in enumerate(compute):
        out = plan.actions[r]
        for i, a in enumerate(row):
            src = producer_of_input(plan, a)
            if src is not None and plan.rank_of(src.stage) != r:
                recv = Action(Kind.RECV_F if a.kind == Kind.F else Kind.RECV_B, a.stage, a.microbatch)
                # Prefetch: place it before the previous compute action if there is one.
                computes = [j for j, b in enumerate(out) if b.kind in COMPUTE]
                out.insert(computes[-1] if computes else len(out), recv)
            out.append(a)
            if a.kind == Kind.F and a.stage < num_stages - 1 and plan.rank_of(a.stage + 1) != r:
                out.append(Action(Kind.SEND_F, a.stage, a.microbatch))
            if a.kind in (Kind.B, Kind.I) and a.stage > 0 and plan.rank_of(a.stage - 1) != r:
                out.append(Action(Kind.SEND_B, a.stage, a.microbatch))
    return plan


def forward_plan(plan: Plan) -> Plan:
    """The evaluation plan of `plan`: each rank's F, SEND_F and RECV_F in the training order, the
    backward dropped. Every forward keeps its place relative to the others, so a plan that cannot
    deadlock stays so (no receive waits on a backward any more)."""
    keep = (Kind.F, Kind.SEND_F, Kind.RECV_F)
    return Plan(f"{plan.name} forward", plan.num_ranks, plan.num_stages, plan.num_microbatches,
                [[a for a in row if a.kind in keep] for row in plan.actions])
