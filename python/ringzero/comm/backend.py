"""ringzero as a torch.distributed backend: importing ringzero registers "ringzero", so that

    dist.init_process_group("ringzero")                  # CPU and CUDA tensors
    dist.init_process_group("cpu:ringzero,cuda:nccl")    # ours for CPU, NCCL for CUDA
    dist.new_group(ranks, backend="ringzero")

run existing PyTorch code (DDP, FSDP2, plain collectives) on ringzero's collectives. The backend
itself is C++ (csrc/torch/backend.h); this module builds it with the inner backends it hands the
rest to (gloo for CPU tensors, NCCL for CUDA tensors when torch has it and a GPU is visible) and,
in a CUDA build, with CudaSetup: the CUDA peer communicator made at the group's first CUDA collective
([Note: CUDA tensors in the backend], csrc/torch/backend_cuda.h).
"""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from .. import _C
from .config import Config, from_env
from .cuda import finish_setup, open_ipc_peers
from .host_group import HostGroup
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


class CudaSetup:
    """Handed to the C++ backend, which calls it once, at the group's first CUDA collective, with that
    tensor's device index (every rank of the group at the same op, as for any collective). It meets
    the other ranks through the group's store (HostGroup: which ranks share a host; a rank that never
    arrives gives CommTimeout naming it), opens the CUDA IPC peers on that device exactly as the
    Communicator's CUDA path does, and returns a _C.CudaBackendPeers. A group spanning hosts gets no
    peer communicator: its CUDA ops go to NCCL (the NCCL ring driver is not wired into the backend)."""

    def __init__(self, store, rank: int, size: int, config: Config, timeout_s: float):
        self.store = dist.PrefixStore("cuda-lane/", store)  # keys apart from the C++ and inner backends'
        self.rank, self.size, self.config, self.timeout_s = rank, size, config, timeout_s

    def __call__(self, device_index: int) -> "_C.CudaBackendPeers":
        device = torch.device("cuda", device_index)
        hg = HostGroup.from_store(self.store, self.rank, self.size, self.config, self.timeout_s,
                                  "ringzero: setting up the CUDA path of the c10d backend (its first CUDA collective)")
        peer, error, errors, gpus = open_ipc_peers(hg.rendezvous, hg.topology, device,
                                                   self.config.peer_config(self.timeout_s))
        finish_setup(hg.rendezvous, self.size, error, errors)
        spans_hosts = not hg.topology.single_host
        return _C.CudaBackendPeers(None if spans_hosts else peer, spans_hosts=spans_hosts,
                                   shares_gpu=len(set(gpus)) < len(gpus), blocking_wait=self.config.cuda_blocking_wait)


def _create_backend(dist_opts, backend_options=None):
    """The creator torch calls once per group (extended API: `dist_opts` carries the group's
    prefixed store, rank, size and timeout). Every rank of the group calls it."""
    from torch.distributed import ProcessGroupGloo

    store, rank, size, timeout = dist_opts.store, dist_opts.group_rank, dist_opts.group_size, dist_opts.timeout
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    env = from_env()
    config = backend_config(env, timeout)  # validated before any inner backend is built
    # The host exchange that places the ranks on cpus ([Note: binding at setup], comm/affinity.py); the
    # C++ backend meets its host's ranks on its own, for the shared-memory segment.
    HostGroup.from_store(dist.PrefixStore("placement/", store), rank, size, env, config.timeout_s,
                         "ringzero: placing the ranks on cpus (init_process_group)")
    gloo = ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout)
    cuda = _inner_cuda_backend(store, rank, size, timeout)
    setup = None
    if getattr(_C, "has_cuda", False) and torch.cuda.is_available():
        setup = CudaSetup(store, rank, size, env, config.timeout_s)
    return _C.RingzeroBackend(store, rank, size, config, gloo, cuda, setup)


def register() -> None:
    """Registers "ringzero" with torch.distributed (done on import; calling again does nothing)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=["cpu", "cuda"])


def backend_stats(group=None, device: str = "cpu") -> dict:
    """Which ops on tensors of `device` ("cpu" or "cuda") the ringzero backend of `group` (default: the
    default group) ran on its own kernels and which it handed to the inner backend:
    {"native": {op: calls}, "fallback": {op: calls}} (barrier counts under "cpu": it is a host barrier).
    Raises ValueError when the group's backend for `device` is not ringzero."""
    pg = dist.group.WORLD if group is None else group
    backend = pg._get_backend(torch.device(device))
    if not isinstance(backend, _C.RingzeroBackend):
        raise ValueError(f"the {device} backend of this group is {type(backend).__name__}, not ringzero; create "
                         "the group with backend='ringzero'")
    return backend.stats(device)


__all__ = ["BACKEND_NAME", "register", "backend_stats"]
