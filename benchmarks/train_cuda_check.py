"""`ringzero train` on CUDA against the CPU run of the same seed, and `--resume` on CUDA.

    PYTHONPATH=python python benchmarks/train_cuda_check.py --nproc 2 --steps 20     # needs a GPU

1. Numerics: for each strategy, the per-step training losses of three runs with the same seed and
   batches: CPU float32 (the reference), CUDA float32 (--precision fp32) and CUDA bf16 autocast (the
   default on CUDA). Tolerances, in nats/byte, on the largest per-step difference from the CPU run:
   TOL_FP32 (float32 on both: only summation order differs, and it compounds over the steps) and
   TOL_BF16 (bf16 rounds activations to 8 bits of mantissa). These are the bounds we expect, not yet
   measured on a GPU: a first GPU run that breaks them is a finding to report, not a tolerance to widen.
2. Resume: zero2 on CUDA for --steps steps, against the same run stopped after a checkpoint and resumed
   with --resume: the resumed steps' losses equal the uninterrupted run's within TOL_RESUME (relative;
   CUDA's atomic-add backward kernels are not bitwise reproducible between runs).
With fewer GPUs than ranks the ranks share a GPU (CUDA IPC); this is how the check is meant to run on
one GPU. Prints one line per comparison and exits 1 if any is out of tolerance.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

TOL_FP32 = 2e-3
TOL_BF16 = 5e-2
TOL_RESUME = 1e-4
STRATEGIES = "ddp,zero1,zero2,zero3,pp,pp+zero1,pp+zero2"
MODEL = ["--batch", "8", "--seq", "64", "--layers", "2", "--d-model", "128", "--heads", "4", "--microbatches", "2",
         "--val-batches", "1", "--no-progress"]


def _run(tmp: str, name: str, argv: list[str]) -> dict:
    from ringzero.cli import train

    out = os.path.join(tmp, name)
    assert train.main([*MODEL, *argv, "--out", out]) == 0
    with open(os.path.join(out, "results.json")) as f:
        return {r["strategy"]: r for r in json.load(f)}


def _losses(r: dict) -> dict[int, float]:
    return {step: loss for step, loss in r["train_losses"]}


def numerics(nproc: int, steps: int, strategies: str = STRATEGIES) -> list[tuple[str, str, float, float]]:
    """(strategy, precision, largest |CUDA - CPU| per-step loss difference, tolerance) per run."""
    common = ["--compare", strategies, "--nproc", str(nproc), "--steps", str(steps), "--val-every", "0"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cpu = _run(tmp, "cpu", [*common, "--device", "cpu"])
        for precision, tol in (("fp32", TOL_FP32), ("bf16", TOL_BF16)):
            cuda = _run(tmp, precision, [*common, "--device", "cuda", "--precision", precision])
            for s in strategies.split(","):
                want, got = _losses(cpu[s]), _losses(cuda[s])
                assert want.keys() == got.keys(), (s, precision)
                rows.append((s, precision, max(abs(got[k] - want[k]) for k in want), tol))
    return rows


def resume(nproc: int, steps: int) -> float:
    """Largest relative difference between a resumed CUDA run's losses and the uninterrupted run's."""
    common = ["--strategy", "zero2", "--nproc", str(nproc), "--device", "cuda", "--val-every", "0"]
    stop = max(2, steps // 2)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "ckpt")
        full = _losses(_run(tmp, "full", [*common, "--steps", str(steps)])["zero2"])
        _run(tmp, "first", [*common, "--steps", str(stop), "--checkpoint-dir", ckpt, "--save-every", str(stop)])
        resumed = _run(tmp, "resumed", [*common, "--steps", str(steps), "--checkpoint-dir", ckpt, "--resume"])["zero2"]
        assert resumed["start_step"] == stop, resumed["start_step"]
        return max(abs(v - full[k]) / abs(full[k]) for k, v in _losses(resumed).items())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--strategies", default=STRATEGIES)
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("train_cuda_check: no CUDA device; nothing checked")
        return 1
    ok = True
    for s, precision, diff, tol in numerics(args.nproc, args.steps, args.strategies):
        ok &= diff <= tol
        print(f"{s:<9} {precision}: max |cuda - cpu| per-step loss {diff:.2e} (tolerance {tol:.0e}) "
              f"{'ok' if diff <= tol else 'OUT OF TOLERANCE'}")
    diff = resume(args.nproc, min(args.steps, 10))
    ok &= diff <= TOL_RESUME
    print(f"zero2 resume on cuda: max relative loss difference {diff:.2e} (tolerance {TOL_RESUME:.0e}) "
          f"{'ok' if diff <= TOL_RESUME else 'OUT OF TOLERANCE'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
