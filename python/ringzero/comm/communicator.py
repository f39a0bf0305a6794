"""The Communicator: one per ProcessGroup, made lazily on the first collective.

It finds which ranks share a host (RINGZERO_HOST_ID overrides the host identity, so tests can force
the multi-host path on one machine), sets up the shared-memory segment for the ranks of this host,
and picks the transport for each call:
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
import datetime
import os
import socket
import threading
import time

import torch
import torch.distributed as dist

from .. import _C
from .errors import CollectiveMismatch, CommError, CommTimeout
from .flight import FlightRecorder
from .ring import P2PRing
from .types import SUPPORTED_DTYPES, ReduceOp
from .work import Work

ALGOS = {"auto": 0, "oneshot": 1, "twoshot": 2, "ring": 3}
_OP_CODES = {"barrier": 0, "all_reduce": 1, "reduce_scatter": 2, "all_gather": 3, "broadcast": 4, "reduce": 5}


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {raw}")
    return value


def _env_int(name: str, default: int) -> int:
    return int(_env_float(name, default))


def host_id() -> str:
    """This process's host identity: RINGZERO_HOST_ID if set, else hostname and boot id."""
    forced = os.environ.get("RINGZERO_HOST_ID")
    if forced:
        return forced
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}:{boot}"


class Communicator:
    """Transport state for one ProcessGroup. Use get_communicator(group) rather than building one."""

    def __init__(self, group, generation: int = 0, first_op: str = "collective"):
        self.group = group
        self._first_op = first_op
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.global_ranks = dist.get_process_group_ranks(group)
        self.timeout_s = _env_float("RINGZERO_TIMEOUT_S", 300.0)
        self.slot_bytes = _env_int("RINGZERO_SHM_BUFFER_BYTES", 1 << 20)
        self.ring_slice_bytes = _env_int("RINGZERO_RING_SLICE_BYTES", 1 << 20)
        algo = os.environ.get("RINGZERO_ALLREDUCE_ALGO", "auto").lower()
        if algo not in ALGOS:
            raise ValueError(f"RINGZERO_ALLREDUCE_ALGO={algo!r}: use one of {', '.join(ALGOS)}")
        self.algo = ALGOS[algo]
        # Fingerprint checks are always on for shared memory (free there); on the network paths they cost
        # one small all-gather per call, so they run only with RINGZERO_DEBUG=1.
        self.debug = os.environ.get("RINGZERO_DEBUG", "0") not in ("", "0")
        self.seq = 0  # calls submitted
        self.busy_s = 0.0  # seconds spent inside collectives (overlapped async time included)
        self._running_seq = 0
        self.flight = FlightRecorder(dist.get_rank(), f"group of {self.world} ranks {self.global_ranks[:8]}")
        self.shm = None
        self._lock = threading.Lock()
        self._pending = 0
        self._executor = None
        self._cuda = None  # CudaPath, made on the first CUDA collective (comm/cuda.py)

        self._store = _rendezvous_store(group, generation)
        infos = self._exchange("host", f"{host_id()}|{os.getpid()}", list(range(self.world)))
        hosts = [info.rsplit("|", 1)[0] for info in infos]
        self.hosts: dict[str, list[int]] = {}
        for r, h in enumerate(hosts):
            self.hosts.setdefault(h, []).append(r)
        self.local_ranks = self.hosts[hosts[self.rank]]
        self.local_rank = self.local_ranks.index(self.rank)
        self.local_world = len(self.local_ranks)
        self.single_host = len(self.hosts) == 1
        sizes = {len(v) for v in self.hosts.values()}
        self.hierarchical = not self.single_host and len(sizes) == 1 and self.local_world > 1
        if self.local_world > 1:
            self._setup_shm(hosts[self.rank])

        self.flat_ring = None
        self.cross_ring = None
        if not self.single_host:
            self.flat_ring = P2PRing(group, self.global_ranks, self.rank, self.timeout_s, self.ring_slice_bytes)
            if self.hierarchical:
                members = [self.global_ranks[ranks[self.local_rank]] for ranks in self.hosts.values()]
                pos = list(self.hosts).index(hosts[self.rank])
                self.cross_ring = P2PRing(group, members, pos, self.timeout_s, self.ring_slice_bytes)

    def _exchange(self, key: str, value: str, ranks: list[int]) -> list[str]:
        """Publishes value under key/<my rank> and returns the values of `ranks`, waiting at most the
        timeout (a rank that never arrives raises CommTimeout naming it, not a hang)."""
        self._store.set(f"{key}/{self.rank}", value)
        return [v.decode() for v in self._wait([f"{key}/{r}" for r in ranks], ranks, key)]

    def _wait(self, keys: list[str], ranks: list[int], what: str) -> list[bytes]:
        try:
            self._store.wait(keys, datetime.timedelta(seconds=self.timeout_s))
        except Exception as e:  # the store raises DistStoreError on timeout
            missing = [r for k, r in zip(keys, ranks) if not self._store.check([k])]
            raise CommTimeout(
                f"ringzero {self._first_op}: setting up the communicator (the first ringzero call on this group) "
                f"on group rank {self.rank}: group ranks {missing} did not arrive within {self.timeout_s} s "
                f"(step '{what}'). Every rank of the group must call the same collectives; raise "
                "RINGZERO_TIMEOUT_S if a rank is legitimately slow to start."
            ) from e
        return [self._store.get(k) for k in keys]

    def _setup_shm(self, host: str):
        """The leader creates the segment and publishes its name; the others open it; once all have it
        mapped the leader unlinks it (a killed process then leaks nothing) and says so. An error on any
        rank of the host is raised on every rank of the host."""
        key = f"shm/{host}"
        leader = self.local_ranks[0]
        peers = self.local_ranks[1:]
        if self.rank == leader:
            try:
                self.shm = _C.ShmComm("", 0, self.local_world, self.slot_bytes, self.timeout_s, self.local_ranks)
                self._store.set(key, "ok|" + self.shm.name)
            except Exception as e:
                self._store.set(key, f"error|rank {self.rank}: {e}")
                raise
            try:
                statuses = [v.decode() for v in self._wait([f"{key}/opened/{r}" for r in peers], peers, "open")]
            finally:
                self.shm.unlink()
            errors = [s for s in statuses if s != "ok"]
            self._store.set(f"{key}/ready", "; ".join(errors) if errors else "ok")
        else:
            status, _, payload = self._wait([key], [leader], "create")[0].decode().partition("|")
            if status != "ok":
                raise CommError(f"ringzero could not set up shared memory: {payload}")
            try:
                self.shm = _C.ShmComm(payload, self.local_rank, self.local_world, self.slot_bytes, self.timeout_s,
                                      self.local_ranks)
                self._store.set(f"{key}/opened/{self.rank}", "ok")
            except Exception as e:
                self._store.set(f"{key}/opened/{self.rank}", f"rank {self.rank}: {e}")
                raise
            errors = self._wait([f"{key}/ready"], [leader], "ready")[0].decode()
        if errors != "ok" and errors:
            self.shm = None
            raise CommError(f"ringzero could not set up shared memory: {errors}")

    # ---- execution ---------------------------------------------------------------------------------
    def cuda_path(self, t: torch.Tensor, op: str):
        """The CUDA transports (comm/cuda.py), made at this group's first CUDA collective."""
        if self._cuda is None:
            from .cuda import CudaPath

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
            self._submit(lambda: self._logged(fn, entry)).result()
            return None
        return Work(self._submit(lambda: self._logged(fn, entry)), result)

    def _logged(self, fn, entry):
        # Calls execute one at a time (inline or on the worker), so this is the running call's number,
        # which with async_op can lag self.seq (the number of calls submitted).
        self._running_seq = entry[0]
        t0 = time.perf_counter()
        try:
            fn()
        except (CommTimeout, CollectiveMismatch) as e:
            self.flight.end(entry, type(e).__name__)
            path = self.flight.dump(f"{entry[1]} #{entry[0]}: {type(e).__name__}")
            raise type(e)(f"{e}\nflight recorder of this rank: {path}") from e
        except BaseException as e:
            self.flight.end(entry, type(e).__name__)
            raise
        finally:
            self.busy_s += time.perf_counter() - t0
        self.flight.end(entry)

    def _submit(self, fn) -> concurrent.futures.Future:
        with self._lock:
            self._pending += 1
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ringzero-comm")

        def task():
            try:
                fn()
            finally:
                with self._lock:
                    self._pending -= 1

        return self._executor.submit(task)

    def close(self):
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if self._cuda is not None:
            self._cuda.close()
            self._cuda = None
        self.shm = None

    def _label(self, op: str) -> str:
        return f"{op} (sequence number {self._running_seq})"

    def _network(self, op: str, x: torch.Tensor, root: int = -1, reduce_op=None) -> P2PRing:
        """The flat ring, after (with RINGZERO_DEBUG=1) checking that every rank calls the same thing."""
        ring = self.flat_ring
        if self.debug:
            fields = [self._running_seq, _OP_CODES[op], SUPPORTED_DTYPES.index(x.dtype), x.numel(), root,
                      -1 if reduce_op is None else int(reduce_op)]
            mine = torch.tensor(fields, dtype=torch.int64)
            table = torch.empty(self.world * len(fields), dtype=torch.int64)
            ring.begin(self._label(f"{op} fingerprint check"))
            ring.all_gather(mine, table)
            rows = table.view(self.world, len(fields)).tolist()
            if any(row != rows[0] for row in rows):
                names = {v: k for k, v in _OP_CODES.items()}
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
        # Hierarchical: reduce-scatter in the host, one ring per local rank across hosts, all-gather.
        L = self.local_world
        c = -(-x.numel() // L)
        staged = x if x.numel() == L * c else torch.cat([x, x.new_zeros(L * c - x.numel())])
        part = torch.empty(c, dtype=x.dtype)
        self.shm.reduce_scatter(staged, part, int(base))
        self.cross_ring.begin(self._label("all_reduce"))
        self.cross_ring.all_reduce(part, base, divisor)
        gathered = x if staged is x else torch.empty_like(staged)
        self.shm.all_gather(part, gathered)
        if gathered is not x:
            x.copy_(gathered[: x.numel()])

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


def _rendezvous_store(group, generation: int):
    """The group's own store, under a prefix unique to this communicator."""
    from torch.distributed import distributed_c10d as c10d

    getter = getattr(c10d, "_get_process_group_store", None)
    store = getter(group) if getter else c10d._world.pg_map[group][1]
    return dist.PrefixStore(f"ringzero/{generation}/", store)


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
        return sum(c.busy_s for c in _COMMS.values())


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
