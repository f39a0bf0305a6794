"""Schedules as data, checked before anything runs: generators, validator, simulator, split, trace files,
and the runtime's refusals of invalid configurations (before any communication).

References: the closed-form bubbles (p-1)/(m+p-1) for GPipe and 1F1B with uniform costs and
(p-1)/(3m+p-1) for ZB-H1 with F = I = W (Qi et al., "Zero Bubble Pipeline Parallelism"); brute force
over all cut positions for the parameter-balanced split; hand-broken plans for the validator; a plan
with a cross-rank wait cycle for the deadlock finder.
"""
import itertools
import json

import pytest
import torch
import torch.nn as nn

from harness import run_ranks
from ringzero.parallel.pipeline import (SCHEDULES, Action, DeadlockError, GPipe, Interleaved1F1B, Kind, OneFOneB,
                                        PipelineRunner, PipelineStage, Plan, PlanError, ZeroBubbleH1,
                                        add_communication, chrome_trace, make_plan, plot_timelines, simulate,
                                        split, uniform_costs, validate)


def all_plans():
    for p in range(1, 6):
        for m in range(1, 17):
            for name in SCHEDULES:
                for v in ((2, 3) if name == "Interleaved1F1B" else (1,)):
                    try:
                        yield p, m, v, make_plan(name, p, m, v)
                    except ValueError:
                        assert m < p or name == "Interleaved1F1B", (name, p, m)


def test_every_generated_plan_is_valid_and_finishes():
    count = 0
    for p, m, v, plan in all_plans():
        validate(plan)
        result = simulate(plan, uniform_costs(F=1, B=2, I=1, W=1, comm=0.1))
        computes = sum(len(row) for row in result.timeline)
        per_mb = 3 if plan.split_backward else 2
        assert computes == per_mb * plan.num_stages * m, (plan.name, p, m)
        count += 1
    assert count > 200


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5])
def test_bubbles_match_closed_forms(p):
    for m in range(p, 17):
        formula = (p - 1) / (m + p - 1)
        for plan in (GPipe(p, m), OneFOneB(p, m)):
            got = simulate(plan, uniform_costs(F=1, B=2)).bubble
            assert got == pytest.approx(formula, abs=1e-12), (plan.name, m)
        zb = simulate(ZeroBubbleH1(p, m), uniform_costs(F=1, I=1, W=1)).bubble
        assert zb == pytest.approx((p - 1) / (3 * m + p - 1), abs=1e-12), m
        assert zb <= formula / 2 + 1e-12
        if p > 1 and m % p == 0:  # interleaving cuts the bubble (about 1/v of 1F1B's for large m)
            inter = simulate(Interleaved1F1B(p, m, 2), uniform_costs(F=1, B=2)).bubble
            assert inter < formula, m


def test_activation_memory_of_1f1b_and_gpipe():
    for p, m in ((2, 8), (4, 8), (5, 7)):
        assert simulate(GPipe(p, m)).peak_in_flight == [m] * p
        assert simulate(OneFOneB(p, m)).peak_in_flight == [p - r for r in range(p)]


@pytest.mark.parametrize("call,needle", [
    (lambda: OneFOneB(4, 3), "num_microbatches >= num_ranks"),
    (lambda: ZeroBubbleH1(3, 2), "num_microbatches >= num_ranks"),
    (lambda: Interleaved1F1B(2, 5), "divisible"),
    (lambda: Interleaved1F1B(2, 4, 0), "stages_per_rank"),
    (lambda: GPipe(0, 4), "num_ranks"),
    (lambda: GPipe(2, True), "num_microbatches"),
    (lambda: make_plan("PipeDream", 2, 4), "unknown schedule"),
])
def test_generators_reject_bad_arguments(call, needle):
    with pytest.raises(ValueError, match=needle):
        call()


def _broken(plan: Plan, edit) -> Plan:
    rows = [list(r) for r in plan.actions]
    edit(rows)
    return Plan(plan.name, plan.num_ranks, plan.num_stages, plan.num_microbatches, rows)


def test_validator_rejects_hand_broken_plans():
    good = OneFOneB(3, 4)
    validate(good)

    def swap_recv_and_forward(rows):  # RECV_F after the F that needs it
        i = rows[1].index(Action(Kind.RECV_F, 1, 0))
        j = rows[1].index(Action(Kind.F, 1, 0))
        rows[1][i], rows[1][j] = rows[1][j], rows[1][i]

    cases = {
        "comes before": swap_recv_and_forward,
        "SEND_F0.2 appears 0 times": lambda rows: rows[0].remove(Action(Kind.SEND_F, 0, 2)),
        "F2.1 appears 2 times": lambda rows: rows[2].append(Action(Kind.F, 2, 1)),
        "lives on rank 2": lambda rows: rows[0].append(Action(Kind.W, 2, 0)),
        "mixes B with I/W": lambda rows: rows[2].append(Action(Kind.I, 2, 0)),
        "out of range": lambda rows: rows[0].append(Action(Kind.F, 0, 9)),
    }
    for needle, edit in cases.items():
        with pytest.raises(PlanError, match=needle):
            validate(_broken(good, edit))


def cyclic_plan() -> Plan:
    """Locally valid, globally stuck: rank 0 waits for B1.0 before sending F0.1, which rank 1 needs first."""
    compute = [[Action(Kind.F, 0, 0), Action(Kind.B, 0, 0), Action(Kind.F, 0, 1), Action(Kind.B, 0, 1)],
               [Action(Kind.F, 1, 0), Action(Kind.F, 1, 1), Action(Kind.B, 1, 0), Action(Kind.B, 1, 1)]]
    return add_communication("cycle", 2, 2, 2, compute)


def test_simulator_finds_deadlock():
    plan = cyclic_plan()
    validate(plan)
    with pytest.raises(DeadlockError, match="rank 0 stuck .*B0.0"):
        simulate(plan)


def test_split_balances_parameters_like_brute_force():
    widths = [7, 3, 12, 5, 5, 9, 2, 11]
    blocks = nn.Sequential(*[nn.Linear(w, 4) for w in widths])
    weights = [sum(p.numel() for p in b.parameters()) for b in blocks]
    for stages in range(1, len(widths) + 1):
        parts = split(blocks, stages, by="params")
        got = max(sum(p.numel() for p in part.parameters()) for part in parts)
        best = min(max(sum(weights[a:b]) for a, b in zip((0,) + cuts, cuts + (len(weights),)))
                   for cuts in itertools.combinations(range(1, len(weights)), stages - 1))
        assert got == best and len(parts) == stages
        assert [m for part in parts for m in part] == list(blocks)  # same modules, in order, no copies
    assert [len(s) for s in split(list(blocks), 3, by="layers")] == [3, 3, 2]
    assert [len(s) for s in split(blocks, 3, by=[1, 5, 2])] == [1, 5, 2]


@pytest.mark.parametrize("kwargs,needle", [
    (dict(num_stages=9), "non-empty stages"),
    (dict(num_stages=3, by=[4, 0, 4]), "empty"),
    (dict(num_stages=2, by=[3, 3]), "sums to 6"),
    (dict(num_stages=2, by="flops"), "by='flops'"),
    (dict(num_stages=0), "positive int"),
])
def test_split_rejects_bad_arguments(kwargs, needle):
    blocks = nn.Sequential(*[nn.Linear(2, 2) for _ in range(8)])
    with pytest.raises(ValueError, match=needle):
        split(blocks, **kwargs)
    with pytest.raises(TypeError, match="nn.Sequential"):
        split(nn.Linear(2, 2), 1)


def test_plan_table_and_trace_files(tmp_path):
    plan = ZeroBubbleH1(4, 8)
    text = plan.table()
    assert "rank3" in text and text.count("W3.") == 8
    result = simulate(plan)
    trace = tmp_path / "t.json"
    chrome_trace(result.timeline, str(trace), us_per_unit=1000)
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(events) == 3 * 4 * 8 and {e["cat"] for e in events} == {"F", "I", "W"}
    pytest.importorskip("matplotlib")
    png = tmp_path / "t.png"
    plot_timelines([("simulated", result.timeline, "units")], str(png))
    assert png.read_bytes()[:4] == b"\x89PNG"


def refusals(rank, world):
    """Each bad configuration raises on every rank, and a good step afterwards still works."""
    torch.manual_seed(0)
    blocks = [nn.Linear(4, 4) for _ in range(world)]
    stage = PipelineStage(nn.Sequential(blocks[rank]), rank, world)
    loss_fn = lambda out, y: ((out - y) ** 2).mean()  # noqa: E731
    seen = []
    for make, error, needle in [
        (lambda: PipelineRunner(stage, "1F1B", world - 1, loss_fn=loss_fn), ValueError, "num_microbatches >= "),
        (lambda: PipelineRunner(stage, cyclic_plan(), loss_fn=loss_fn), DeadlockError, "deadlocks"),
        (lambda: PipelineRunner(stage, OneFOneB(world + 1, 4), loss_fn=loss_fn), ValueError, "ranks"),
        (lambda: PipelineRunner(stage, "GPipe", 2, loss_fn=None), ValueError, "loss_fn"),
    ]:
        if needle == "loss_fn" and rank != world - 1:
            continue
        with pytest.raises(error, match=needle):
            make()
        seen.append(needle)
    with pytest.raises(ValueError, match="lives on pipeline rank"):
        PipelineStage(nn.Linear(4, 4), 1, world) if rank == 0 else PipelineStage(nn.Linear(4, 4), 0, world)
    runner = PipelineRunner(stage, "1F1B", world, loss_fn=loss_fn)
    x, y = torch.randn(world, 4), torch.randn(world, 4)
    # A batch smaller than the microbatch count: the first stage refuses, every other rank hears of it.
    with pytest.raises(ValueError, match="batch size 1 < num_microbatches" if rank == 0 else "first stage rejected"):
        runner.step(x[:1] if rank == 0 else None, y[:1] if rank == world - 1 else None)
    loss = runner.step(x if rank == 0 else None, y if rank == world - 1 else None)
    return seen, loss is not None


def test_runtime_refuses_invalid_configurations():
    results = run_ranks(2, refusals)
    assert [r[1] for r in results] == [False, True]
    assert len(results[1][0]) == 4 and len(results[0][0]) == 3
