"""Rings over torch.distributed point-to-point (gloo isend/irecv) with ringzero's reductions between
steps: the path between hosts. gloo only moves bytes; the schedule and the arithmetic are ours.

Every transfer is cut into slices of RINGZERO_RING_SLICE_BYTES that are all posted at once, so the
reduction of slice i overlaps the transfer of slice i+1 (NCCL's pipelining, on the host).
"""
from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

from .. import _C
from .errors import CommError, CommTimeout
from .types import ReduceOp


class P2PRing:
    """A ring of `members` (global ranks, in ring order) inside `group`; this process is members[pos].

    All methods take flat contiguous CPU tensors and must be called by every member with the same
    sizes. `label` gives the op name and sequence number used in error messages.
    """

    def __init__(self, group, members: list[int], pos: int, timeout_s: float, slice_bytes: int):
        self.group = group
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
                f"ringzero {self._label} on rank {dist.get_rank()}: point-to-point transfer with rank {peer} "
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
        sends = [dist.isend(s, dst, group=self.group) for s in (self._slices(send) if send is not None else [])]
        pieces = self._slices(recv) if recv is not None else []
        recvs = [dist.irecv(p, src, group=self.group) for p in pieces]
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
        sends and receives 2(n-1)/n of the buffer. op is SUM/MIN/MAX/PRODUCT; divisor applies AVG."""
        n, pos = self.n, self.pos
        if n == 1:
            if divisor > 1:
                _C.reduce_(x, [x], int(ReduceOp.SUM), divisor)
            return
        chunks = list(x.tensor_split(n))
        tmp = torch.empty(chunks[0].numel(), dtype=x.dtype)
        for t in range(n - 1):
            send, recv = chunks[(pos - t) % n], chunks[(pos - t - 1) % n]
            last = t == n - 2

            def fold(off, piece, recv=recv, last=last):
                d = recv[off:off + piece.numel()]
                self._fold(d, piece, op, divisor if last else 1)

            self._sendrecv(send, tmp[:recv.numel()], on_recv=fold)
        for t in range(n - 1):
            self._sendrecv(chunks[(pos + 1 - t) % n], chunks[(pos - t) % n])

    def reduce_scatter(self, inp: torch.Tensor, out: torch.Tensor, op: ReduceOp, divisor: int = 1):
        """inp holds n blocks of out.numel(); out receives block `pos` reduced over all members.
        inp is not modified. Each rank sends and receives (n-1)/n of inp."""
        n, pos, c = self.n, self.pos, out.numel()
        blocks = list(inp.split(c)) if c else [inp[:0]] * n
        if n == 1:
            _C.reduce_(out, [blocks[0]], int(ReduceOp.SUM if divisor > 1 else op), divisor)
            return
        tmp = torch.empty(c, dtype=inp.dtype)
        acc = [torch.empty(c, dtype=inp.dtype), torch.empty(c, dtype=inp.dtype)]
        send = blocks[(pos - 1) % n]
        for t in range(n - 1):
            b = (pos - t - 2) % n
            last = t == n - 2
            target = out if last else acc[t % 2]

            def fold(off, piece, b=b, target=target, last=last):
                k = piece.numel()
                _C.reduce_(target[off:off + k], [blocks[b][off:off + k], piece], int(op), divisor if last else 1)

            self._sendrecv(send, tmp, on_recv=fold)
            send = target

    def all_gather(self, inp: torch.Tensor, out: torch.Tensor, counts: list[int] | None = None):
        """out holds every member's inp in member order; counts (per member) allow uneven sizes."""
        n, pos = self.n, self.pos
        counts = counts or [inp.numel()] * n
        displ = [sum(counts[:i]) for i in range(n)]
        block = lambda i: out[displ[i]:displ[i] + counts[i]]  # noqa: E731
        block(pos).copy_(inp)
        for t in range(n - 1):
            self._sendrecv(block((pos - t) % n), block((pos - t - 1) % n))

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
                sends.append(dist.isend(piece, self.right, group=self.group))

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
                sends.append(dist.isend(d, self.right, group=self.group))

        self._sendrecv(None, torch.empty_like(inp), on_recv=fold)
        for w in sends:
            self._wait(w, self.right)

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
