"""The CPU transports of a Communicator: one class per layout of the group's ranks, picked once when the
Communicator is made (communicator.py); each collective then calls its transport without asking again.

Every transport takes the same calls: all_reduce(x, op), reduce_scatter(out, inp, op), all_gather(out,
inp, counts=None), broadcast(x, root), reduce(x, root, op), barrier(), all_to_all(out, inp, send_counts,
recv_counts) (element counts per rank), gather(out, inp, root), scatter(out, inp, root) (only root's out,
resp. inp, is used: the others may pass an empty one), on contiguous CPU tensors already
validated by the api (any shape: the shared-memory kernels use numel and data, the rings flatten them),
called by every rank of the group in the same order. The CUDA transports (cuda.py) take the same calls.
"""
from __future__ import annotations

import concurrent.futures

import torch

from . import exchange
from .errors import CollectiveMismatch
from .hierarchical import (all_gather_pipelined, all_reduce_hierarchical, all_reduce_pipelined,
                           reduce_scatter_pipelined)
from .ring import P2PRing
from .types import SUPPORTED_DTYPES, CollectiveKind, ReduceOp


class RunningCall:
    """The sequence number of the call running now, shared by a Communicator and its transports for
    their messages. It can lag the number of calls submitted when async calls are queued. A holder
    rather than a reference to the Communicator: the transports then keep no cycle that would hold the
    group alive after destroy_communicators."""

    __slots__ = ("seq",)

    def __init__(self):
        self.seq = 0

    def label(self, op: str) -> str:
        return f"{op} (sequence number {self.seq})"


def split_avg(op: ReduceOp, world: int) -> tuple[ReduceOp, int]:
    """The rings reduce AVG as SUM with a division folded into their last step: (base op, divisor)."""
    return (ReduceOp.SUM, world) if op == ReduceOp.AVG else (op, 1)


class Solo:
    """A group of one rank (CPU or CUDA tensors): reductions leave the tensor as it is, gathers copy."""

    def all_reduce(self, x: torch.Tensor, op: ReduceOp):
        pass

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp):
        out.view(-1).copy_(inp.view(-1))

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, counts: list[int] | None = None):
        out.view(-1).copy_(inp.view(-1))

    def broadcast(self, x: torch.Tensor, root: int):
        pass

    def reduce(self, x: torch.Tensor, root: int, op: ReduceOp):
        pass

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, send_counts: list[int], recv_counts: list[int]):
        out.view(-1).copy_(inp.view(-1))

    def gather(self, out: torch.Tensor, inp: torch.Tensor, root: int):
        out.view(-1).copy_(inp.view(-1))

    def scatter(self, out: torch.Tensor, inp: torch.Tensor, root: int):
        out.view(-1).copy_(inp.view(-1))

    def barrier(self):
        pass


class SharedMemory:
    """Every rank on one host: the shared-memory collectives (csrc/core/shm_collectives.cpp) on one segment."""

    def __init__(self, shm, algo: int):
        self.shm = shm  # _C.ShmComm
        self.algo = algo  # RINGZERO_ALLREDUCE_ALGO's code

    def all_reduce(self, x: torch.Tensor, op: ReduceOp):
        self.shm.all_reduce(x, x, int(op), self.algo)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp):
        self.shm.reduce_scatter(inp, out, int(op))

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, counts: list[int] | None = None):
        if counts is None:
            self.shm.all_gather(inp, out)
        else:
            self.shm.all_gather_v(inp, out, counts)

    def broadcast(self, x: torch.Tensor, root: int):
        self.shm.broadcast(x, root)

    def reduce(self, x: torch.Tensor, root: int, op: ReduceOp):
        self.shm.reduce(x, x, int(op), root)

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, send_counts: list[int], recv_counts: list[int]):
        self.shm.all_to_all_v(inp, out, send_counts, recv_counts)

    def gather(self, out: torch.Tensor, inp: torch.Tensor, root: int):
        self.shm.gather(inp, out, root)

    def scatter(self, out: torch.Tensor, inp: torch.Tensor, root: int):
        self.shm.scatter(inp, out, root)

    def barrier(self):
        self.shm.barrier()


def _blocks(x, count: int, n: int) -> list:
    """A rooted collective's n blocks of count elements on the root: the caller's list of tensors (flat views),
    or a flat tensor cut in blocks (count 0: n empty ones)."""
    if isinstance(x, list):
        return [t.view(-1) for t in x]
    return list(x.view(-1).split(count)) if count else [x.view(-1)[:0]] * n


class NetworkRing:
    """Several hosts: the flat ring over every rank of the group (ring.py, gloo point-to-point).

    With RINGZERO_DEBUG=1 each call first checks that every rank calls the same thing (one small
    all-gather per call; shared memory does this check for free, so it is always on there)."""

    def __init__(self, ring: P2PRing, running: RunningCall, rank: int, world: int, debug: bool):
        self.ring = ring
        self.running = running
        self.rank, self.world, self.debug = rank, world, debug

    def begin(self, op: str, x: torch.Tensor, root: int = -1, reduce_op=None) -> P2PRing:
        """The flat ring, started for `op` after the fingerprint check (RINGZERO_DEBUG=1)."""
        ring = self.ring
        if self.debug:
            self._check_fingerprints(op, x, root, reduce_op)
        ring.begin(self.running.label(op))
        return ring

    def _check_fingerprints(self, op: str, x: torch.Tensor, root: int, reduce_op):
        fields = [self.running.seq, CollectiveKind[op.upper()], SUPPORTED_DTYPES.index(x.dtype), x.numel(), root,
                  -1 if reduce_op is None else int(reduce_op)]
        mine = torch.tensor(fields, dtype=torch.int64)
        table = torch.empty(self.world * len(fields), dtype=torch.int64)
        self.ring.begin(self.running.label(f"{op} fingerprint check"))
        self.ring.all_gather(mine, table)
        rows = table.view(self.world, len(fields)).tolist()
        if all(row == rows[0] for row in rows):
            return
        names = {int(k): k.name.lower() for k in CollectiveKind}
        lines = [f"  {r:>4} | {names.get(row[1], '?'):<14} | {row[0]:>4} | "
                 f"{str(SUPPORTED_DTYPES[row[2]]).replace('torch.', ''):<8} | {row[3]:>10} | {row[5]:>2} | {row[4]}"
                 for r, row in enumerate(rows)]
        raise CollectiveMismatch(
            f"ringzero collective mismatch detected on group rank {self.rank} (RINGZERO_DEBUG=1): ranks "
            "called different collectives at the same point.\n  rank | op             | seq  | dtype    "
            "| count      | op | root\n" + "\n".join(lines))

    def all_reduce(self, x: torch.Tensor, op: ReduceOp, call=None):
        x = x.view(-1)  # the rings slice flat buffers
        base, divisor = split_avg(op, self.world)
        self.begin("all_reduce", x, reduce_op=op).all_reduce(x, base, divisor)

    # The flat ring never defers a tail ([Note: the engine's deferred tail], csrc/torch/backend_hosts.h): the
    # swap-in backend's engine calls these on every transport alike.
    def settle(self):
        pass

    def abandon(self, error: BaseException):
        pass

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp):
        base, divisor = split_avg(op, self.world)
        self.begin("reduce_scatter", inp, reduce_op=op).reduce_scatter(inp.view(-1), out.view(-1), base, divisor)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, counts: list[int] | None = None):
        self.begin("all_gather", out).all_gather(inp.view(-1), out.view(-1), counts)

    def broadcast(self, x: torch.Tensor, root: int):
        self.begin("broadcast", x, root=root).broadcast(x.view(-1), root)

    def reduce(self, x: torch.Tensor, root: int, op: ReduceOp):
        base, divisor = split_avg(op, self.world)
        x = x.view(-1)
        self.begin("reduce", x, root=root, reduce_op=op).reduce(x, x, root, base, divisor)

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, send_counts: list[int], recv_counts: list[int]):
        # The fingerprint (RINGZERO_DEBUG=1) of an empty tensor: the ranks' counts differ; exchange checks them.
        ring = self.begin("all_to_all", inp[:0])
        exchange.all_to_all_flat(ring, out.view(-1), inp.view(-1), send_counts, recv_counts, self.rank)

    # The root's side of gather and scatter may be one flat tensor or the caller's list of contiguous blocks
    # (ringzero.gather's and scatter's, and the backend's through HostsComm::gather_blocks; TAKES_BLOCKS):
    # each block goes to or from its rank as it is, with no copy of the whole buffer before or after. In the
    # host lab (2 hosts x 2 ranks, 1 Gbit/s) the copies made the root's 16 MiB scatter and gather 0.8-0.9x
    # gloo's (benchmarks/RESULTS.md).
    TAKES_BLOCKS = True

    def gather(self, out, inp: torch.Tensor, root: int):
        blocks = _blocks(out, inp.numel(), self.world)
        exchange.gather_flat(self.begin("gather", inp, root=root), blocks, inp.view(-1), root, self.rank)

    def scatter(self, out: torch.Tensor, inp, root: int):
        blocks = _blocks(inp, out.numel(), self.world)
        exchange.scatter_flat(self.begin("scatter", out, root=root), out.view(-1), blocks, root, self.rank)

    def barrier(self):
        self.begin("barrier", torch.empty(0, dtype=torch.uint8)).barrier()


class Hierarchical(NetworkRing):
    """Several hosts with the same number (> 1) of ranks each: all-reduce as shared-memory reduce-scatter,
    one ring per local rank across hosts (`cross_ring`), shared-memory all-gather (hierarchical.py);
    reduce-scatter and all-gather of PIPELINE_MIN_SEGMENTS segments and more likewise in two steps (in
    the host and across, across and in the host), each pipelined over segments with its cross-host
    rings. The other collectives (and small or uneven ones) take the flat ring."""

    def __init__(self, ring: P2PRing, cross_ring: P2PRing, cross_peers: list[int], shm, local_world: int,
                 running: RunningCall, rank: int, world: int, debug: bool, hosts: list[list[int]]):
        super().__init__(ring, running, rank, world, debug)
        self.hosts = hosts  # group ranks of each host, in the cross rings' order
        self.cross_ring = cross_ring
        # Its neighbours (group ranks: the one it receives from, the one it sends to), published in the
        # segment while it waits on them.
        self.cross_peers = cross_peers
        self.shm = shm
        self.local_world = local_world
        self._worker = None  # the cross-host thread of the pipelined all-reduce, made at its first use
        # The swap-in backend's engine sets it: its pipelined all-reduces may leave their tail to the next op
        # ([Note: the engine's deferred tail], csrc/torch/backend_hosts.h). Every local rank's engine does,
        # so they all take the same votes.
        self.defers = False
        self.deferred_calls = 0  # how many returned before their tail ran (tests read it)
        self._tail = None  # (finish, call, (first, end) address of what finish writes): left by the last call

    def all_reduce(self, x: torch.Tensor, op: ReduceOp, call=None):
        """call: the backend's _C.DeferredCall when this all-reduce may return before its tail has run."""
        x = x.view(-1)
        base, divisor = split_avg(op, self.world)
        self.begin("all_reduce", x, reduce_op=op)  # the fingerprint check (RINGZERO_DEBUG=1) spans the group
        shm = self.shm
        reduce_scatter = lambda staged, part: shm.reduce_scatter(staged, part, int(base))  # noqa: E731
        segment_numel = self.segment_numel(x)
        if segment_numel:
            self._all_reduce_pipelined(x, segment_numel, base, divisor, reduce_scatter, call)
            return
        self.settle()

        def cross(part):  # AVG: the ring divides at its last step ([Note: AVG in the hierarchical all-reduce])
            # The local ranks wait for this one in the all-gather that follows, each on its own clock: the
            # segment says where this rank is (a peer whose clock runs out first names the far side), and
            # a failure here aborts their waits at once, quoting it.
            self.cross_ring.begin(self.running.label("all_reduce"))
            shm.set_away(self.cross_peers)
            try:
                self.cross_ring.all_reduce(part, base, divisor)
            except BaseException as e:
                shm.abort(f"its cross-host step failed: {e}")
                raise
            shm.set_away([])

        all_reduce_hierarchical(x, self.local_world, reduce_scatter, cross, shm.all_gather)

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, send_counts: list[int], recv_counts: list[int]):
        """Every pair on two hosts directly, the host's own blocks through shared memory meanwhile
        ([Note: the all-to-all across hosts], exchange.py)."""
        self.settle()
        ring = self.begin("all_to_all", inp[:0])
        exchange.all_to_all_direct_across(ring, self.shm, self.hosts, out.view(-1), inp.view(-1), send_counts,
                                          recv_counts, self.rank)

    def segment_numel(self, x: torch.Tensor) -> int:
        """Elements per segment of the pipelined all-reduce for x, or 0 where x is too small to cut in
        PIPELINE_MIN_SEGMENTS segments of pipeline_segment_bytes (the one-shot path is faster there)."""
        seg = pipeline_segment_bytes(x.numel() * x.element_size())
        per = max(self.local_world, seg // x.element_size() // self.local_world * self.local_world)
        return per if x.numel() >= PIPELINE_MIN_SEGMENTS * per else 0

    def block_segment_numel(self, whole: torch.Tensor) -> int:
        """Elements of each rank's block per segment of the pipelined reduce-scatter and all-gather, whose
        whole buffer (their input, their output) is `whole`; 0 where it is too small (the flat ring)."""
        return block_segment_numel(whole.numel(), whole.element_size(), self.world)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp):
        seg = self.block_segment_numel(inp)
        if not seg:
            return super().reduce_scatter(out, inp, op)
        base, divisor = split_avg(op, self.world)
        self.begin("reduce_scatter", inp, reduce_op=op)
        rs = lambda staged, part: self.shm.reduce_scatter(staged, part, int(base))  # noqa: E731
        self._pipeline("reduce_scatter", lambda start, finish: reduce_scatter_pipelined(
            inp.view(-1), out.view(-1), self.hosts, seg, rs,
            lambda parts, out_seg: start(self.cross_ring.reduce_scatter_start, self.cross_ring.reduce_scatter_finish,
                                         parts, out_seg, base, divisor), finish))

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, counts: list[int] | None = None):
        seg = self.block_segment_numel(out)
        if counts is not None or not seg:
            return super().all_gather(out, inp, counts)
        self.begin("all_gather", out)
        self._pipeline("all_gather", lambda start, finish: all_gather_pipelined(
            inp.view(-1), out.view(-1), self.hosts, self.cross_ring.pos, seg, self.shm.all_gather,
            lambda seg_in, landed: start(self.cross_ring.all_gather_start, self.cross_ring.all_gather_finish,
                                         seg_in, landed), finish))

    def _all_reduce_pipelined(self, x, segment_numel, base, divisor, reduce_scatter, call=None):
        ring = self.cross_ring
        if self._tail is not None:
            # The tail left before runs once this call's first segment is on the link, unless that segment
            # is memory the tail writes on any local rank (one in-host vote: the order of the in-host steps
            # must be every local rank's).
            lo, hi = self._tail[2]
            first = x[:segment_numel]
            start = first.data_ptr()
            if not self._vote(not (start < hi and lo < start + first.numel() * first.element_size())):
                self.settle()

        def defer():  # every local rank asks (self.defers is the engine's on all of them)
            return self.defers and self._vote(call is not None and call.next_queued())

        finish_last = self._pipeline("all_reduce", lambda start, finish: all_reduce_pipelined(
            x, self.local_world, segment_numel, reduce_scatter,
            lambda part: start(ring.all_reduce_start, ring.all_reduce_finish, part, base, divisor), finish,
            self.shm.all_gather, on_link=self.settle, defer=defer))
        if finish_last is not None:
            last = x[(x.numel() - 1) // segment_numel * segment_numel:]
            self._tail = (finish_last, call, (last.data_ptr(), last.data_ptr() + last.numel() * last.element_size()))
            self.deferred_calls += 1
            call.defer()

    def _vote(self, mine: bool) -> bool:
        """True when every local rank says True: one in-host all-gather of a flag."""
        flags = torch.empty(self.local_world, dtype=torch.int32)
        self.shm.all_gather(torch.tensor([int(mine)], dtype=torch.int32), flags)
        return bool(flags.all())

    def settle(self):
        """Runs the tail the last pipelined all-reduce left, if any, and completes its Work (with the error
        the tail raised, which is raised here too)."""
        tail, self._tail = self._tail, None
        if tail is None:
            return
        finish_last, call, _ = tail
        try:
            finish_last()
        except BaseException as e:
            call.complete(type(e).__name__, str(e))
            raise
        call.complete()

    def abandon(self, error: BaseException):
        """An op failed before the tail left to it ran: that call's Work fails too, saying why."""
        tail, self._tail = self._tail, None
        if tail is not None:
            tail[1].complete(type(error).__name__, "its last segment never ran: the op after it, which runs it, "
                             f"failed first: {error}")

    def _pipeline(self, op: str, body):
        """Runs body(start, finish), a pipelined collective (hierarchical.py): start(first_half, second_half,
        *args) posts the cross ring's messages for one segment here, first_half(*args, tag=...), and
        hands second_half(its state) to this transport's worker thread, which finishes the segments in
        order while this thread does the in-host steps; finish(handle) waits for one (bounded).

        The segment shows this rank as away on the network for the whole call; a cross-host failure
        aborts the local ranks' waits quoting it, and is what this rank raises. Returns what body returns."""
        shm, ring = self.shm, self.cross_ring
        if self._worker is None:
            self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ringzero-cross-host")
        ring.begin(self.running.label(op))
        futures = []

        def on_worker(second_half, state):
            try:
                second_half(state)
            except BaseException as e:
                shm.abort(f"its cross-host step failed: {e}")
                raise

        def start(first_half, second_half, *args):
            # Posted here, in segment order, so that the next segment's bytes follow the last one's on
            # the link without waiting for the worker; a tag per segment keeps the two threads' posts
            # apart ([Note: the slice pipeline], ring.py).
            state = first_half(*args, tag=PIPELINE_TAG_BASE + len(futures))
            futures.append(self._worker.submit(on_worker, second_half, state))
            return futures[-1]

        def finish(future):
            # The ring's own waits end at its deadline (begin); this one only backs them up.
            return future.result(timeout=ring.timeout_s + 10)

        # This rank's in-host waits must not spin: this process's cross-host thread and gloo's threads need
        # the core meanwhile, and so do the local peer's (with spinning on, 1 MiB segments took 300 ms
        # where 4 MiB took 150, at 16 MiB in the lab).
        spin = shm.spin
        shm.set_spin(False)
        shm.set_away(self.cross_peers)
        try:
            result = body(start, finish)
        except BaseException as e:
            failed = [f.exception(timeout=ring.timeout_s + 10) for f in futures]
            cause = next((f for f in failed if f is not None), None)
            if cause is not None and cause is not e:  # the cross-host error names the culprit rank
                raise cause from e
            raise
        finally:
            shm.set_spin(spin)
        shm.set_away([])
        return result

    def close(self):
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None


SOLO, ONE_HOST, HIERARCHICAL, RING = "solo", "one host", "hierarchical", "ring"


def layout(topo, world: int) -> str:
    """How a group's collectives travel, from its topology: the one decision for every door and device
    ([Note: one engine behind every door], docs/design.md). SOLO: one rank; ONE_HOST: every rank on this
    host (shared memory; CUDA IPC); HIERARCHICAL: several hosts with the same number (> 1) of ranks each
    (in the host, then one ring per local rank across hosts); RING: any other spread (the flat ring).
    pick_transport (CPU), CudaPath (CUDA) and the swap-in backend's creator all branch on it alone."""
    if world == 1:
        return SOLO
    if topo.single_host:
        return ONE_HOST
    return HIERARCHICAL if topo.hierarchical else RING


def pick_transport(topo, rank: int, world: int, shm, algo: int, make_ring, running: RunningCall, debug: bool):
    """The CPU transport of a group for its layout(), made once (every rank decides alike). The
    Communicator (ringzero.* and ringzero's own DDP/ZeRO, and ringzero.patch() through them) and the swap-in
    backend's engine for a group spanning hosts (comm/backend.py) both call it; the backend on one host
    runs the same shared-memory collectives from C++ (csrc/torch/backend.h), told by its creator.

    topo: the group's Topology; shm: this host's _C.ShmComm (None for a host of one rank); algo:
    RINGZERO_ALLREDUCE_ALGO's code; make_ring(members, pos) -> P2PRing over the caller's point-to-point
    (members are group ranks, in ring order; the caller maps them to its link's peers). Returns
    (transport, flat ring or None, cross-host ring or None)."""
    kind = layout(topo, world)
    if kind == SOLO:
        return Solo(), None, None
    if kind == ONE_HOST:
        return SharedMemory(shm, algo), None, None
    flat = make_ring(list(range(world)), rank)
    if kind == RING:
        return NetworkRing(flat, running, rank, world, debug), flat, None
    ring = topo.cross_ring
    pos = ring.index(rank)
    cross = make_ring(list(ring), pos)
    cross_peers = sorted({ring[(pos - 1) % len(ring)], ring[(pos + 1) % len(ring)]})
    return (Hierarchical(flat, cross, cross_peers, shm, topo.local_world, running, rank, world, debug,
                         [list(r) for r in topo.hosts.values()]), flat, cross)


# [Note: the pipelined hierarchical all-reduce] segments of half the buffer, at least 1 MiB and at most
# 4 MiB, from 2 segments up (so from 2 MiB): at 16 MiB over 2 lab hosts x 2 ranks at 1 Gbit/s the
# in-host steps took 20 ms of 166 when they ran before and after the cross-host ring; cut in segments
# they overlap it and only one segment's pair stays exposed. At 4 MiB, two 2 MiB segments took the
# collectives at 1 Gbit/s from 64-86% of the link bound to 97-114%; aiming at 4 segments instead of 2 cost
# 20-35% at 8 MiB and 10 Gbit/s, where the cores, not the link, set the time and each segment costs a
# hand-off (benchmarks/RESULTS.md, issue 36). First and last segments of 1 MiB (for DDP's
# exposed all-reduce) saved about 1% at 1 Gbit/s and cost up to 25% at 10 Gbit/s: not kept (RESULTS.md,
# the swap-in backend across hosts). All of these were measured with the lab's 1 MiB tbf bucket of the
# time, which hid up to 8 ms of each pause of the link; on the strict link (benchmarks/RESULTS.md) the
# 16 MiB collectives run at 90-91% of the bound, the exposed first and last in-host steps included.
PIPELINE_SEGMENT_BYTES = 4 << 20
PIPELINE_MIN_SEGMENTS = 2
PIPELINE_SMALLEST_SEGMENT_BYTES = 1 << 20
PIPELINE_TARGET_SEGMENTS = 2
PIPELINE_TAG_BASE = 1 << 20
"""gloo tags of the pipeline's segments: PIPELINE_TAG_BASE + segment index (the rings' other calls use tag 0)."""


def pipeline_segment_bytes(nbytes: int) -> int:
    """The segment of a pipelined collective on an nbytes buffer ([Note: the pipelined hierarchical all-reduce]):
    nbytes / PIPELINE_TARGET_SEGMENTS, at least PIPELINE_SMALLEST_SEGMENT_BYTES, at most PIPELINE_SEGMENT_BYTES."""
    return min(PIPELINE_SEGMENT_BYTES, max(PIPELINE_SMALLEST_SEGMENT_BYTES, nbytes // PIPELINE_TARGET_SEGMENTS))


def block_segment_numel(numel: int, element_size: int, world: int) -> int:
    """Hierarchical.block_segment_numel for a whole buffer of numel elements over `world` ranks (also what
    `ringzero estimate` counts the bytes across hosts by): 0 below PIPELINE_MIN_SEGMENTS segments (2 MiB)."""
    seg = pipeline_segment_bytes(numel * element_size)
    per = max(1, seg // element_size // world)
    return per if numel >= PIPELINE_MIN_SEGMENTS * per * world else 0


__all__ = ["HIERARCHICAL", "ONE_HOST", "RING", "SOLO", "RunningCall", "Solo", "SharedMemory", "NetworkRing",
           "Hierarchical", "block_segment_numel", "layout", "pick_transport", "split_avg"]
