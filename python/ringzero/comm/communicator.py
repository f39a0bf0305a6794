"""The Communicator: one per ProcessGroup, made lazily on the first collective.

It takes the group's HostGroup (comm/host_group.py: the validated configuration, which ranks share a
host, the store rendezvous), sets up the shared-memory segment for the ranks of this host, and picks
the group's transport once, from its topology (comm/transports.py):
  - one rank: Solo;
  - one host: SharedMemory, the shared-memory collectives (csrc/core/shm_collectives.cpp);
  - several hosts with the same number of ranks each: Hierarchical (shared-memory reduce-scatter, one
    ring per local rank across hosts, shared-memory all-gather); its other collectives take the flat ring;
  - otherwise: NetworkRing, the flat ring over torch.distributed point-to-point (comm/ring.py).
CUDA tensors take the CUDA transport (comm/cuda.py), made at the group's first CUDA collective.
Calls run inline, or on one worker thread per communicator when async_op=True, in call order.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import threading

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d

from .. import _C
from .cuda import CudaPath
from .errors import CollectiveMismatch, CommTimeout
from .flight import FlightRecorder
from .host_group import HostGroup
from .ring import P2PRing
from .transports import HIERARCHICAL, ONE_HOST, SOLO, RunningCall, SharedMemory, layout, pick_transport
from .types import ReduceOp
from .work import Work


_TWO_ARGS = object()  # run_direct's `c` when the native entry takes two arguments (all_gather)


def host_segment(hg: HostGroup, slot_bytes: int, timeout_s: float):
    """This host's shared-memory communicator for the group of `hg` (its local ranks), made by the host's
    first rank and opened by the others (HostGroup.share_segment), placed on the host's cpus."""
    topo = hg.topology
    shm = hg.share_segment(
        "shm",
        create=lambda: _C.ShmComm("", 0, topo.local_world, slot_bytes, timeout_s, topo.local_ranks),
        open_=lambda name: _C.ShmComm(name, topo.local_rank, topo.local_world, slot_bytes, timeout_s,
                                      topo.local_ranks))
    shm.set_host_cpus(hg.local_cpus)
    shm.set_single_copy(hg.config.single_copy)
    return shm


class Communicator:
    """Transport state for one ProcessGroup. Use get_communicator(group) rather than building one."""

    def __init__(self, group, generation: int = 0, first_op: str = "collective"):
        self.host_group = hg = HostGroup(group, generation, first_op)
        cfg, topo = hg.config, hg.topology
        self.group = group
        self.rank, self.world, self.global_ranks = hg.rank, hg.world, hg.global_ranks
        self.timeout_s = hg.timeout_s
        self.slot_bytes = cfg.shm_buffer_bytes
        self.ring_slice_bytes = cfg.ring_slice_bytes
        self.algo = cfg.algo_code
        # Fingerprint checks are always on for shared memory (free there); on the network paths they cost
        # one small all-gather per call, so they run only with RINGZERO_DEBUG=1.
        self.debug = cfg.debug
        self.seq = 0  # calls submitted
        self.busy_s = 0.0  # seconds inside calls that took run() (overlapped async time included); see seconds()
        self._shm_in_run_s = 0.0  # of which on self.shm (its own clock, shm.busy_s, counts those too)
        self._running = RunningCall()
        self.flight = FlightRecorder(dist.get_rank(), f"group of {self.world} ranks {self.global_ranks[:8]}",
                                     cfg.flight_dir)
        self._lock = threading.Lock()
        self._pending = 0
        self._executor = None
        self._cuda = None  # CudaPath, made on the first CUDA collective (comm/cuda.py)

        self.hosts = topo.hosts
        self.local_ranks, self.local_rank, self.local_world = topo.local_ranks, topo.local_rank, topo.local_world
        self.layout = layout(topo, self.world)  # transports.layout: the one decision, read by every door
        self.single_host, self.hierarchical = self.layout in (SOLO, ONE_HOST), self.layout == HIERARCHICAL
        self.shm = self._setup_shm() if self.local_world > 1 else None
        if self.shm is not None:  # the bound method, not a lambda over self: no cycle keeps the group alive
            self.flight.sources["shared-memory collectives (their own record, the api's fast path included)"] = \
                self.shm.history
        self.flat_ring = self.cross_ring = None  # the rings, also reached by tests and benchmarks/hostlab_bench.py
        self.transport = self._pick_transport(topo)
        self._bind_direct()

    def _setup_shm(self):
        return host_segment(self.host_group, self.slot_bytes, self.timeout_s)

    def _pick_transport(self, topo):
        """The CPU transport of this group: transports.pick_transport, the one decision for every door."""
        make_ring = lambda members, pos: P2PRing(  # noqa: E731
            self.group, [self.global_ranks[r] for r in members], pos, self.timeout_s, self.ring_slice_bytes)
        transport, self.flat_ring, self.cross_ring = pick_transport(topo, self.rank, self.world, self.shm, self.algo,
                                                                    make_ring, self._running, self.debug)
        return transport

    # [Note: the api's fast path] A blocking all_reduce, reduce_scatter_single or all_gather_single on a
    # group whose every rank shares this host's memory goes straight to the native entry (_C.shm_direct,
    # csrc/torch/shm_direct.cpp) through run_direct, on the calling thread, with no Python checks and no
    # flight-recorder entry: at 4 KiB the call itself is most of the cost (each Python call more on this
    # path costs 0.03-0.15 us of a 1.4 us call: benchmarks/RESULTS.md, issue 37; so the api calls
    # run_direct first and nothing else, and run_direct inlines serves()). The entry checks the tensors itself and returns False, having done
    # nothing, for any it does not take: the api's slow path then handles or explains them. ShmComm
    # times those calls (busy_s) and logs them in its own history, which the flight recorder dumps.
    def _bind_direct(self):
        self.shm_direct = type(self.transport) is SharedMemory  # every collective of this group runs on self.shm
        self.shm_all_reduce_ = self.shm_reduce_scatter = self.shm_all_gather = self.shm_all_to_all = None
        if self.shm_direct:  # bound once: the api passes them to run_direct without a lookup
            direct = _C.shm_direct(self.shm)
            self.shm_all_reduce_, self.shm_reduce_scatter = direct.all_reduce_, direct.reduce_scatter
            self.shm_all_gather, self.shm_all_to_all = direct.all_gather, direct.all_to_all

    def run_direct(self, group, native, a, b, c=_TWO_ARGS) -> bool:
        """The api's fast path, written once ([Note: the api's fast path]): runs native(a, b[, c]), one of
        shm_all_reduce_ (tensor, op, algo), shm_reduce_scatter (input, output, op) and shm_all_gather
        (input, output), on the calling thread, if this communicator runs on shared memory only, has
        nothing pending (else run() must order the call) and is still the one of `group` (the argument
        as the caller passed it). Every rank of the group calls it, as any blocking collective. Returns
        True when the collective ran (counted in seq), False when the caller must take its slow path.
        A timeout or a mismatch is re-raised naming the flight recorder's dump. Fixed arguments rather
        than *args: the packed call cost 0.02-0.03 us more per 4 KiB call (benchmarks/RESULTS.md)."""
        if not self.shm_direct or self._pending:  # _pending read under the GIL; only the calling thread submits
            return False
        if not (self.group is _c10d._world.default_pg if group is None else self.group is group and
                dist.is_initialized()):  # serves(group)
            return False
        try:
            if not (native(a, b) if c is _TWO_ARGS else native(a, b, c)):
                return False
        except Exception as e:
            self.direct_failed(e, native.__name__.rstrip("_"))  # the op's name: all_reduce_ -> all_reduce
        self.seq += 1
        return True

    def serves(self, group) -> bool:
        """Whether this communicator (found by id(group) in FAST) is still the one of `group` (None: the
        default group)."""
        if group is None:
            return self.group is _c10d._world.default_pg
        return self.group is group and dist.is_initialized()

    def direct_failed(self, e: BaseException, op: str) -> None:
        """Counts the failed call, then re-raises: a timeout or a mismatch naming the flight recorder's
        dump, anything else as it is."""
        self.seq += 1
        if isinstance(e, (CommTimeout, CollectiveMismatch)):
            path = self.flight.dump(f"{op} #{self.seq}: {type(e).__name__}")
            raise type(e)(f"{e}\nflight recorder of this rank: {path}") from e
        raise e

    # ---- execution ---------------------------------------------------------------------------------
    def cuda_path(self, t: torch.Tensor, op: str):
        """The CUDA transports (comm/cuda.py), made at this group's first CUDA collective."""
        if self._cuda is None:
            self._cuda = CudaPath(self, t.device)
        self._cuda.check_device(t, op)
        return self._cuda

    def run(self, fn, async_op: bool, result=None, op: str = "collective", tensor=None, inputs=()):
        """Runs fn() by result's device: run_cuda when it is a CUDA tensor, else run_cpu. A caller that
        has already checked the device calls the one it needs."""
        if result is not None and result.is_cuda:
            return self.run_cuda(lambda _: fn(), async_op, result, op, inputs)
        return self.run_cpu(fn, async_op, result, op, tensor)

    def run_cuda(self, fn, async_op: bool, result, op: str = "collective", inputs=()):
        """Enqueues fn(the CUDA transport) on the communicator's stream (comm/cuda.py); result and inputs
        are the call's CUDA tensors."""
        self.seq += 1
        path = self.cuda_path(result, op)
        return path.launch(lambda: fn(path.transport), async_op, (result, *inputs), result,
                           f"{op} (sequence number {self.seq})")

    def run_cpu(self, fn, async_op: bool, result=None, op: str = "collective", tensor=None):
        """Runs fn() in call order: inline when nothing is pending, else behind the pending calls.
        Each call is logged in the flight recorder; a timeout or mismatch dumps it and names the file."""
        self.seq += 1
        entry = self.flight.start(self.seq, op, tensor)
        if not async_op:
            if self._pending == 0:  # read under the GIL; only the calling thread submits
                self._logged(fn, entry)
                return None
            self._submit(lambda: self._logged(fn, entry)).result()
            return None
        return Work(self._submit(lambda: self._logged(fn, entry)), result)

    def seconds(self) -> float:
        """Seconds spent inside this group's collectives: run()'s calls, timed here, plus the fast
        path's, which ShmComm times itself (its busy_s counts every call on it; those that came through
        run() are already in busy_s and are taken out)."""
        shm = self.shm
        return self.busy_s + (shm.busy_s - self._shm_in_run_s if shm is not None else 0.0)

    def _logged(self, fn, entry):
        # Calls execute one at a time (inline or on the worker), so this is the running call's number,
        # which with async_op can lag self.seq (the number of calls submitted). The clock is read once
        # at the start and once at the end: the entry's start is when the call begins to run (a queued
        # call's, on the worker), and its duration is also the busy time.
        self._running.seq = entry[0]
        self.flight.began(entry)
        shm = self.shm
        shm_before = shm.busy_s if shm is not None else 0.0
        try:
            fn()
        except (CommTimeout, CollectiveMismatch) as e:
            self.busy_s += self.flight.end(entry, type(e).__name__)
            path = self.flight.dump(f"{entry[1]} #{entry[0]}: {type(e).__name__}")
            raise type(e)(f"{e}\nflight recorder of this rank: {path}") from e
        except BaseException as e:
            self.busy_s += self.flight.end(entry, type(e).__name__)
            raise
        else:
            self.busy_s += self.flight.end(entry)
        finally:
            if shm is not None:
                self._shm_in_run_s += shm.busy_s - shm_before

    def _submit(self, fn) -> concurrent.futures.Future:
        with self._lock:
            self._pending += 1
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ringzero-comm")

        def task():
            # The caller goes on computing while this runs, so the wait must not spin on its core
            # ([Note: waiting in the shared-memory collectives], csrc/core/shm_wait.h); inline calls
            # run only once nothing is pending, by then spinning is back on.
            shm = self.shm
            if shm is not None:
                shm.set_spin(False)
            try:
                fn()
            finally:
                if shm is not None:
                    shm.set_spin(True)
                with self._lock:
                    self._pending -= 1

        return self._executor.submit(task)

    def close(self):
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if self._cuda is not None:
            self._cuda.close()
            self._cuda = None
        self.flight.sources.clear()
        self.busy_s = self.seconds()  # the fast path's share, before the native counter goes
        self._shm_in_run_s = 0.0
        if hasattr(self.transport, "close"):  # Hierarchical's cross-host thread
            self.transport.close()
        self.shm = self.transport = None  # the transports hold the segment too
        self.shm_direct = False
        self.shm_all_reduce_ = self.shm_reduce_scatter = self.shm_all_gather = self.shm_all_to_all = None

    # ---- collectives on contiguous tensors (any shape), run through run() ----------------------------
    # Each goes to the transport of its tensor's device: the CPU one picked at construction, or the
    # CUDA one (made by run() before it calls these).
    def all_reduce(self, x: torch.Tensor, op: ReduceOp):
        """x reduced in place over the group with `op`."""
        (self._cuda.transport if x.is_cuda else self.transport).all_reduce(x, op)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp):
        """out (numel k) gets block `rank` of inp (numel world*k) reduced over the group."""
        (self._cuda.transport if out.is_cuda else self.transport).reduce_scatter(out, inp, op)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, counts: list[int] | None = None):
        """out gets every rank's inp in rank order (counts: per-rank numels when uneven)."""
        (self._cuda.transport if out.is_cuda else self.transport).all_gather(out, inp, counts)

    def broadcast(self, x: torch.Tensor, root: int):
        """x of group rank `root` copied to every rank."""
        (self._cuda.transport if x.is_cuda else self.transport).broadcast(x, root)

    def reduce(self, x: torch.Tensor, root: int, op: ReduceOp):
        """x reduced over the group into x on group rank `root`; the others' x unchanged."""
        (self._cuda.transport if x.is_cuda else self.transport).reduce(x, root, op)

    def barrier(self):
        """Returns once every rank of the group has entered it."""
        self.transport.barrier()

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, send_counts: list[int], recv_counts: list[int]):
        """out (flat) gets block `rank` of every rank's inp in rank order; counts in elements."""
        (self._cuda.transport if out.is_cuda else self.transport).all_to_all(out, inp, send_counts, recv_counts)

    def gather(self, out: torch.Tensor, inp: torch.Tensor, root: int):
        """Group rank `root`'s out gets every rank's inp in rank order (CPU tensors)."""
        self.transport.gather(out, inp, root)

    def scatter(self, out: torch.Tensor, inp: torch.Tensor, root: int):
        """Every rank's out gets its block of group rank `root`'s inp (CPU tensors)."""
        self.transport.scatter(out, inp, root)


_COMMS: dict[int, Communicator] = {}
# id(group argument) -> Communicator, the api's per-call fast path (validated on every hit). Cleared
# with _COMMS: an entry keeps its ProcessGroup alive, and a gloo group that outlives
# destroy_process_group still has its worker threads running when the interpreter exits (they then
# abort the process while releasing their last Work).
FAST: dict = {}
_GENERATIONS: dict[int, int] = {}
_COMMS_LOCK = threading.Lock()


def get_communicator(group, op: str = "collective") -> Communicator:
    """The Communicator of `group` (already resolved from None), made on first use."""
    with _COMMS_LOCK:
        comm = _COMMS.get(id(group))
        if comm is not None and comm.group is group:
            return comm
        # Ranks create communicators for a group in the same order, so they agree on the generation.
        generation = _GENERATIONS.get(id(group), 0) + 1
        _GENERATIONS[id(group)] = generation
    comm = Communicator(group, generation, op)
    with _COMMS_LOCK:
        _COMMS[id(group)] = comm
    return comm


def comm_seconds() -> float:
    """Seconds this process has spent inside ringzero collectives, over all communicators."""
    with _COMMS_LOCK:
        return sum(c.seconds() for c in _COMMS.values())


def destroy_communicators():
    """Drops every Communicator (their segments are unmapped) and with them ringzero's references to
    the process groups; call it beside destroy_process_group (either order). It also runs at exit."""
    with _COMMS_LOCK:
        comms = list(_COMMS.values())
        _COMMS.clear()
        FAST.clear()
    for c in comms:
        c.close()


# At interpreter exit, before its threads are torn down: a group that only ringzero still holds is
# released here, so its gloo threads are joined while that is still safe.
atexit.register(destroy_communicators)
