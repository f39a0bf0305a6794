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

import concurrent.futures
import os
import socket
import threading

import torch
import torch.distributed as dist

from .. import _C
from .errors import CommError
from .ring import P2PRing
from .types import ReduceOp
from .work import Work

ALGOS = {"auto": 0, "oneshot": 1, "twoshot": 2, "ring": 3}


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

    def __init__(self, group):
        self.group = group
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
        self.seq = 0
        self.shm = None
        self._lock = threading.Lock()
        self._pending = 0
        self._executor = None
        self._cuda = None  # CudaPath, made on the first CUDA collective (comm/cuda.py)

        infos = [None] * self.world
        dist.all_gather_object(infos, (host_id(), os.getpid()), group=group)
        self.hosts: dict[str, list[int]] = {}
        for r, (h, _) in enumerate(infos):
            self.hosts.setdefault(h, []).append(r)
        self.local_ranks = self.hosts[infos[self.rank][0]]
        self.local_rank = self.local_ranks.index(self.rank)
        self.local_world = len(self.local_ranks)
        self.single_host = len(self.hosts) == 1
        sizes = {len(v) for v in self.hosts.values()}
        self.hierarchical = not self.single_host and len(sizes) == 1 and self.local_world > 1
        self._setup_shm()

        self.flat_ring = None
        self.cross_ring = None
        if not self.single_host:
            self.flat_ring = P2PRing(group, self.global_ranks, self.rank, self.timeout_s, self.ring_slice_bytes)
            if self.hierarchical:
                members = [self.global_ranks[ranks[self.local_rank]] for ranks in self.hosts.values()]
                pos = list(self.hosts).index(infos[self.rank][0])
                self.cross_ring = P2PRing(group, members, pos, self.timeout_s, self.ring_slice_bytes)

    def _setup_shm(self):
        """Leader creates the segment, the others open it by name, the leader unlinks it once all have
        it mapped. Errors on any rank are raised on every rank (no rank is left waiting)."""
        leader = self.local_rank == 0
        error = None
        if self.local_world > 1 and leader:
            try:
                self.shm = _C.ShmComm("", 0, self.local_world, self.slot_bytes, self.timeout_s, self.local_ranks)
            except Exception as e:  # reported to every rank below
                error = f"rank {self.rank}: {e}"
        names = [None] * self.world
        dist.all_gather_object(names, (self.shm.name if self.shm else None, error), group=self.group)
        errors = [e for _, e in names if e]
        if not errors and self.local_world > 1 and not leader:
            try:
                name = names[self.local_ranks[0]][0]
                self.shm = _C.ShmComm(name, self.local_rank, self.local_world, self.slot_bytes, self.timeout_s,
                                      self.local_ranks)
            except Exception as e:
                error = f"rank {self.rank}: {e}"
        opened = [None] * self.world
        try:
            dist.all_gather_object(opened, error, group=self.group)
        finally:
            if self.shm is not None and leader:
                self.shm.unlink()
        errors += [e for e in opened if e]
        if errors:
            self.shm = None
            raise CommError("ringzero could not set up shared memory: " + "; ".join(errors))

    # ---- execution ---------------------------------------------------------------------------------
    def cuda_path(self, t: torch.Tensor, op: str):
        """The CUDA transports (comm/cuda.py), made at this group's first CUDA collective."""
        if self._cuda is None:
            from .cuda import CudaPath

            self._cuda = CudaPath(self, t.device)
        self._cuda.check_device(t, op)
        return self._cuda

    def run(self, fn, async_op: bool, result=None, inputs=()):
        """Runs fn in call order: inline when nothing is pending, else behind the pending calls.
        CUDA tensors: fn is enqueued on the communicator's stream instead (comm/cuda.py)."""
        self.seq += 1
        if isinstance(result, torch.Tensor) and result.is_cuda:
            return self.cuda_path(result, "collective").launch(fn, async_op, (result, *inputs), result)
        if not async_op:
            with self._lock:
                busy = self._pending > 0
            if not busy:
                fn()
                return None
            self._submit(fn).result()
            return None
        return Work(self._submit(fn), result)

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
        return f"{op} (sequence number {self.seq})"

    # ---- collectives on flat contiguous tensors ----------------------------------------------------
    def all_reduce(self, x: torch.Tensor, op: ReduceOp):
        if x.is_cuda:
            return self._cuda.all_reduce(x, op)
        if self.world == 1:
            return
        if self.single_host:
            self.shm.all_reduce(x, x, int(op), self.algo)
            return
        base, divisor = (ReduceOp.SUM, self.world) if op == ReduceOp.AVG else (op, 1)
        if not self.hierarchical:
            self.flat_ring.begin(self._label("all_reduce"))
            self.flat_ring.all_reduce(x, base, divisor)
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
        self.flat_ring.begin(self._label("reduce_scatter"))
        self.flat_ring.reduce_scatter(inp, out, base, divisor)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, counts: list[int] | None = None):
        if out.is_cuda:
            if counts is None:
                return self._cuda.all_gather(out, inp)
            return _through_host(lambda o, i: self.all_gather(o, i, counts), out, inp)
        if self.single_host:
            if self.world == 1:
                out.copy_(inp)
            elif counts is None:
                self.shm.all_gather(inp, out)
            else:
                self.shm.all_gather_v(inp, out, counts)
            return
        self.flat_ring.begin(self._label("all_gather"))
        self.flat_ring.all_gather(inp, out, counts)

    def broadcast(self, x: torch.Tensor, root: int):
        if x.is_cuda:
            return _through_host(lambda h: self.broadcast(h, root), x)
        if self.world == 1:
            return
        if self.single_host:
            self.shm.broadcast(x, root)
            return
        self.flat_ring.begin(self._label("broadcast"))
        self.flat_ring.broadcast(x, root)

    def reduce(self, x: torch.Tensor, root: int, op: ReduceOp):
        if x.is_cuda:
            return _through_host(lambda h: self.reduce(h, root, op), x)
        if self.world == 1:
            return
        if self.single_host:
            self.shm.reduce(x, x, int(op), root)
            return
        base, divisor = (ReduceOp.SUM, self.world) if op == ReduceOp.AVG else (op, 1)
        self.flat_ring.begin(self._label("reduce"))
        self.flat_ring.reduce(x, x, root, base, divisor)

    def barrier(self):
        if self.world == 1:
            return
        if self.single_host:
            self.shm.barrier()
            return
        self.flat_ring.begin(self._label("barrier"))
        self.flat_ring.barrier()


def _through_host(fn, out: torch.Tensor, *inputs: torch.Tensor):
    """Broadcast, reduce and all_gather_v have no CUDA kernels: run them on host copies (this waits
    for the GPU; it is correct, not fast)."""
    host = out.cpu()
    fn(host, *(t.cpu() for t in inputs))
    out.copy_(host)


_COMMS: dict[int, Communicator] = {}
_COMMS_LOCK = threading.Lock()


def get_communicator(group) -> Communicator:
    """The Communicator of `group` (already resolved from None), made on first use."""
    with _COMMS_LOCK:
        comm = _COMMS.get(id(group))
        if comm is not None and comm.group is group:
            return comm
    comm = Communicator(group)
    with _COMMS_LOCK:
        _COMMS[id(group)] = comm
    return comm


def destroy_communicators():
    """Drops every Communicator (their segments are unmapped); call after destroy_process_group."""
    with _COMMS_LOCK:
        comms = list(_COMMS.values())
        _COMMS.clear()
    for c in comms:
        c.close()
