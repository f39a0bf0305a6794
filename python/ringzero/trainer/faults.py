"""Test hooks of `ringzero train`, read from the environment at every step.

RINGZERO_FAULT=kill:rank=R:step=S kills rank R with SIGKILL when it reaches step S, on the first attempt only
(torchrun counts restarts in TORCHELASTIC_RESTART_COUNT): the restart test.

RINGZERO_STEP_GATE=steps=A,B,...:dir=D stops every rank at the start of each listed step (before its batch and
any collective of it): the rank creates D/at-S-rank-R and waits until D/go-S exists. A test that counts what
the job sends between two steps (the lab's byte counters) reads them while every rank waits, in one run
instead of the difference between two runs of different lengths. The wait is bounded by RINGZERO_TIMEOUT_S
(its default when unset); past it the rank raises TimeoutError naming the missing file."""
from __future__ import annotations

import os
import signal
import time

import torch.distributed as dist

from ..comm.config import from_env


def maybe_fault(step: int) -> None:
    """Applies RINGZERO_FAULT at `step` (see the module docstring); ValueError for a malformed spec."""
    spec = os.environ.get("RINGZERO_FAULT")
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    try:
        kind, *fields = spec.split(":")
        kv = dict(f.split("=", 1) for f in fields)
        rank, at = int(kv["rank"]), int(kv["step"])
    except (ValueError, KeyError):
        raise ValueError(f"RINGZERO_FAULT={spec!r}: expected kill:rank=R:step=S") from None
    if kind != "kill":
        raise ValueError(f"RINGZERO_FAULT={spec!r}: the only fault is 'kill'")
    if dist.get_rank() == rank and step == at:
        os.kill(os.getpid(), signal.SIGKILL)


def step_gate(step: int) -> None:
    """Applies RINGZERO_STEP_GATE at `step` (see the module docstring); ValueError for a malformed spec."""
    spec = os.environ.get("RINGZERO_STEP_GATE")
    if not spec:
        return
    try:
        kv = dict(f.split("=", 1) for f in spec.split(":"))
        steps, where = {int(s) for s in kv["steps"].split(",")}, kv["dir"]
    except (ValueError, KeyError):
        raise ValueError(f"RINGZERO_STEP_GATE={spec!r}: expected steps=A,B,...:dir=DIRECTORY") from None
    if step not in steps:
        return
    with open(os.path.join(where, f"at-{step}-rank-{dist.get_rank()}"), "w"):
        pass
    go = os.path.join(where, f"go-{step}")
    limit = from_env().timeout_or(0)
    deadline = time.monotonic() + limit
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            raise TimeoutError(f"RINGZERO_STEP_GATE: rank {dist.get_rank()} waited {limit:.0f} s at step {step} "
                               f"for {go}, which nothing created (the test that set the gate did not open it)")
        time.sleep(0.01)
