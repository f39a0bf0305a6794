"""ringzero as a torch.distributed backend: importing ringzero registers "ringzero", so that

    dist.init_process_group("ringzero")                  # CPU and CUDA tensors
    dist.init_process_group("cpu:ringzero,cuda:nccl")    # ours for CPU, NCCL for CUDA
    dist.new_group(ranks, backend="ringzero")

run existing PyTorch code (DDP, FSDP2, plain collectives) on ringzero's collectives. The backend
itself is C++ (csrc/torch/backend.h); this module builds it with the inner backends it hands the
rest to: gloo for CPU tensors, NCCL for CUDA tensors when torch has it and a GPU is visible.
"""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from .. import _C
from .config import Config, from_env
from .topology import host_id

BACKEND_NAME = "ringzero"


def backend_config(config: Config, timeout: datetime.timedelta) -> "_C.BackendConfig":
    """What the C++ backend takes from the validated configuration: the host identity, RINGZERO_TIMEOUT_S
    when set (else the timeout given to init_process_group / new_group), the shared-memory slot and the
    all-reduce algorithm."""
    return _C.BackendConfig(host_id=host_id(config.host_id), timeout_s=config.timeout_or(timeout.total_seconds()),
                            slot_bytes=config.shm_buffer_bytes, all_reduce_algo=config.algo_code)


def _inner_cuda_backend(store, rank: int, size: int, timeout):
    """NCCL for CUDA tensors, or None where torch has no NCCL or no GPU is visible."""
    if not (torch.cuda.is_available() and dist.is_nccl_available()):
        return None
    from torch.distributed import ProcessGroupNCCL  # only present in CUDA builds of torch

    opts = ProcessGroupNCCL.Options()
    opts._timeout = timeout
    return ProcessGroupNCCL(dist.PrefixStore("nccl/", store), rank, size, opts)


def _create_backend(dist_opts, backend_options=None):
    """The creator torch calls once per group (extended API: `dist_opts` carries the group's
    prefixed store, rank, size and timeout). Every rank of the group calls it."""
    from torch.distributed import ProcessGroupGloo

    store, rank, size, timeout = dist_opts.store, dist_opts.group_rank, dist_opts.group_size, dist_opts.timeout
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    config = backend_config(from_env(), timeout)  # validated before any inner backend is built
    gloo = ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout)
    cuda = _inner_cuda_backend(store, rank, size, timeout)
    return _C.RingzeroBackend(store, rank, size, config, gloo, cuda)


def register() -> None:
    """Registers "ringzero" with torch.distributed (done on import; calling again does nothing)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=["cpu", "cuda"])


def backend_stats(group=None, device: str = "cpu") -> dict:
    """Which ops the ringzero backend of `group` (default: the default group) ran on its own kernels
    and which it handed to the inner backend: {"native": {op: calls}, "fallback": {op: calls}}.
    Raises ValueError when the group's backend for `device` is not ringzero."""
    pg = dist.group.WORLD if group is None else group
    backend = pg._get_backend(torch.device(device))
    if not isinstance(backend, _C.RingzeroBackend):
        raise ValueError(f"the {device} backend of this group is {type(backend).__name__}, not ringzero; create "
                         "the group with backend='ringzero'")
    return backend.stats()


__all__ = ["BACKEND_NAME", "register", "backend_stats"]
