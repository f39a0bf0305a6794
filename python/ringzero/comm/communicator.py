"""The Communicator: one per ProcessGroup, made lazily on the first collective.

It takes the group's HostGroup (comm/host_group.py: the validated configuration, which ranks share a
host, the store rendezvous), sets up the shared-memory segment for the ranks of this host, and picks
the transport for each call:
  - one host: shared-memory collectives (csrc/core/shm_comm.cpp);
  - several hosts with the same number of ranks each: hierarchical all-reduce (shared-memory
    reduce-scatter, one ring per local rank across hosts, shared-memory all-gather); the other
    collectives take the flat ring over all ranks;
  - otherwise: the flat ring over torch.distributed point-to-point (comm/ring.py).
Calls run inline, or on one worker thread per communicator when async_op=True, in call order.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import threading
import time

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d

from .. import _C
from .cuda import CudaPath
from .errors import CollectiveMismatch, CommTimeout
from .flight import FlightRecorder
from .hierarchical import all_reduce_hierarchical
from .host_group import HostGroup
from .ring import P2PRing
from .types import SUPPORTED_DTYPES, CollectiveKind, ReduceOp
from .work import Work


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
        self._running_seq = 0
        self.flight = FlightRecorder(dist.get_rank(), f"group of {self.world} ranks {self.global_ranks[:8]}",
                                     cfg.flight_dir)
        self.shm = None
        self.shm_direct = False  # every collective of this group runs on self.shm (the api's fast path)
        self._lock = threading.Lock()
        self._pending = 0
        self._executor = None
        self._cuda = None  # CudaPath, made on the first CUDA collective (comm/cuda.py)

        self.hosts = topo.hosts
        self.local_ranks, self.local_rank, self.local_world = topo.local_ranks, topo.local_rank, topo.local_world
        self.single_host, self.hierarchical = topo.single_host, topo.hierarchical
        if self.local_world > 1:
            self._setup_shm()
        self.shm_direct = self.single_host and self.shm is not None
        if self.shm_direct:  # bound once: the fast path calls them without a lookup (csrc/torch/shm_direct.cpp)
            direct = _C.shm_direct(self.shm)
            self.shm_all_reduce_, self.shm_reduce_scatter = direct.all_reduce_, direct.reduce_scatter
            self.shm_all_gather = direct.all_gather
        if self.shm is not None:  # the bound method, not a lambda over self: no cycle keeps the group alive
            self.flight.sources["shared-memory collectives (their own record, the api's fast path included)"] = \
                self.shm.history

        self.flat_ring = None
        self.cross_ring = None
        if not self.single_host:
            self.flat_ring = P2PRing(group, self.global_ranks, self.rank, self.timeout_s, self.ring_slice_bytes)
            if self.hierarchical:
                members = [self.global_ranks[r] for r in topo.cross_ring]
                pos, ring = topo.cross_ring.index(self.rank), topo.cross_ring
                self.cross_ring = P2PRing(group, members, pos, self.timeout_s, self.ring_slice_bytes)
                # Its neighbours (group ranks: the one it receives from, the one it sends to), published
                # in the segment while it waits on them.
                self._cross_peers = sorted({ring[(pos - 1) % len(ring)], ring[(pos + 1) % len(ring)]})

    def _setup_shm(self):
        """This host's shared-memory segment, made by its first rank and opened by the others through
        the HostGroup (comm/host_group.py share_segment)."""
        self.shm = self.host_group.share_segment(
            "shm",
            create=lambda: _C.ShmComm("", 0, self.local_world, self.slot_bytes, self.timeout_s, self.local_ranks),
            open_=lambda name: _C.ShmComm(name, self.local_rank, self.local_world, self.slot_bytes, self.timeout_s,
                                          self.local_ranks))
        self.shm.set_host_cpus(self.host_group.local_cpus)

    # ---- execution ---------------------------------------------------------------------------------
    def cuda_path(self, t: torch.Tensor, op: str):
        """The CUDA transports (comm/cuda.py), made at this group's first CUDA collective."""
        if self._cuda is None:
            self._cuda = CudaPath(self, t.device)
        self._cuda.check_device(t, op)
        return self._cuda

    def run(self, fn, async_op: bool, result=None, op: str = "collective", tensor=None, inputs=()):
        """Runs fn in call order: inline when nothing is pending, else behind the pending calls.
        Each call is logged in the flight recorder; a timeout or mismatch dumps it and names the file.
        CUDA tensors: fn is enqueued on the communicator's stream instead (comm/cuda.py)."""
        self.seq += 1
        if result is not None and result.is_cuda:
            return self.cuda_path(result, op).launch(fn, async_op, (result, *inputs), result,
                                                     f"{op} (sequence number {self.seq})")
        entry = self.flight.start(self.seq, op, tensor)
        if not async_op:
            if self._pending == 0:  # read under the GIL; only the calling thread submits
                self._logged(fn, entry)
                return None
            self._submit(lambda: self._logged(fn, entry, queued=True)).result()
            return None
        return Work(self._submit(lambda: self._logged(fn, entry, queued=True)), result)

    def serves(self, group) -> bool:
        """Whether this communicator (found by id(group) in FAST) is still the one of `group`."""
        if group is None:
            return self.group is _c10d._world.default_pg
        return self.group is group and dist.is_initialized()

    # The api's fast path for a blocking collective on this host's shared memory is written inline in
    # api.all_reduce, reduce_scatter_single and all_gather_single (a method call here cost 0.1-0.15 us of
    # a 1.4 us 4 KiB call): when nothing is pending (`_pending`, else run() must order the call) it calls
    # the native op (shm_all_reduce_, ...: csrc/torch/shm_direct.cpp) on the calling thread, which checks
    # the tensors itself and returns False, having done nothing, for any it does not take (the api's slow
    # path then handles or explains them), True when the collective ran; the api then counts the call
    # (seq). ShmComm times it (busy_s) and logs it in its own history, which the flight recorder dumps.
    # On an exception the api calls direct_failed.
    def direct_failed(self, e: BaseException, op: str) -> None:
        """Counts the failed call, then re-raises: a timeout or a mismatch naming the flight recorder's
        dump, anything else as it is."""
        self.seq += 1
        if isinstance(e, (CommTimeout, CollectiveMismatch)):
            path = self.flight.dump(f"{op} #{self.seq}: {type(e).__name__}")
            raise type(e)(f"{e}\nflight recorder of this rank: {path}") from e
        raise e

    def seconds(self) -> float:
        """Seconds spent inside this group's collectives: run()'s calls, timed here, plus the fast
        path's, which ShmComm times itself (its busy_s counts every call on it; those that came through
        run() are already in busy_s and are taken out)."""
        shm = self.shm
        return self.busy_s + (shm.busy_s - self._shm_in_run_s if shm is not None else 0.0)

    def _logged(self, fn, entry, queued: bool = False):
        # Calls execute one at a time (inline or on the worker), so this is the running call's number,
        # which with async_op can lag self.seq (the number of calls submitted). The busy time counts
        # from the entry's start: a queued call's start moves to when it begins to run.
        self._running_seq = entry[0]
        if queued:
            entry[4] = time.perf_counter()
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
            # ([Note: waiting in the shared-memory collectives], csrc/core/shm_comm.cpp); inline calls
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
        self.shm = None
        self.shm_direct = False
        self.shm_all_reduce_ = self.shm_reduce_scatter = self.shm_all_gather = None

    def _label(self, op: str) -> str:
        return f"{op} (sequence number {self._running_seq})"

    def _network(self, op: str, x: torch.Tensor, root: int = -1, reduce_op=None) -> P2PRing:
        """The flat ring, after (with RINGZERO_DEBUG=1) checking that every rank calls the same thing."""
        ring = self.flat_ring
        if self.debug:
            fields = [self._running_seq, CollectiveKind[op.upper()], SUPPORTED_DTYPES.index(x.dtype), x.numel(), root,
                      -1 if reduce_op is None else int(reduce_op)]
            mine = torch.tensor(fields, dtype=torch.int64)
            table = torch.empty(self.world * len(fields), dtype=torch.int64)
            ring.begin(self._label(f"{op} fingerprint check"))
            ring.all_gather(mine, table)
            rows = table.view(self.world, len(fields)).tolist()
            if any(row != rows[0] for row in rows):
                names = {int(k): k.name.lower() for k in CollectiveKind}
                lines = [f"  {r:>4} | {names.get(row[1], '?'):<14} | {row[0]:>4} | "
                         f"{str(SUPPORTED_DTYPES[row[2]]).replace('torch.', ''):<8} | {row[3]:>10} | {row[5]:>2} | {row[4]}"
                         for r, row in enumerate(rows)]
                raise CollectiveMismatch(
                    f"ringzero collective mismatch detected on group rank {self.rank} (RINGZERO_DEBUG=1): ranks "
                    "called different collectives at the same point.\n  rank | op             | seq  | dtype    "
                    "| count      | op | root\n" + "\n".join(lines))
        ring.begin(self._label(op))
        return ring

    # ---- collectives on contiguous tensors (any shape: the native paths use numel and data) -------
    def all_reduce(self, x: torch.Tensor, op: ReduceOp):
        if x.is_cuda:
            return self._cuda.all_reduce(x, op)
        if self.world == 1:
            return
        if self.single_host:
            self.shm.all_reduce(x, x, int(op), self.algo)
            return
        x = x.view(-1)  # the Python rings slice flat buffers
        base, divisor = (ReduceOp.SUM, self.world) if op == ReduceOp.AVG else (op, 1)
        ring = self._network("all_reduce", x, reduce_op=op)
        if not self.hierarchical:
            ring.all_reduce(x, base, divisor)
            return

        shm = self.shm

        def cross(part):  # AVG: the ring divides at its last step ([Note: AVG in the hierarchical all-reduce])
            # The local ranks wait for this one in the all-gather that follows, each on its own clock: the
            # segment says where this rank is (a peer whose clock runs out first names the far side), and
            # a failure here aborts their waits at once, quoting it.
            self.cross_ring.begin(self._label("all_reduce"))
            shm.set_away(self._cross_peers)
            try:
                self.cross_ring.all_reduce(part, base, divisor)
            except BaseException as e:
                shm.abort(f"its cross-host step failed: {e}")
                raise
            shm.set_away([])

        all_reduce_hierarchical(x, self.local_world,
                                lambda staged, part: self.shm.reduce_scatter(staged, part, int(base)),
                                cross, self.shm.all_gather)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp):
        if out.is_cuda:
            return self._cuda.reduce_scatter(out, inp, op)
        if self.single_host:
            if self.world == 1:
                _C.reduce_(out, [inp], int(ReduceOp.SUM), 1)
            else:
                self.shm.reduce_scatter(inp, out, int(op))
            return
        base, divisor = (ReduceOp.SUM, self.world) if op == ReduceOp.AVG else (op, 1)
        ring = self._network("reduce_scatter", inp, reduce_op=op)
        ring.reduce_scatter(inp.view(-1), out.view(-1), base, divisor)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, counts: list[int] | None = None):
        if out.is_cuda:
            if counts is None:
                return self._cuda.all_gather(out, inp)
            return _through_host(lambda o, i: self.all_gather(o, i, counts), out, inp)
        if self.single_host:
            if self.world == 1:
                out.view(-1).copy_(inp.view(-1))
            elif counts is None:
                self.shm.all_gather(inp, out)
            else:
                self.shm.all_gather_v(inp, out, counts)
            return
        self._network("all_gather", out).all_gather(inp.view(-1), out.view(-1), counts)

    def broadcast(self, x: torch.Tensor, root: int):
        if x.is_cuda:
            return _through_host(lambda h: self.broadcast(h, root), x)
        if self.world == 1:
            return
        if self.single_host:
            self.shm.broadcast(x, root)
            return
        self._network("broadcast", x, root=root).broadcast(x.view(-1), root)

    def reduce(self, x: torch.Tensor, root: int, op: ReduceOp):
        if x.is_cuda:
            return _through_host(lambda h: self.reduce(h, root, op), x)
        if self.world == 1:
            return
        if self.single_host:
            self.shm.reduce(x, x, int(op), root)
            return
        base, divisor = (ReduceOp.SUM, self.world) if op == ReduceOp.AVG else (op, 1)
        x = x.view(-1)
        self._network("reduce", x, root=root, reduce_op=op).reduce(x, x, root, base, divisor)

    def barrier(self):
        if self.world == 1:
            return
        if self.single_host:
            self.shm.barrier()
            return
        self._network("barrier", torch.empty(0, dtype=torch.uint8)).barrier()


def _through_host(fn, out: torch.Tensor, *inputs: torch.Tensor):
    """Broadcast, reduce and all_gather_v have no CUDA kernels: run them on host copies (this waits
    for the GPU; it is correct, not fast)."""
    host = out.cpu()
    fn(host, *(t.cpu() for t in inputs))
    out.copy_(host)


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
