"""Shared pieces of the CUDA tests (test_cuda.py, test_cuda_fuzz.py, test_cuda_timeout.py and the scripts
they run in fresh interpreters): the skip marker, small-integer inputs, the torch-on-CPU reference, an
exact comparison that names the first differing positions, and the launch of an N-process script."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import ringzero
from ringzero import _C

HAS_GPU = getattr(_C, "has_cuda", False) and torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU and a CUDA build of ringzero (benchmarks/gpu_check.sh)")


def make(rank, n, dtype, device="cuda", salt=0):
    """Small nonzero integers in [-3, 3] varying with rank and position."""
    i = torch.arange(n, dtype=torch.int64, device=device)
    v = (i * 5 + rank * 3 + salt) % 7 - 3
    return torch.where(v == 0, torch.ones_like(v), v).to(dtype)


def reference(xs, op, world):
    """op over the stacked inputs in float64/int64, rounded once to their dtype (Avg of floats divides in
    float32 first, as the kernels do after their float32 accumulation; integers truncate)."""
    wide = torch.float64 if xs[0].dtype.is_floating_point else torch.int64
    s = torch.stack([x.to(wide) for x in xs])
    if op in (ringzero.ReduceOp.SUM, ringzero.ReduceOp.AVG):
        r = s.sum(0)
        if op == ringzero.ReduceOp.AVG:
            r = r.float() / world if wide == torch.float64 else torch.div(r, world, rounding_mode="trunc")
    elif op == ringzero.ReduceOp.MIN:
        r = s.min(0).values
    elif op == ringzero.ReduceOp.MAX:
        r = s.max(0).values
    else:
        r = s.prod(0)
    return r.to(xs[0].dtype)


def check(got, want, tag, rounded=False, world=1):
    """got == want exactly (or within n 16-bit roundings when `rounded`), else an error naming `tag`."""
    if rounded:  # 16-bit products on the ring: one rounding per step
        eps = 2 ** -8 if got.dtype == torch.bfloat16 else 2 ** -11
        torch.testing.assert_close(got.double(), want.double(), rtol=world * eps, atol=0, msg=lambda m: f"{tag}: {m}")
    elif not torch.equal(got, want):
        bad = (got != want).nonzero()[:5].flatten().tolist()
        raise AssertionError(f"{tag}: first differing positions {bad}: got {got[bad].tolist()} want {want[bad].tolist()}")


def run_script(name: str, *args: str, env: dict | None = None, timeout_s: float = 600) -> str:
    """Runs tests/<name> in a fresh interpreter (the caller has initialised CUDA, so forked ranks could
    not); fails with its output unless it exits 0. Returns its stdout."""
    script = os.path.join(os.path.dirname(__file__), name)
    full = {**os.environ, **(env or {}),
            "PYTHONPATH": os.pathsep.join([os.path.dirname(ringzero.__path__[0]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, script, *args], env=full, capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    return proc.stdout
