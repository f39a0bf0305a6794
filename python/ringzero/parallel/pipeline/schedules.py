"""Schedule generators: each returns a Plan (plan.py) for `num_ranks` pipeline ranks and
`num_microbatches` microbatches. They check their arguments before anything communicates.

  GPipe            all forwards, then all backwards: bubble (p-1)/(m+p-1), m activations in flight.
  OneFOneB         p-1-r warm-up forwards, then one forward / one backward: same bubble, at most
                   p-r activations in flight on rank r.
  Interleaved1F1B  v virtual stages per rank (stage s on rank s % p): bubble about 1/v of 1F1B's.
  ZeroBubbleH1     1F1B with the backward split into I (input gradient, on the critical path) and W
                   (weight gradient), W deferred into the idle slots: bubble (p-1)/(3m+p-1) when
                   F, I and W cost the same, about 1/3 of 1F1B's.
"""
from __future__ import annotations

from .plan import Action, Kind, Plan, add_communication


def _check_positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def GPipe(num_ranks: int, num_microbatches: int) -> Plan:  # noqa: N802 (the schedule's name)
    """All forwards of all microbatches, then all backwards (in microbatch order). Any m >= 1."""
    p, m = _check_positive("num_ranks", num_ranks), _check_positive("num_microbatches", num_microbatches)
    compute = [[Action(Kind.F, r, i) for i in range(m)] + [Action(Kind.B, r, i) for i in range(m)]
               for r in range(p)]
    return add_communication("GPipe", p, p, m, compute)


def _one_f_one_b_order(p: int, m: int, r: int, backward: Kind) -> list[Action]:
    warmup = min(p - 1 - r, m)
    row = [Action(Kind.F, r, i) for i in range(warmup)]
    for i in range(m - warmup):
        row += [Action(Kind.F, r, warmup + i), Action(backward, r, i)]
    row += [Action(backward, r, i) for i in range(m - warmup, m)]
    return row


def _check_enough_microbatches(schedule: str, p: int, m: int):
    if m < p:
        raise ValueError(f"{schedule} needs num_microbatches >= num_ranks (got {m} < {p}): use at least {p} "
                         f"microbatches, or GPipe, which accepts fewer")


def OneFOneB(num_ranks: int, num_microbatches: int) -> Plan:  # noqa: N802
    """1F1B (PipeDream-flush). Needs num_microbatches >= num_ranks."""
    p, m = _check_positive("num_ranks", num_ranks), _check_positive("num_microbatches", num_microbatches)
    _check_enough_microbatches("OneFOneB", p, m)
    compute = [_one_f_one_b_order(p, m, r, Kind.B) for r in range(p)]
    return add_communication("1F1B", p, p, m, compute)


def Interleaved1F1B(num_ranks: int, num_microbatches: int, stages_per_rank: int = 2) -> Plan:  # noqa: N802
    """Megatron's interleaved 1F1B with `stages_per_rank` virtual stages per rank.

    Microbatches go through the local stages in rounds of g = m / (m // p) microbatches (g = p when
    p divides m), so m must be >= p and divisible by m // p (e.g. p=2: any m >= 2 but odd m >= 5).
    """
    p, m = _check_positive("num_ranks", num_ranks), _check_positive("num_microbatches", num_microbatches)
    v = _check_positive("stages_per_rank", stages_per_rank)
    _check_enough_microbatches("Interleaved1F1B", p, m)
    rounds = m // p
    if m % rounds:
        ok = [n for n in range(p, 4 * p + 1) if n % (n // p) == 0]
        raise ValueError(f"Interleaved1F1B with {p} ranks needs num_microbatches divisible by "
                         f"num_microbatches // num_ranks; {m} is not (valid: {ok} ...)")
    g = m // rounds
    total = m * v

    def order(k: int, backward: bool) -> tuple[int, int]:
        within = k % (g * v)
        chunk = within // g
        if backward:
            chunk = v - 1 - chunk
        return chunk, (k // (g * v)) * g + within % g

    compute = []
    for r in range(p):
        warmup = min(total, (v - 1) * g + 2 * (p - 1 - r))
        fwd = [Action(Kind.F, c * p + r, mb) for c, mb in (order(k, False) for k in range(total))]
        bwd = [Action(Kind.B, c * p + r, mb) for c, mb in (order(k, True) for k in range(total))]
        row = fwd[:warmup]
        for i in range(total - warmup):
            row += [fwd[warmup + i], bwd[i]]
        row += bwd[total - warmup:]
        compute.append(row)
    return add_communication(f"Interleaved1F1B(v={v})", p, p * v, m, compute)


def ZeroBubbleH1(num_ranks: int, num_microbatches: int, cost_f: float = 1.0, cost_i: float = 1.0,  # noqa: N802
                 cost_w: float = 1.0) -> Plan:
    """ZB-H1: F and I in 1F1B order; each W is placed where the rank would otherwise wait.

    The placement is found by list scheduling under the given costs (equal costs by default): at each
    point a rank runs its next F/I if that action's input has arrived, else a pending W; rank r runs a
    W at once when more than r are pending, so that the last ranks keep W work for their cool-down.
    With equal costs this reaches the ideal bubble (p-1)/(3m+p-1), one third of 1F1B's for large m.
    Memory: every rank holds at most p microbatches between F and W (1F1B's peak, which 1F1B has on
    rank 0 only); between I and W only the inputs and output gradients of Linear layers stay. Needs m >= p.
    """
    p, m = _check_positive("num_ranks", num_ranks), _check_positive("num_microbatches", num_microbatches)
    _check_enough_microbatches("ZeroBubbleH1", p, m)
    for name, c in (("cost_f", cost_f), ("cost_i", cost_i), ("cost_w", cost_w)):
        if not c > 0:
            raise ValueError(f"{name} must be positive, got {c!r}")
    cost = {Kind.F: cost_f, Kind.I: cost_i, Kind.W: cost_w}
    seq = [_one_f_one_b_order(p, m, r, Kind.I) for r in range(p)]
    pos = [0] * p
    t_free = [0.0] * p
    done: dict[Action, float] = {}
    pending_w: list[list[int]] = [[] for _ in range(p)]
    rows: list[list[Action]] = [[] for _ in range(p)]

    def ready_time(r: int):
        a = seq[r][pos[r]]
        dep = (Action(Kind.F, r - 1, a.microbatch) if a.kind == Kind.F and r > 0 else
               Action(Kind.I, r + 1, a.microbatch) if a.kind == Kind.I and r < p - 1 else None)
        if dep is None:
            return t_free[r]
        return max(t_free[r], done[dep]) if dep in done else None

    while any(pos[r] < len(seq[r]) or pending_w[r] for r in range(p)):
        best = None  # (start, rank, action)
        for r in range(p):
            nxt = seq[r][pos[r]] if pos[r] < len(seq[r]) else None
            start = ready_time(r) if nxt is not None else None
            if pending_w[r] and (start is None or start > t_free[r] or len(pending_w[r]) > r):
                cand = (t_free[r], r, Action(Kind.W, r, pending_w[r][0]))
            elif start is not None:
                cand = (start, r, nxt)
            else:
                continue
            if best is None or cand[0] < best[0]:
                best = cand
        start, r, a = best  # one always exists: the first pending F/I of the last busy stage is ready
        if a.kind == Kind.W:
            pending_w[r].pop(0)
        else:
            pos[r] += 1
            if a.kind == Kind.I:
                pending_w[r].append(a.microbatch)
        t_free[r] = start + cost[a.kind]
        done[a] = t_free[r]
        rows[r].append(a)
    return add_communication("ZB-H1", p, p, m, rows)


SCHEDULES = {"GPipe": GPipe, "1F1B": OneFOneB, "Interleaved1F1B": Interleaved1F1B, "ZBH1": ZeroBubbleH1}
"""Schedule name -> generator, as the runtime, the trace tool and the benchmark name them."""


def make_plan(schedule: str, num_ranks: int, num_microbatches: int, stages_per_rank: int = 2) -> Plan:
    """The plan of the named schedule (a key of SCHEDULES); stages_per_rank applies to Interleaved1F1B."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; use one of {sorted(SCHEDULES)}")
    if schedule == "Interleaved1F1B":
        return Interleaved1F1B(num_ranks, num_microbatches, stages_per_rank)
    return SCHEDULES[schedule](num_ranks, num_microbatches)
