"""Rings over torch.distributed point-to-point (gloo isend/irecv) with ringzero's reductions between
steps: the path between hosts. gloo only moves bytes; the schedule and the arithmetic are ours.

Every transfer is cut into slices of RINGZERO_RING_SLICE_BYTES that are all posted at once, so the
reduction of slice i overlaps the transfer of slice i+1 (NCCL's pipelining, on the host).

[Note: the slice pipeline] gloo matches a pair's messages in the order they were posted, so a rank may
post every receive of a collective at its start and each send as soon as its slice is ready: the right
neighbour posts its receives in the same (step, slice) order in which this rank sends. A receive posted
early into a buffer that the collective still reads (all_reduce: a chunk this rank sends in an earlier
step) is safe: the bytes that land there are the slice's final value, which exists only after this
rank's own send of that slice has gone round the ring. Measured in the host lab (benchmarks/RESULTS.md, issue 36): the step-by-step
ring left the link idle between steps and reached 75-77% of a 1 Gbit/s link with 1 MiB slices.

[Note: two members exchange] A SUM all-reduce of two members (two hosts' ring, or two ranks) sends the same
bytes as the ring's two steps when each member sends its whole buffer at once and adds what it receives: the
ring sends half, folds, then sends the folded half; the exchange sends both halves at the start. So nothing on
the link waits for a fold: the ring's second half could go only once the thread finishing the call had woken
and folded the first, and in the hierarchical pipeline, where one thread finishes the segments in order, a
segment's second half waited for the previous segment to land. Both members compute mine + theirs, which is
bitwise theirs + mine (IEEE addition commutes), so they hold the same result, and it is the ring's. Its cost
is a staging buffer of the whole message instead of half of it, so it is taken up to EXCHANGE_MAX_BYTES (the
pipeline's parts are at most 2 MiB); MIN and MAX keep the ring (which operand a NaN comparison returns depends
on their order). A slice of the buffer is folded only once its own send has completed (gloo reads the buffer
until then). In the lab, stock DDP's 16.8 MB of gradients crossed in 145-147 ms against 152-165 with the
ring (benchmarks/RESULTS.md, "Two members exchange").
"""
from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

from .. import _C
from .errors import CommError, CommTimeout
from .types import ReduceOp


EXCHANGE_MAX_BYTES = 16 << 20
"""The largest all-reduce of a two-member ring that exchanges whole buffers ([Note: two members exchange])."""


class DistLink:
    """Point-to-point through torch.distributed on a ProcessGroup (peers are global ranks)."""

    def __init__(self, group):
        self.group = group

    def isend(self, t: torch.Tensor, peer: int, tag: int):
        return dist.isend(t, peer, group=self.group, tag=tag)

    def irecv(self, t: torch.Tensor, peer: int, tag: int):
        return dist.irecv(t, peer, group=self.group, tag=tag)


class BackendLink:
    """Point-to-point on a bare c10d backend (a ProcessGroupGloo the swap-in backend made for its engine,
    before torch has a ProcessGroup for the group): peers are group ranks. Its Works wait as
    torch.distributed's do."""

    def __init__(self, backend):
        self.backend = backend

    def isend(self, t: torch.Tensor, peer: int, tag: int):
        return self.backend.send([t], peer, tag)

    def irecv(self, t: torch.Tensor, peer: int, tag: int):
        return self.backend.recv([t], peer, tag)


EXCHANGE = "exchange"  # all_reduce_start's state for [Note: two members exchange]


class P2PRing:
    """A ring of `members` (global ranks, in ring order) inside `group`; this process is members[pos].

    All methods take flat contiguous CPU tensors and must be called by every member with the same
    sizes. `label` gives the op name and sequence number used in error messages.
    """

    def __init__(self, group, members: list[int], pos: int, timeout_s: float, slice_bytes: int, link=None):
        self.group = group
        # What moves the bytes: torch.distributed's point-to-point on `group` (members are global ranks), or
        # a BackendLink on a bare c10d backend (the swap-in backend's engine: members are group ranks).
        self.link = DistLink(group) if link is None else link
        self.members = members
        self.n = len(members)
        self.pos = pos
        self.right = members[(pos + 1) % self.n]
        self.left = members[(pos - 1) % self.n]
        self.timeout_s = timeout_s
        self.slice_bytes = max(64, slice_bytes)
        self._deadline = 0.0
        self._label = ""

    # ---- plumbing ---------------------------------------------------------------------------------
    def begin(self, label: str):
        self._label = label
        self._deadline = time.monotonic() + self.timeout_s

    def _wait(self, work, peer: int):
        remaining = self._deadline - time.monotonic()
        try:
            if remaining <= 0 or not work.wait(datetime.timedelta(seconds=remaining)):
                raise TimeoutError("no completion")
        except Exception as e:  # gloo raises on a closed connection (dead peer) or on timeout
            raise CommTimeout(
                f"ringzero {self._label} on rank {self.members[self.pos]}: point-to-point transfer with rank {peer} "
                f"failed or timed out (limit {self.timeout_s} s): {e}. A peer may have died or called a "
                "different collective; raise RINGZERO_TIMEOUT_S if it is only slow."
            ) from e

    def _slices(self, t: torch.Tensor):
        if t.numel() == 0:
            return []
        per = max(1, self.slice_bytes // t.element_size())
        return list(t.split(per))

    def _sendrecv(self, send: torch.Tensor | None, recv: torch.Tensor | None, dst=None, src=None, on_recv=None):
        """Sends `send` to dst (default: right) while receiving `recv` from src (default: left);
        on_recv(offset, piece) runs as each received slice lands."""
        dst = self.right if dst is None else dst
        src = self.left if src is None else src
        sends = [self.link.isend(s, dst, 0) for s in (self._slices(send) if send is not None else [])]
        pieces = self._slices(recv) if recv is not None else []
        recvs = [self.link.irecv(p, src, 0) for p in pieces]
        offset = 0
        for piece, w in zip(pieces, recvs):
            self._wait(w, src)
            if on_recv is not None:
                on_recv(offset, piece)
            offset += piece.numel()
        for w in sends:
            self._wait(w, dst)

    @staticmethod
    def _fold(dst: torch.Tensor, src: torch.Tensor, op: ReduceOp, divisor: int):
        _C.reduce_(dst, [dst, src], int(op), divisor)

    # ---- collectives ------------------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor, op: ReduceOp, divisor: int = 1):
        """In place. Ring reduce-scatter (n-1 steps) then ring all-gather (n-1 steps); each rank
        sends and receives 2(n-1)/n of the buffer. op is SUM/MIN/MAX/PRODUCT; divisor applies AVG. Two
        members summing up to EXCHANGE_MAX_BYTES exchange whole buffers instead ([Note: two members exchange]).

        Pipelined by slice across all 2(n-1) steps ([Note: the slice pipeline]): every receive is posted
        at the start, and a slice goes on to the next step as soon as it has been folded (reduce-scatter)
        or has landed (all-gather), so both directions of the link stay busy from the first slice to the
        last with no pause between steps. The arithmetic and its order are those of the step-by-step ring.
        """
        self.all_reduce_finish(self.all_reduce_start(x, op, divisor))

    def all_reduce_start(self, x: torch.Tensor, op: ReduceOp, divisor: int = 1, tag: int = 0):
        """all_reduce's first half: posts every receive and the first step's sends, and returns the state
        that all_reduce_finish takes. Another thread may finish it while this one starts the next (the
        hierarchical pipeline); calls that are in flight together need distinct tags (gloo matches a
        pair's messages in posting order per tag, and the two threads post in no fixed order)."""
        n, pos = self.n, self.pos
        if n == 1:
            if divisor > 1:
                _C.reduce_(x, [x], int(ReduceOp.SUM), divisor)
            return None
        if n == 2 and op == ReduceOp.SUM and x.numel() * x.element_size() <= EXCHANGE_MAX_BYTES:
            theirs = torch.empty_like(x)  # [Note: two members exchange]
            recvs = [self.link.irecv(p, self.left, tag) for p in self._slices(theirs)]
            sends = [self.link.isend(p, self.right, tag) for p in self._slices(x)]
            return EXCHANGE, x, theirs, recvs, sends, op, divisor
        chunks = list(x.tensor_split(n))
        # Step s < n-1 (reduce-scatter) sends chunk pos-s and folds chunk pos-s-1 into itself from a
        # staging buffer; step s >= n-1 (all-gather step t = s-n+1) sends chunk pos+1-t and receives chunk
        # pos-t in place. What step s receives is what step s+1 sends, slice for slice.
        send_chunk = [(pos - s) % n if s < n - 1 else (pos + 1 - (s - n + 1)) % n for s in range(2 * (n - 1))]
        recv_chunk = [(pos - s - 1) % n if s < n - 1 else (pos - (s - n + 1)) % n for s in range(2 * (n - 1))]
        staging = torch.empty((n - 1, chunks[0].numel()), dtype=x.dtype)
        recvs = []  # (step, offset, landing piece, work): all posted now, in the order the left sends them
        for s in range(2 * (n - 1)):
            dst = chunks[recv_chunk[s]]
            land = staging[s][:dst.numel()] if s < n - 1 else dst
            off = 0
            for piece in self._slices(land):
                recvs.append((s, off, piece, self.link.irecv(piece, self.left, tag)))
                off += piece.numel()
        sends = [self.link.isend(p, self.right, tag) for p in self._slices(chunks[send_chunk[0]])]
        return chunks, recv_chunk, staging, recvs, sends, op, divisor, tag

    def all_reduce_finish(self, state):
        """all_reduce's second half: folds and forwards each slice as it lands; returns when done."""
        if state is None:
            return
        if state[0] is EXCHANGE:
            _, x, theirs, recvs, sends, op, divisor = state
            for mine, got, got_work, sent_work in zip(self._slices(x), self._slices(theirs), recvs, sends):
                self._wait(got_work, self.left)
                self._wait(sent_work, self.right)  # gloo reads this slice of x until its send completes
                self._fold(mine, got, op, divisor)
            return
        chunks, recv_chunk, staging, recvs, sends, op, divisor, tag = state
        n = self.n
        for s, off, piece, work in recvs:
            self._wait(work, self.left)
            k = piece.numel()
            if s < n - 1:
                piece = chunks[recv_chunk[s]][off:off + k]
                self._fold(piece, staging[s][off:off + k], op, divisor if s == n - 2 else 1)
            if s < 2 * (n - 1) - 1:  # the last all-gather step forwards nothing
                sends.append(self.link.isend(piece, self.right, tag))
        for w in sends:
            self._wait(w, self.right)

    def reduce_scatter(self, inp: torch.Tensor, out: torch.Tensor, op: ReduceOp, divisor: int = 1):
        """inp holds n blocks of out.numel(); out receives block `pos` reduced over all members.
        inp is not modified. Each rank sends and receives (n-1)/n of inp. Pipelined by slice across
        its steps ([Note: the slice pipeline])."""
        self.reduce_scatter_finish(self.reduce_scatter_start(inp, out, op, divisor))

    def reduce_scatter_start(self, inp: torch.Tensor, out: torch.Tensor, op: ReduceOp, divisor: int = 1,
                             tag: int = 0):
        """reduce_scatter's first half (all receives and the first step's sends posted), as all_reduce_start."""
        n, pos, c = self.n, self.pos, out.numel()
        blocks = list(inp.split(c)) if c else [inp[:0]] * n
        if n == 1:
            _C.reduce_(out, [blocks[0]], int(ReduceOp.SUM if divisor > 1 else op), divisor)
            return None
        # Step t receives the left's partial of block pos-t-2 into staging row t, folds this rank's block
        # into it (the last step into out) and sends it on in step t+1, slice for slice.
        staging = torch.empty((n - 1, c), dtype=inp.dtype)
        recvs = []
        for t in range(n - 1):
            off = 0
            for piece in self._slices(staging[t]):
                recvs.append((t, off, piece, self.link.irecv(piece, self.left, tag)))
                off += piece.numel()
        sends = [self.link.isend(p, self.right, tag) for p in self._slices(blocks[(pos - 1) % n])]
        return blocks, out, recvs, sends, op, divisor, tag

    def reduce_scatter_finish(self, state):
        """reduce_scatter's second half: folds and forwards each slice as it lands."""
        if state is None:
            return
        blocks, out, recvs, sends, op, divisor, tag = state
        n, pos = self.n, self.pos
        for t, off, piece, work in recvs:
            self._wait(work, self.left)
            k, last = piece.numel(), t == n - 2
            dst = out[off:off + k] if last else piece
            _C.reduce_(dst, [blocks[(pos - t - 2) % n][off:off + k], piece], int(op), divisor if last else 1)
            if not last:
                sends.append(self.link.isend(dst, self.right, tag))
        for w in sends:
            self._wait(w, self.right)

    def all_gather(self, inp: torch.Tensor, out: torch.Tensor, counts: list[int] | None = None):
        """out holds every member's inp in member order; counts (per member) allow uneven sizes.
        Pipelined by slice: a received slice goes on to the right at once ([Note: the slice pipeline])."""
        self.all_gather_finish(self.all_gather_start(inp, out, counts))

    def all_gather_start(self, inp: torch.Tensor, out: torch.Tensor, counts: list[int] | None = None, tag: int = 0):
        """all_gather's first half (every receive posted, this member's block sent), as all_reduce_start."""
        n, pos = self.n, self.pos
        counts = counts or [inp.numel()] * n
        displ = [sum(counts[:i]) for i in range(n)]
        block = lambda i: out[displ[i]:displ[i] + counts[i]]  # noqa: E731
        block(pos).copy_(inp)
        # Step t receives block pos-t-1 and forwards it in step t+1.
        recvs = [(t, piece, self.link.irecv(piece, self.left, tag))
                 for t in range(n - 1) for piece in self._slices(block((pos - t - 1) % n))]
        sends = [self.link.isend(p, self.right, tag) for p in self._slices(block(pos))] if n > 1 else []
        return recvs, sends, tag

    def all_gather_finish(self, state):
        """all_gather's second half: forwards each slice as it lands; returns when all have."""
        recvs, sends, tag = state
        for t, piece, work in recvs:
            self._wait(work, self.left)
            if t < self.n - 2:
                sends.append(self.link.isend(piece, self.right, tag))
        for w in sends:
            self._wait(w, self.right)

    def broadcast(self, x: torch.Tensor, root: int):
        """Pipelined chain from member `root` to the right: each slice is forwarded as it lands."""
        n, pos = self.n, self.pos
        if n == 1:
            return
        rel = (pos - root) % n
        if rel == 0:
            self._sendrecv(x, None)
            return
        sends = []

        def forward(off, piece):
            if rel < n - 1:
                sends.append(self.link.isend(piece, self.right, 0))

        self._sendrecv(None, x, on_recv=forward)
        for w in sends:
            self._wait(w, self.right)

    def reduce(self, inp: torch.Tensor, out: torch.Tensor, root: int, op: ReduceOp, divisor: int = 1):
        """Pipelined chain root+1 -> root+2 -> ... -> root: each member folds its input into the partial
        it receives and forwards it. Only `root`'s out is written; inp is not modified elsewhere."""
        n, pos = self.n, self.pos
        if n == 1:
            _C.reduce_(out, [inp], int(ReduceOp.SUM if divisor > 1 else op), divisor)
            return
        rel = (pos - root) % n
        if rel == 1:
            self._sendrecv(inp, None)
            return
        target = out if rel == 0 else torch.empty_like(inp)
        sends = []

        def fold(off, piece):
            k = piece.numel()
            d = target[off:off + k]
            _C.reduce_(d, [piece, inp[off:off + k]], int(op), divisor if rel == 0 else 1)
            if rel != 0:
                sends.append(self.link.isend(d, self.right, 0))

        self._sendrecv(None, torch.empty_like(inp), on_recv=fold)
        for w in sends:
            self._wait(w, self.right)

    def exchange(self, sends: list, recvs: list):
        """Point-to-point with any members at once: sends is [(member position, tensor)], recvs likewise
        (flat contiguous tensors; an empty one moves nothing). Every receive is posted first, then every
        send; returns when all have completed. Messages between one pair go in order, so each side must
        list its messages to a peer in the order the peer lists them."""
        self.exchange_finish(self.exchange_start(sends, recvs))

    def exchange_start(self, sends: list, recvs: list) -> list:
        """exchange's first half: every message posted; returns what exchange_finish waits for."""
        posted = [(self.members[p], w) for p, t in recvs for w in (self.link.irecv(piece, self.members[p], 0)
                                                                  for piece in self._slices(t))]
        return posted + [(self.members[p], w) for p, t in sends for w in (self.link.isend(piece, self.members[p], 0)
                                                                         for piece in self._slices(t))]

    def exchange_finish(self, posted: list):
        """exchange's second half: returns when every message posted by exchange_start has completed."""
        for peer, w in posted:
            self._wait(w, peer)

    def barrier(self):
        """Dissemination barrier: ceil(log2 n) rounds of one-byte messages."""
        token_out, token_in = torch.zeros(1, dtype=torch.uint8), torch.zeros(1, dtype=torch.uint8)
        k = 1
        while k < self.n:
            dst = self.members[(self.pos + k) % self.n]
            src = self.members[(self.pos - k) % self.n]
            self._sendrecv(token_out, token_in, dst=dst, src=src)
            k *= 2


__all__ = ["P2PRing", "CommError"]
