"""Pipeline runtime against the unsplit model: for every schedule (GPipe, 1F1B, interleaved 1F1B with 2
virtual stages per rank, ZB-H1), 2 and 4 pipeline ranks, and microbatch counts equal to, larger than
and not a multiple of the rank count, the loss and every parameter gradient equal those of the same
GPT run in one process on the whole batch.

Reference: a copy of the model built from the same seed on each rank, forward and backward on the whole
batch with the mean next-token cross-entropy. Float64 throughout (including the loss: lm_loss computes
in float32, so the tests use the same loss in float64), so the only difference is summation order:
tolerance rtol=1e-9, atol=1e-12. The batch of 10 does not divide evenly into most
microbatch counts, which checks the per-microbatch loss weights; a second step with a shorter sequence
checks that shapes are agreed again.
"""
import pytest
import torch

from harness import run_ranks
from pipeline_cases import ATOL, RTOL, SCHEDULES, build, data, lm_loss, reference
from ringzero.parallel.pipeline import PipelineRunner, PipelineStage, split

def run_case(rank, world, schedule, m, seq_len, ref_loss, ref_grads, by="params"):
    v = 2 if schedule == "Interleaved1F1B" else 1
    model = build()
    names = {id(p): n for n, p in model.named_parameters()}
    parts = split(model.as_sequential(), world * v, by=by)
    stages = [PipelineStage(parts[s], s, world * v) for s in range(rank, world * v, world)]
    runner = PipelineRunner(stages, schedule, m, loss_fn=lm_loss)
    x, y = data(0, seq_len)
    loss = runner.step(x if rank == 0 else None, y if rank == world - 1 else None)
    if rank == world - 1:
        torch.testing.assert_close(loss, ref_loss, rtol=RTOL, atol=ATOL, msg=lambda s: f"{schedule} m={m} loss: {s}")
    else:
        assert loss is None
    checked = 0
    for st in stages:
        for p in st.module.parameters():
            name = names[id(p)]
            assert p.grad is not None, f"{schedule} m={m}: {name} got no gradient"
            torch.testing.assert_close(p.grad, ref_grads[name], rtol=RTOL, atol=ATOL,
                                       msg=lambda s: f"{schedule} m={m} rank {rank} {name}: {s}")
            checked += 1
    return checked


def parity_cases(rank, world, micro_counts):
    refs = {t: reference(t) for t in (16, 12)}
    checked = 0
    for schedule in SCHEDULES:
        for m in micro_counts:
            checked += run_case(rank, world, schedule, m, 16, *refs[16])
    # Variable sequence length: one runner, two steps, the second with a shorter sequence.
    model = build()
    parts = split(model.as_sequential(), world, by="layers")
    runner = PipelineRunner(PipelineStage(parts[rank], rank, world), "1F1B", world, loss_fn=lm_loss)
    names = {id(p): n for n, p in model.named_parameters()}
    for t in (16, 12):
        model.zero_grad(set_to_none=True)
        x, y = data(0, t)
        loss = runner.step(x if rank == 0 else None, y if rank == world - 1 else None)
        if rank == world - 1:
            torch.testing.assert_close(loss, refs[t][0], rtol=RTOL, atol=ATOL)
        for p in parts[rank].parameters():
            torch.testing.assert_close(p.grad, refs[t][1][names[id(p)]], rtol=RTOL, atol=ATOL)
    return checked


def optimizer_case(rank, world):
    """The runner's optimizer step after accumulation equals SGD on the reference gradients."""
    ref_model = build()
    x, y = data(0, 16)
    lm_loss(ref_model(x), y).backward()
    torch.optim.SGD(ref_model.parameters(), lr=0.5).step()
    want = dict(ref_model.named_parameters())
    model = build()
    parts = split(model.as_sequential(), world)
    opt = torch.optim.SGD(parts[rank].parameters(), lr=0.5)
    runner = PipelineRunner(PipelineStage(parts[rank], rank, world), "ZBH1", 2 * world, loss_fn=lm_loss, optimizer=opt)
    runner.step(x if rank == 0 else None, y if rank == world - 1 else None)
    for n, p in model.named_parameters():
        if any(p is q for q in parts[rank].parameters()):
            torch.testing.assert_close(p.detach(), want[n].detach(), rtol=RTOL, atol=ATOL)
            assert p.grad is None, "the runner zeroes gradients after the optimizer step"
    return True


@pytest.mark.parametrize("world,micro_counts", [(2, [2, 4, 3]), (4, [4, 8, 5])])
def test_pipeline_matches_unsplit_model(world, micro_counts):
    checked = run_ranks(world, parity_cases, micro_counts)
    assert all(c > 0 for c in checked), checked


def test_optimizer_step_matches_reference():
    assert run_ranks(2, optimizer_case) == [True, True]


def test_single_rank_pipeline_holds_all_stages():
    """World size 1: every stage on one rank (local hand-off, no communication)."""
    def one(rank, world):
        ref_loss, ref_grads = reference(16)
        for schedule, m in (("GPipe", 3), ("1F1B", 2), ("ZBH1", 1), ("Interleaved1F1B", 3)):
            run_case(rank, world, schedule, m, 16, ref_loss, ref_grads)
        return True
    assert run_ranks(1, one) == [True]
