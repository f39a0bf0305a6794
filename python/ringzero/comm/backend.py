"""ringzero as a torch.distributed backend: importing ringzero registers "ringzero", so that

    dist.init_process_group("ringzero")                  # CPU and CUDA tensors
    dist.init_process_group("cpu:ringzero,cuda:nccl")    # ours for CPU, NCCL for CUDA
    dist.new_group(ranks, backend="ringzero")

run existing PyTorch code (DDP, FSDP2, plain collectives) on ringzero's collectives. The backend
itself is C++ (csrc/torch/backend.h); this module builds it with the inner backends it hands the
rest to (gloo for CPU tensors, NCCL for CUDA tensors when torch has it and a GPU is visible) and,
in a CUDA build, with CudaSetup: the CUDA peer communicator made at the group's first CUDA collective
([Note: CUDA tensors in the backend], csrc/torch/backend_cuda.h).

A group that spans hosts gets a HostsEngine: the same transport ringzero.* runs for that layout
(transports.pick_transport: shared memory in each host and the pipelined rings between hosts, or the
flat ring), over a gloo backend of its own for the bytes between hosts. The C++ backend hands it the
CPU collectives it would run on shared memory for a group on one host ([Note: one engine behind every
door], docs/design.md).
"""
from __future__ import annotations

import datetime
import weakref

import torch
import torch.distributed as dist

from .. import _C
from .communicator import host_segment
from .config import Config, from_env
from .cuda import finish_setup, open_ipc_peers
from .host_group import HostGroup
from .ring import BackendLink, P2PRing
from .topology import host_id
from .transports import HIERARCHICAL, RING, RunningCall, layout, pick_transport
from .types import ReduceOp

BACKEND_NAME = "ringzero"


def backend_config(config: Config, timeout: datetime.timedelta, spans_hosts: bool = False,
                   host_cpus: int = 0) -> "_C.BackendConfig":
    """What the C++ backend takes from the validated configuration: the host identity, RINGZERO_TIMEOUT_S
    when set (else the timeout given to init_process_group / new_group), the shared-memory slot, the
    all-reduce algorithm, single copy, whether the group spans hosts (decided here, from the HostGroup's topology:
    the C++ side never decides it) and the cpus the host's ranks run on together (HostGroup.local_cpus: whether
    a rank blocked on its result may spin)."""
    return _C.BackendConfig(host_id=host_id(config.host_id), timeout_s=config.timeout_or(timeout.total_seconds()),
                            slot_bytes=config.shm_buffer_bytes, all_reduce_algo=config.algo_code,
                            spans_hosts=spans_hosts, single_copy=config.single_copy, host_cpus=host_cpus)


_ENGINES: list = []  # weak references to this process's engines (hosts_engines())


def hosts_engines() -> list["HostsEngine"]:
    """The engines of this process's swap-in groups that span hosts and are still alive, oldest first
    (tests read their .kind, the transport pick_transport chose)."""
    _ENGINES[:] = [r for r in _ENGINES if r() is not None]
    return [r() for r in _ENGINES]


class HostsEngine:
    """The CPU collectives of a swap-in group that spans hosts: the transport ringzero.* runs for the same
    layout (transports.pick_transport), over `link_backend` (a ProcessGroupGloo of the engine's own, so that
    its messages never meet the user's send/recv or gloo's collectives). The C++ backend calls it on its
    worker thread, in call order, with the GIL taken: engine(op, tensors, args) where tensors are
    contiguous CPU tensors the backend staged and args the op's integers (csrc/torch/backend_hosts.h):

      all_reduce      [x]              [reduce op]          in place
      reduce_scatter  [out, inp]       [reduce op]          out gets this rank's block
      all_gather      [out, inp]       [] or every count    out gets every rank's inp, in rank order
      broadcast       [x]              [root]
      reduce          [x]              [root, reduce op]    the result lands on root
      barrier         []               []

    CUDA tensors of such a group are not the engine's: the backend hands them to NCCL.
    """

    def __init__(self, hg: HostGroup, config: Config, link_backend, timeout_s: float):
        topo = hg.topology
        self.link_backend = link_backend
        self.running = RunningCall()
        self.shm = host_segment(hg, config.shm_buffer_bytes, timeout_s) if topo.local_world > 1 else None
        if self.shm is not None:
            self.shm.set_spin(False)  # the engine waits while the training thread computes (as the C++ path)
        link = BackendLink(link_backend)
        make_ring = lambda members, pos: P2PRing(None, members, pos, timeout_s, config.ring_slice_bytes, link)  # noqa: E731
        self.transport, _, _ = pick_transport(topo, hg.rank, hg.world, self.shm, config.algo_code, make_ring,
                                              self.running, config.debug)
        self.kind = type(self.transport).__name__  # "Hierarchical" or "NetworkRing"
        _ENGINES.append(weakref.ref(self))

    def __call__(self, op: str, tensors: list, args: list):
        self.running.seq += 1
        t = self.transport
        if op == "all_reduce":
            t.all_reduce(tensors[0], ReduceOp(args[0]))
        elif op == "reduce_scatter":
            t.reduce_scatter(tensors[0], tensors[1], ReduceOp(args[0]))
        elif op == "all_gather":
            t.all_gather(tensors[0], tensors[1], list(args) if args else None)
        elif op == "broadcast":
            t.broadcast(tensors[0], args[0])
        elif op == "reduce":
            t.reduce(tensors[0], args[0], ReduceOp(args[1]))
        elif op == "barrier":
            t.barrier()
        else:
            raise ValueError(f"ringzero backend engine: unknown op {op!r}")


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
        spans_hosts = layout(hg.topology, self.size) in (HIERARCHICAL, RING)
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
    timeout_s = backend_config(env, timeout).timeout_s  # validated before anything is exchanged
    # The host exchange: which ranks share a host (the one decision of the layout, handed to C++ as
    # spans_hosts), and the ranks placed on cpus ([Note: binding at setup], comm/affinity.py). The C++
    # backend of a group on one host meets its ranks on its own, for the shared-memory segment.
    hg = HostGroup.from_store(dist.PrefixStore("placement/", store), rank, size, env, timeout_s,
                              "ringzero: setting up the backend (init_process_group / new_group)")
    spans_hosts = layout(hg.topology, size) in (HIERARCHICAL, RING)
    config = backend_config(env, timeout, spans_hosts, hg.local_cpus)
    gloo = ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout)
    engine = None
    if spans_hosts:  # its own gloo: the engine's tags and ordering never meet the inner backend's ops
        engine = HostsEngine(hg, env, ProcessGroupGloo(dist.PrefixStore("engine-gloo/", store), rank, size, timeout),
                             timeout_s)
    cuda = _inner_cuda_backend(store, rank, size, timeout)
    setup = None
    if getattr(_C, "has_cuda", False) and torch.cuda.is_available():
        setup = CudaSetup(store, rank, size, env, config.timeout_s)
    return _C.RingzeroBackend(store, rank, size, config, gloo, cuda, setup, engine)


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
