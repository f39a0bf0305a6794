"""Fault injection for the restart test: RINGZERO_FAULT=kill:rank=R:step=S kills rank R with SIGKILL
when it reaches step S, on the first attempt only (torchrun counts restarts in TORCHELASTIC_RESTART_COUNT)."""
from __future__ import annotations

import os
import signal

import torch.distributed as dist


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
