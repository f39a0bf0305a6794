"""Activation recomputation (GPTConfig.recompute, `ringzero train --recompute`) changes memory, never
results: with 'selective' and 'full' the loss and every gradient are bitwise equal (torch.equal, no
tolerance) to those of the same model without recomputation, because the recomputation repeats the
same float32 CPU kernels on the same inputs and the model has no dropout.

Compared: one process (GPT forward and backward); 2 ranks under ringzero DDP, ZeRO-2 and ZeRO-3 (unit =
Block, whose gather/free hooks must fire once per forward), and under the pipeline runtime (2 stages,
1F1B, and ZB-H1 with 'selective'); and `ringzero train`'s loss curves for ddp, zero3 and pp. Also the
combinations refused before any rank starts. Memory: tests/trainer/test_train.py.
"""
import json

import pytest
import torch

from harness import run_ranks
from ringzero.cli import train
from ringzero.models import GPT, Block, GPTConfig, lm_loss
from train_cases import TINY

KINDS = ("none", "selective", "full")
SHAPE = dict(vocab_size=61, seq_len=12, n_layer=3, n_head=2, d_model=24)


def _data(seed=3, batch=4):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, SHAPE["vocab_size"], (batch, SHAPE["seq_len"] + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def _model(kind):
    torch.manual_seed(0)
    return GPT(GPTConfig(**SHAPE, recompute=kind))


def test_one_process_losses_and_gradients_are_bitwise_equal():
    x, y = _data()
    got = {}
    for kind in KINDS:
        model = _model(kind)
        loss = lm_loss(model(x), y)
        loss.backward()
        with torch.no_grad():  # evaluation path: nothing checkpointed, same logits
            logits = model(x)
        got[kind] = (loss.detach(), [p.grad for p in model.parameters()], logits)
    ref_loss, ref_grads, ref_logits = got["none"]
    for kind in ("selective", "full"):
        loss, grads, logits = got[kind]
        assert torch.equal(loss, ref_loss), kind
        assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads)), kind
        assert torch.equal(logits, ref_logits), kind


def _wrapped_grads(rank, world, case, kind):
    """(loss, gradients this rank holds) of two forward/backward passes of `case` with `kind`."""
    from ringzero.parallel import DistributedDataParallel, ZeroDataParallel
    from ringzero.parallel.pipeline import PipelineRunner, PipelineStage, split

    x, y = _data(batch=4 * world)
    model = _model(kind)
    out = []
    for _ in range(2):  # a second pass: the ZeRO-3 unit order and the DDP buckets start again cleanly
        if case.startswith("pp"):
            if _ == 0:
                part = split(model.as_sequential(), world, by="params")[rank]
                runner = PipelineRunner(PipelineStage(part, rank, world), case.split("-")[1], 2, loss_fn=lm_loss)
                params = list(part.parameters())
            loss = runner.step(x if rank == 0 else None, y if rank == world - 1 else None)
            loss = loss if rank == world - 1 else torch.zeros(())
        else:
            if _ == 0:
                stage = {"ddp": 0, "zero2": 2, "zero3": 3}[case]
                wrapped = (DistributedDataParallel(model) if stage == 0 else
                           ZeroDataParallel(model, stage=stage, unit=Block if stage == 3 else None))
                params = list(wrapped.parameters())
            per = x.shape[0] // world
            mine = slice(rank * per, (rank + 1) * per)
            loss = lm_loss(wrapped(x[mine]), y[mine])
            loss.backward()
        out.append((loss.detach().clone(), [p.grad.clone() for p in params]))
        for p in params:
            p.grad = None
    return out


def _compare_all(rank, world, cases):
    mismatches = []
    for case, kinds in cases:
        ref = _wrapped_grads(rank, world, case, "none")
        for kind in kinds:
            got = _wrapped_grads(rank, world, case, kind)
            for i, ((loss, grads), (ref_loss, ref_grads)) in enumerate(zip(got, ref)):
                if not torch.equal(loss, ref_loss):
                    mismatches.append(f"{case} {kind} pass {i}: loss {loss} vs {ref_loss}")
                bad = [j for j, (a, b) in enumerate(zip(grads, ref_grads)) if not torch.equal(a, b)]
                if bad:
                    mismatches.append(f"{case} {kind} pass {i}: gradients {bad} differ")
    return mismatches


def test_distributed_losses_and_gradients_are_bitwise_equal():
    cases = [("ddp", ("selective", "full")), ("zero2", ("selective", "full")), ("zero3", ("selective", "full")),
             ("pp-1F1B", ("selective", "full")), ("pp-ZBH1", ("selective",))]
    for rank, mismatches in enumerate(run_ranks(2, _compare_all, cases, timeout_s=300)):
        assert not mismatches, (rank, mismatches)


def test_train_loss_curves_are_equal(tmp_path):
    """`ringzero train` passes --recompute to the model on every rank: the same losses step for step."""
    curves = {}
    for kind in KINDS:
        out = tmp_path / kind
        assert train.main([*TINY, "--compare", "ddp,zero3,pp", "--steps", "4", "--val-every", "4",
                           "--microbatches", "2", "--recompute", kind, "--out", str(out)]) == 0
        with open(out / "results.json") as f:
            for r in json.load(f):
                assert r["recompute"] == kind
                curves[kind, r["strategy"]] = r["train_losses"] + r["val_losses"]
    for (kind, strategy), curve in curves.items():
        assert curve == curves["none", strategy], (kind, strategy)


@pytest.mark.parametrize("argv, message", [
    (["--recompute", "partial"], "--recompute 'partial' is not a recompute kind; use one of none, selective, full"),
    (["--strategy", "pp", "--schedule", "ZBH1", "--recompute", "full", "--microbatches", "2"],
     "--schedule ZBH1 splits the backward, which --recompute full cannot follow"),
])
def test_impossible_recompute_is_refused_before_starting(argv, message, capsys):
    with pytest.raises(SystemExit):
        train.main([*TINY, *argv])
    assert message in capsys.readouterr().err
