"""Pipeline x data parallelism on a (pp=2) x (dp=2) Mesh over 4 ranks: each replica runs the pipeline on
its half of the global batch, then the runner's grad_sync averages each stage's gradients across its
data-parallel replicas with ringzero.all_reduce (AVG) over mesh.group("dp"). Then GPipe and 1F1B with
each stage wrapped in ringzero DistributedDataParallel over mesh.group("dp") (it averages during every
microbatch's backward), GPipe and 1F1B with each stage wrapped in ZeroDataParallel stage 1 and 2 (one
SGD step compared, since gradients live in float32 master shards), and the refusal of a zero-bubble plan
on a wrapped stage.

Reference: the unsplit GPT in one process on the whole global batch (float64, same loss), as in
test_pipeline_parity.py; tolerance rtol=1e-9, atol=1e-12. The average of the replicas' losses must equal
the whole-batch loss too (replicas get equal halves).
"""
import pytest
import torch

import ringzero
from harness import run_ranks
from ringzero.parallel import DistributedDataParallel, Mesh, ZeroDataParallel
from ringzero.parallel.pipeline import PipelineRunner, PipelineStage, split
from pipeline_cases import ATOL, RTOL, SCHEDULES, build, lm_loss

GLOBAL_BATCH = 12


def mesh_cases(rank, world):
    mesh = Mesh(pp=2, dp=2)
    pp, dp = mesh.index("pp"), mesh.index("dp")
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, 64, (GLOBAL_BATCH, 17), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    ref = build()
    ref_loss = lm_loss(ref(x), y)
    ref_loss.backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    half = GLOBAL_BATCH // 2
    xs, ys = x[dp * half:(dp + 1) * half], y[dp * half:(dp + 1) * half]
    checked = 0
    for schedule in SCHEDULES:
        for m in (2, 3):
            v = 2 if schedule == "Interleaved1F1B" else 1
            model = build()
            names = {id(p): n for n, p in model.named_parameters()}
            parts = split(model.as_sequential(), 2 * v)
            stages = [PipelineStage(parts[s], s, 2 * v, group=mesh.group("pp")) for s in range(pp, 2 * v, 2)]
            params = [p for st in stages for p in st.module.parameters()]

            def average_over_replicas():
                for p in params:
                    ringzero.all_reduce(p.grad, op=ringzero.ReduceOp.AVG, group=mesh.group("dp"))

            runner = PipelineRunner(stages, schedule, m, loss_fn=lm_loss, grad_sync=average_over_replicas)
            loss = runner.step(xs if pp == 0 else None, ys if pp == 1 else None)
            if pp == 1:
                ringzero.all_reduce(loss, op=ringzero.ReduceOp.AVG, group=mesh.group("dp"))
                torch.testing.assert_close(loss, ref_loss.detach(), rtol=RTOL, atol=ATOL)
            for p in params:
                torch.testing.assert_close(p.grad, ref_grads[names[id(p)]], rtol=RTOL, atol=ATOL,
                                           msg=lambda s: f"{schedule} m={m} rank {rank} {names[id(p)]}: {s}")
                checked += 1
    for schedule in ("GPipe", "1F1B"):
        model = build()
        names = {id(p): n for n, p in model.named_parameters()}
        part = split(model.as_sequential(), 2)[pp]
        stage = PipelineStage(DistributedDataParallel(part, process_group=mesh.group("dp")), pp, 2,
                              group=mesh.group("pp"))
        runner = PipelineRunner(stage, schedule, 3, loss_fn=lm_loss)
        runner.step(xs if pp == 0 else None, ys if pp == 1 else None)
        for p in part.parameters():
            torch.testing.assert_close(p.grad, ref_grads[names[id(p)]], rtol=RTOL, atol=ATOL,
                                       msg=lambda s: f"DDP {schedule} rank {rank} {names[id(p)]}: {s}")
            checked += 1
    # ZeRO-1 and ZeRO-2 per stage: gradients land in float32 master shards, so compare one SGD step
    # (lr=1: parameter - gradient) after the wrapper gathers the updated shards (float32 tolerance).
    ref_after = {n: p.detach() - ref_grads[n] for n, p in ref.named_parameters()}
    for zero_stage in (1, 2):
        for schedule in ("GPipe", "1F1B"):
            model = build()
            names = {id(p): n for n, p in model.named_parameters()}
            part = split(model.as_sequential(), 2)[pp]
            wrapped = ZeroDataParallel(part, stage=zero_stage, process_group=mesh.group("dp"))
            opt = torch.optim.SGD(wrapped.parameters(), lr=1.0)
            runner = PipelineRunner(PipelineStage(wrapped, pp, 2, group=mesh.group("pp")), schedule, 3,
                                    loss_fn=lm_loss, optimizer=opt)
            runner.step(xs if pp == 0 else None, ys if pp == 1 else None)
            wrapped.gather_params()
            for p in part.parameters():
                torch.testing.assert_close(p.detach().double(), ref_after[names[id(p)]], rtol=1e-5, atol=1e-6,
                                           msg=lambda s: f"ZeRO-{zero_stage} {schedule} rank {rank} {names[id(p)]}: {s}")
                checked += 1
    with pytest.raises(ValueError, match="DDP/ZeRO do not support"):
        PipelineRunner(stage, "ZBH1", 2, loss_fn=lm_loss)
    return checked


def test_pipeline_times_data_parallel_matches_unsplit_model():
    checked = run_ranks(4, mesh_cases)
    assert all(c > 0 for c in checked), checked
