"""The pipeline's transports and its forward-only evaluation, against the unsplit model.

- choose_transport: the decision table (CPU -> gloo; CUDA with a GPU per rank and NCCL -> nccl; CUDA
  with ranks sharing a GPU, or without NCCL -> ipc), checked case by case.
- The ipc transport (memory mapped from the sender's process, header and acknowledgement over gloo)
  run on CPU tensors, which torch.multiprocessing shares through file descriptors the way it shares
  CUDA tensors through IPC handles: loss and gradients of a 1F1B and a GPipe step equal the unsplit
  model's (float64, tolerance as in test_pipeline_parity.py).
- runner.evaluate (the schedule's forward-only plan): the unsplit model's loss, no gradient touched,
  nothing kept, on both transports; forward_plan keeps every forward and transfer and validates.
"""
import pytest
import torch

from harness import run_ranks
from ringzero.parallel.pipeline import (PipelineRunner, PipelineStage, choose_transport, forward_plan, make_plan,
                                        simulate, split, validate)
from ringzero.parallel.pipeline.plan import Kind
from ringzero.parallel.pipeline.transport import pack_descriptor, unpack_descriptor
from pipeline_cases import ATOL, RTOL, build, data, lm_loss, reference


@pytest.mark.parametrize("device, shared, nccl, want", [
    ("cpu", False, True, "gloo"), ("cpu", True, False, "gloo"),
    ("cuda", False, True, "nccl"),   # a GPU per rank: NCCL send/recv
    ("cuda", True, True, "ipc"),     # ranks share a GPU: NCCL refuses, IPC mapping works
    ("cuda", False, False, "ipc"),   # torch without NCCL
])
def test_transport_choice(device, shared, nccl, want):
    assert choose_transport(device, shared, nccl) == want


def test_transport_choice_rejects_other_devices():
    with pytest.raises(ValueError, match="neither 'cpu' nor 'cuda'"):
        choose_transport("mps", False, False)


def test_forward_plan_keeps_forwards_and_their_transfers():
    for schedule, p, m in (("1F1B", 2, 4), ("GPipe", 3, 2), ("ZBH1", 2, 3), ("Interleaved1F1B", 2, 4)):
        plan = make_plan(schedule, p, m)
        fwd = forward_plan(plan)
        assert fwd.forward_only and not plan.forward_only
        for full, kept in zip(plan.actions, fwd.actions):
            assert kept == [a for a in full if a.kind in (Kind.F, Kind.SEND_F, Kind.RECV_F)]
        validate(fwd)
        simulate(fwd)


def test_descriptor_round_trip_within_one_process():
    t = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    torch.testing.assert_close(unpack_descriptor(pack_descriptor(t)), t, rtol=0, atol=0)


def transport_cases(rank, world):
    torch.multiprocessing.set_sharing_strategy("file_descriptor")
    ref_loss, ref_grads = reference(16)
    x, y = data(0, 16)
    first, last = rank == 0, rank == world - 1
    checked = 0
    for transport in ("gloo", "ipc"):
        for schedule in ("1F1B", "GPipe"):
            model = build()
            names = {id(p): n for n, p in model.named_parameters()}
            part = split(model.as_sequential(), world)[rank]
            runner = PipelineRunner(PipelineStage(part, rank, world), schedule, 4, loss_fn=lm_loss, transport=transport)
            # Evaluation first: the unsplit loss, and no gradient appears.
            loss = runner.evaluate(x if first else None, y if last else None)
            assert all(p.grad is None for p in part.parameters())
            assert runner.stages[rank].held_microbatches() == 0
            if last:
                torch.testing.assert_close(loss, ref_loss, rtol=RTOL, atol=ATOL)
            loss = runner.step(x if first else None, y if last else None)
            if last:
                torch.testing.assert_close(loss, ref_loss, rtol=RTOL, atol=ATOL)
            for p in part.parameters():
                torch.testing.assert_close(p.grad, ref_grads[names[id(p)]], rtol=RTOL, atol=ATOL,
                                           msg=lambda s: f"{transport} {schedule} {names[id(p)]}: {s}")
                checked += 1
    return checked


@pytest.mark.parametrize("world", [2, 3])
def test_ipc_and_gloo_transports_match_the_unsplit_model(world):
    assert all(c > 0 for c in run_ranks(world, transport_cases, timeout_s=300))
