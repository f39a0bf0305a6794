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
door], docs/design.md); its CUDA collectives go to a CudaHostsEngine, the CUDA transport ringzero.* runs
for that layout (IPC in the host, NCCL rings across hosts).
"""
from __future__ import annotations

import datetime
import weakref

import torch
import torch.distributed as dist

from .. import _C
from .communicator import host_segment
from .config import Config, from_env
from .cuda import cuda_transport, finish_setup, nccl_rings, open_ipc_peers
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
      all_to_all      [out, inp]       send counts, then receive counts (elements, one per rank each)
      gather          [out, inp]       [root]               out: root's world * inp.numel(), else empty
      scatter         [out, inp]       [root]               inp: root's world * out.numel(), else empty
      flush           []               []                   runs a tail left by the last all_reduce

    An all_reduce that the backend may let finish later gets a fourth argument, its _C.DeferredCall: the
    engine may return with the call's last segment (its tail) still to run, and the next call runs it
    ([Note: the engine's deferred tail], csrc/torch/backend_hosts.h).

    CUDA tensors of such a group are CudaHostsEngine's (below).
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
        self.transport.defers = True
        _ENGINES.append(weakref.ref(self))

    def __call__(self, op: str, tensors: list, args: list, call=None):
        t = self.transport
        try:
            if op == "flush":
                t.settle()
                return
            self.running.seq += 1
            if op != "all_reduce":  # a pipelined all-reduce runs it once its own first segment is on the link
                t.settle()
            run_engine_op(t, op, tensors, args, call)
        except BaseException as e:
            t.abandon(e)
            raise


def run_engine_op(t, op: str, tensors: list, args: list, call=None):
    """One call of the C++ backend to an engine (HostsEngine's table above) on transport `t`; `call`: an
    all_reduce's DeferredCall (CPU transports only)."""
    if op == "all_reduce":
        if call is None:
            t.all_reduce(tensors[0], ReduceOp(args[0]))
        else:
            t.all_reduce(tensors[0], ReduceOp(args[0]), call=call)
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
    elif op == "all_to_all":
        half = len(args) // 2
        t.all_to_all(tensors[0], tensors[1], list(args[:half]), list(args[half:]))
    elif op == "gather":  # the root's blocks (HostsComm::gather_blocks) or one buffer, then the input
        outs = tensors[:-1]  # the engine's transports across hosts take blocks (NetworkRing.TAKES_BLOCKS)
        t.gather(outs[0] if len(outs) == 1 else list(outs), tensors[-1], args[0])
    elif op == "scatter":  # the output, then the root's blocks (HostsComm::scatter_blocks) or one buffer
        ins = tensors[1:]
        t.scatter(tensors[0], ins[0] if len(ins) == 1 else list(ins), args[0])
    else:
        raise ValueError(f"ringzero backend engine: unknown op {op!r}")


class CudaHostsEngine:
    """The CUDA collectives of a swap-in group that spans hosts: the CUDA transport ringzero.* runs for the
    same layout (cuda.cuda_transport: IPC in the host and NCCL rings across hosts, or the flat NCCL ring).
    The C++ backend's CUDA lane calls it as HostsEngine is called (all_reduce, reduce_scatter and even
    all_gather only: broadcast and reduce reach it as all-reduces) on contiguous CUDA tensors, with the
    lane's stream current, so the transport's kernels and NCCL calls queue on it (csrc/torch/backend_cuda.h).
    Written and compiled; never run: one GPU cannot hold two NCCL ranks (docs/backend.md)."""

    def __init__(self, transport):
        self.transport = transport
        self.kind = type(transport).__name__  # "CudaHierarchical" or "CudaRing"
        _ENGINES.append(weakref.ref(self))

    def __call__(self, op: str, tensors: list, args: list):
        if op not in ("all_reduce", "reduce_scatter", "all_gather") or (op == "all_gather" and args):
            raise ValueError(f"ringzero backend CUDA engine: {op!r} is not routed here (a routing bug)")
        run_engine_op(self.transport, op, tensors, args)


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
    Communicator's CUDA path does, and returns a _C.CudaBackendPeers. A group spanning hosts also sets up
    the NCCL rings across hosts as that path does (cuda.nccl_rings) and gets a CudaHostsEngine over the
    transport of its layout (cuda.cuda_transport), unless two of its ranks share a GPU (NCCL refuses
    them: its CUDA ops then raise, naming the op)."""

    def __init__(self, store, rank: int, size: int, config: Config, timeout_s: float):
        self.store = dist.PrefixStore("cuda-lane/", store)  # keys apart from the C++ and inner backends'
        self.rank, self.size, self.config, self.timeout_s = rank, size, config, timeout_s

    def __call__(self, device_index: int) -> "_C.CudaBackendPeers":
        device = torch.device("cuda", device_index)
        hg = HostGroup.from_store(self.store, self.rank, self.size, self.config, self.timeout_s,
                                  "ringzero: setting up the CUDA path of the c10d backend (its first CUDA collective)")
        topo = hg.topology
        peer, error, errors, gpus = open_ipc_peers(hg.rendezvous, topo, device, self.config.peer_config(self.timeout_s))
        kind = layout(topo, self.size)
        spans_hosts, shares_gpu = kind in (HIERARCHICAL, RING), len(set(gpus)) < len(gpus)
        engine = None
        if spans_hosts and not shares_gpu and not errors:  # every rank takes part: the others wait for its ids
            flat, cross, nccl_error = nccl_rings(hg.rendezvous, topo, self.size, kind, device,
                                                 self.config.ring_slice_bytes)
            error = error or nccl_error
            if nccl_error is None:
                engine = CudaHostsEngine(cuda_transport(kind, None, peer, flat, cross, self.config.algo_code,
                                                        topo.local_world, self.size))
        finish_setup(hg.rendezvous, self.size, error, errors)
        return _C.CudaBackendPeers(peer, spans_hosts=spans_hosts, shares_gpu=shares_gpu,
                                   blocking_wait=self.config.cuda_blocking_wait, engine=engine, rank=self.rank,
                                   size=self.size)


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
