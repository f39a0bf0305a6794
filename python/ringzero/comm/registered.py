"""Registered tensors: CPU tensors in memory that every rank of a group on this host has mapped, which the
shared-memory collectives read from the peers directly instead of staging a copy ([Note: registered
tensors], csrc/core/shm_window.cpp). The CPU counterpart of torch's SymmetricMemory for GPUs.

    x = ringzero.empty(1 << 20, dtype=torch.float32)   # every rank of the group, the same size and dtype
    x.copy_(grads); ringzero.all_reduce(x)              # in place, one pass over the peers' tensors
"""
from __future__ import annotations

import logging

import torch

from .. import _C
from .api import _comm
from .errors import CollectiveMismatch, CommError, CommTimeout
from .types import SUPPORTED_DTYPES

_log = logging.getLogger("ringzero")


def empty(*size, dtype: torch.dtype = torch.float32, group=None) -> torch.Tensor:
    """A new uninitialised CPU tensor of `size` (ints, or one tuple/list/torch.Size, as torch.empty takes)
    and `dtype`, registered with `group` (None: the default group). Collective: every rank of the group
    calls it, in the same order among the group's collectives, with the same size and dtype.

    all_reduce (in place), reduce_scatter_tensor and all_gather_into_tensor through any door (ringzero.*,
    a "ringzero" process group of the same ranks, ringzero.patch()) then take the tensor, or a contiguous
    part of it at the same offset on every rank, straight from the peers' memory when it holds 64 KiB or
    more: every rank of the host must pass its registered tensor, or none (else CollectiveMismatch names
    the ranks). Passing it to a collective of another group is a ValueError. Ranks alone on their host and
    ranks outside the group get a plain torch.empty. The memory is freed on this rank when the tensor and
    every view of it are gone; it cannot be resized."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    if not all(isinstance(s, int) and s >= 0 for s in size):
        raise TypeError(f"ringzero.empty: size must be non-negative ints, got {size!r}")
    if dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES)
        raise TypeError(f"ringzero.empty: dtype {dtype} is not one ringzero's collectives take; use one of {names}")
    comm = _comm(group, "empty")
    if comm is None or comm.shm is None:
        return torch.empty(size, dtype=dtype)
    numel = 1
    for s in size:
        numel *= s
    made = []
    shm = comm.shm
    comm.run(lambda: made.append(shm.create_window(numel * dtype.itemsize)), False, None, "create_window")
    return made[0].view(dtype).view(size)


def is_registered(tensor: torch.Tensor) -> bool:
    """Whether all of `tensor`'s elements lie in memory from ringzero.empty (of any group) that is still alive."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_cpu or not tensor.is_contiguous():
        return False
    return _C.window_id(tensor.data_ptr(), tensor.numel() * tensor.element_size()) != 0


def flat_zeros(numel: int, dtype: torch.dtype, device, group) -> torch.Tensor:
    """A zeroed 1D buffer of ringzero's own (DDP's gradient buckets, ZeRO's master shards) that `group`'s
    collectives read: from ringzero.empty where it is a CPU buffer and RINGZERO_REGISTER_BUFFERS allows it,
    else torch.zeros. Collective where it registers: every rank of the group calls it in the same order with
    the same numel and dtype. Where /dev/shm has no room, every rank's allocation fails together (the
    ranks exchange their verdicts), and every rank gets a plain buffer."""
    device = torch.device(device)
    comm = _comm(group, "empty") if device.type == "cpu" and dtype in SUPPORTED_DTYPES else None
    if comm is None or comm.shm is None or not comm.host_group.config.register_buffers:
        return torch.zeros(numel, dtype=dtype, device=device)
    try:
        return empty(numel, dtype=dtype, group=group).zero_()
    except (CommTimeout, CollectiveMismatch):
        raise
    except CommError as e:
        _log.debug("ringzero: a flat buffer of %d bytes is a plain tensor: %s", numel * dtype.itemsize, e)
        return torch.zeros(numel, dtype=dtype, device=device)


__all__ = ["empty", "flat_zeros", "is_registered"]
