"""One ZeRO flat group (a bucket for stages 1-2, a unit for stage 3): its float32 master shard, the
gather of full parameters from the shards, and the reduction of gradients into the master shard.
The group knows nothing of stages: its owner (zero_buckets.py, zero_units.py) picks the gradient
reduction at construction and frees the full weights when it wants them sharded. How the weights are
gathered and the gradients reduce-scattered is the ParamGather and GradReduceScatter it is handed
(zero_comm.py: plain; zeropp_gather.py and zeropp.py: ZeRO++'s), which keep their own buffers.

Buffers (1D = flat, padded to a multiple of the world size; shard = 1/N of it):
  master        1D shard, float32, on master_device: the only copy of the weights that the optimizer steps
                (registered, comm.flat_zeros, where it is the all-gather's input: CPU, float32 parameters)
  master.grad   1D shard, float32: averaged gradient (summed over backward passes until zero_grad)
  full          1D padded, param_dtype: the gathered weights; module parameters are views into it
                (kept between steps in stages 1-2; in stage 3 its storage is resized to 0 bytes when
                freed and back when gathered, around each use)
  grad_flat     1D padded, reduce_dtype: this rank's gradients of the group, input of the reduction
                (kept between steps under ALL_REDUCE, where gradients are replicated; transient under
                REDUCE_SCATTER; in the row order its reduce-scatter reads, where that has one)
"""
from __future__ import annotations

import collections
import enum

import torch
import torch.nn as nn

from ... import comm
from ...comm.types import ReduceOp
from .flat import FlatLayout
from .zero_comm import GradReduceScatter, GroupShape, ParamGather, PlainGather, ReduceScatter


class ParamState(enum.Enum):
    SHARDED = "sharded"        # module parameters are empty; only the master shard exists
    GATHERING = "gathering"    # an async all-gather into `full` is in flight
    UNSHARDED = "unsharded"    # module parameters are views of `full`


class GradReduction(enum.Enum):
    """How a group reduces its gradients; chosen once, when the group is built."""

    ALL_REDUCE = "all_reduce"          # stage 1: grad_flat averaged in place, kept (replicated gradients)
    REDUCE_SCATTER = "reduce_scatter"  # stages 2-3: averaged into a fresh shard; grad_flat dropped


def _row_pieces(start: int, end: int, c: int, where: dict) -> list[tuple[int, int]]:
    """The layout's elements [start, end) in a buffer whose rows of c lie in another order (layout row r at
    physical row where[r]): (offset in the buffer, elements) for each row the range touches."""
    out = []
    while start < end:
        r = start // c
        stop = min(end, (r + 1) * c)
        out.append((where[r] * c + start - r * c, stop - start))
        start = stop
    return out


def _arranged_pieces(layout: FlatLayout, rows: list[int]) -> dict | None:
    """The gradient buffer holds the shard-sized rows of the flat layout in the order its reduce-scatter
    reads them (GradReduceScatter.row_order, e.g. qg's in-host step: physical row i is the layout's row
    rows[i]), so that copy_grad_in writes each gradient where that step reads it, with no rearranged copy.
    Per parameter (by id): (offset in the parameter, offset in the buffer, elements) for each row it
    touches, and under the key "padding" the padding's (offset in the buffer, elements). None where the
    order is the layout's own (plain views then)."""
    if rows == list(range(len(rows))):
        return None
    c, where = layout.shard_numel, {r: i for i, r in enumerate(rows)}
    pieces = {}
    for slot in layout.slots:
        out, src = [], 0
        for dst, n in _row_pieces(slot.offset, slot.offset + slot.numel, c, where):
            out.append((src, dst, n))
            src += n
        pieces[id(slot.param)] = out
    pieces["padding"] = _row_pieces(layout.numel, layout.padded_numel, c, where)
    return pieces


class ShardedGroup:
    """named_params: (name, Parameter) of this group, in flat order; every rank passes the same list.
    gather, reduce_scatter: this group's own instances of the forms it communicates with (None: the plain
    ones, zero_comm.py); the group binds them in its constructor, on every rank alike.

    Takes over the parameters: their current values (float32 of them) become the master shard, and
    their .data becomes views into `full` (or empty while sharded). Starts UNSHARDED; free() shards it."""

    def __init__(self, named_params, group, world: int, rank: int, reduction: GradReduction,
                 param_dtype: torch.dtype, reduce_dtype: torch.dtype, master_device: torch.device,
                 gather: ParamGather | None = None, reduce_scatter: GradReduceScatter | None = None):
        self.layout = FlatLayout(named_params, world, rank)
        self._slots = {id(s.param): s for s in self.layout.slots}
        self.group, self.reduction = group, reduction
        self.param_dtype, self.reduce_dtype = param_dtype, reduce_dtype
        params = self.layout.params
        self.compute_device = params[0].device if params else torch.device("cpu")
        flat32 = self.layout.flatten([p.detach() for p in params], torch.float32)
        shard = self.layout.shard(flat32)
        if torch.device(master_device) == self.compute_device == torch.device("cpu") and param_dtype == torch.float32:
            # The all-gather reads it in place (PlainGather): registered, the peers read it directly.
            master = comm.flat_zeros(shard.numel(), torch.float32, master_device, group).copy_(shard)
        else:
            master = shard.to(master_device, copy=True)
        self.master = nn.Parameter(master)
        self.state = ParamState.SHARDED
        self.grad_flat = None
        self._unfilled = set()  # REDUCE_SCATTER: ids of the parameters whose slots in grad_flat hold no value yet
        self._grad_view = None  # ALL_REDUCE: the view of grad_flat handed to master.grad, if any
        self._pending = None  # the reduction in flight: a Work (ALL_REDUCE) or a PendingReduce
        # The module parameters are bound once, as views of `full`. Stage 3 frees `full` by resizing its
        # storage to zero bytes and gathers into the same storage again (as FSDP2 does): views that
        # autograd saved during forward (e.g. weight.t() of a Linear) then see the weights again in
        # backward instead of keeping a freed buffer alive.
        self.full = flat32.to(self.compute_device, param_dtype, copy=True)
        del flat32
        self._full_bytes = self.full.untyped_storage().nbytes()
        for s in self.layout.slots:
            s.param.data = self.layout.view(self.full, s)
        self.state = ParamState.UNSHARDED
        self.gathered_version = self.master._version
        lay = self.layout
        shape = GroupShape(group, lay.world, lay.shard_numel, lay.padded_numel, param_dtype, reduce_dtype,
                           self.compute_device)
        self.gather = gather if gather is not None else PlainGather()
        self.reduce_scatter = reduce_scatter if reduce_scatter is not None else ReduceScatter()
        self.gather.bind(shape)  # collective where a form registers its buffers, like the master
        self.reduce_scatter.bind(shape)
        self.gathers = collections.Counter()  # gathers started, by the source they read (ParamGather.start)
        order = self.reduce_scatter.row_order
        self._grad_pieces = (_arranged_pieces(lay, order)
                             if order is not None and reduction is GradReduction.REDUCE_SCATTER else None)

    def masters_written(self):
        """The masters were written behind their version counter: the next gather reads them."""
        self.gather.forget()

    # ---- parameters ----------------------------------------------------------------------------
    def gather_ahead(self):
        """Lets the gather start ahead of gather_async() what it can (qw across hosts: the cross-host step).
        Stage 3 calls it for every sharded unit at the start of a forward. Every rank of the group calls it
        alike."""
        self.gather.start_early(self.master)

    def gather_async(self):
        """Starts the all-gather of the master shards (as param_dtype) into `full`. Every rank of the
        group must call it, in the same order as its other collectives."""
        storage = self.full.untyped_storage()
        if storage.nbytes() != self._full_bytes:
            storage.resize_(self._full_bytes)
        self.gathers[self.gather.start(self.master, self.full)] += 1
        self.state = ParamState.GATHERING
        self.gathered_version = self.master._version

    def wait_gathered(self):
        """Makes the gathered weights visible through the module parameters (gathers now if no gather
        is in flight)."""
        if self.state is ParamState.SHARDED:
            self.gather_async()
        if self.state is ParamState.GATHERING:
            self._wait_gather()
            self.state = ParamState.UNSHARDED

    def _wait_gather(self):
        self.gather.finish(self.full)
        if self.master._version != self.gathered_version:
            self.gather.forget()
            raise RuntimeError("ZeroDataParallel: a master shard was modified in place while its all-gather was in "
                               "flight (an optimizer step between a forward and its backward?); step the optimizer after "
                               "backward")

    def free(self):
        """Releases the full weights; SHARDED after it (the module parameters must not be read until the next
        gather: forward and backward hooks gather before each use)."""
        if self.state is ParamState.GATHERING:
            self._wait_gather()
        self.full.untyped_storage().resize_(0)
        self.state = ParamState.SHARDED

    # ---- gradients -----------------------------------------------------------------------------
    # [Note: the gradient buffer's zeros]
    # Under REDUCE_SCATTER (stages 2 and 3) grad_flat is allocated afresh for every backward of its group,
    # and the backward then writes every parameter's slot (a parameter without a gradient as zeros). Zeroing
    # the whole buffer first, as torch.zeros does, wrote every byte twice: a memset of the group's size per
    # unit and step (torch's fill kernel fell from 1.2% to 0.7% of a one-host ZeRO-3 run's cpu samples
    # without it; benchmarks/RESULTS.md, "The gradient buffer's zeros"). Only the padding, which no
    # slot covers, is zeroed at allocation; the set _unfilled tracks the slots not yet written, and
    # reduce_async() zeroes whatever is left in it, so a caller that skips a parameter still reduces zeros for
    # it, never stale memory. ALL_REDUCE (stage 1) keeps its buffer across steps and zeroes it once.
    def copy_grad_in(self, p: nn.Parameter, grad: torch.Tensor | None):
        """Puts one parameter's gradient (None: zeros) in grad_flat and drops param.grad."""
        if self.grad_flat is None and self.reduction is GradReduction.ALL_REDUCE:
            # ALL_REDUCE keeps the buffer (replicated gradients); padding stays zero because no slot covers it.
            self.grad_flat = torch.zeros(self.layout.padded_numel, dtype=self.reduce_dtype, device=self.compute_device)
        elif self.grad_flat is None:
            # REDUCE_SCATTER: a fresh buffer every backward, which the slots fill: only the padding is zeroed
            # here, and reduce_async() zeroes any slot that no call filled ([Note: the gradient buffer's zeros]).
            self.grad_flat = torch.empty(self.layout.padded_numel, dtype=self.reduce_dtype, device=self.compute_device)
            for dst, n in self._padding_pieces():
                self.grad_flat[dst:dst + n].zero_()
            self._unfilled = set(self._slots)
        elif self._grad_view is not None:
            # ALL_REDUCE, a backward after the reduction: if master.grad is still this rank's part of the
            # buffer about to be overwritten (no zero_grad since), keep its value apart (finish_reduce
            # adds to it).
            if self._grad_is_view():
                self.master.grad = self.master.grad.clone()
            self._grad_view = None
        if self._grad_pieces is None:
            view = self.layout.view(self.grad_flat, self._slots[id(p)])
            view.copy_(grad) if grad is not None else view.zero_()
        else:  # each piece straight into the row order its reduce-scatter reads (_arranged_pieces)
            flat = grad.reshape(-1) if grad is not None else None
            for src, dst, n in self._grad_pieces[id(p)]:
                piece = self.grad_flat[dst:dst + n]
                piece.copy_(flat[src:src + n]) if flat is not None else piece.zero_()
        self._unfilled.discard(id(p))
        p.grad = None

    def _padding_pieces(self) -> list[tuple[int, int]]:
        """(offset, elements) of grad_flat's padding: the layout's tail, or where the row order puts it."""
        if self._grad_pieces is not None:
            return self._grad_pieces["padding"]
        return [(self.layout.numel, self.layout.padded_numel - self.layout.numel)]

    def _zero_unfilled(self):
        """REDUCE_SCATTER: zeroes the slots of grad_flat that no copy_grad_in filled since it was allocated."""
        for key in list(self._unfilled):
            self.copy_grad_in(self._slots[key].param, None)

    def reduce_async(self):
        """Starts the reduction of grad_flat (average): ALL_REDUCE in place, REDUCE_SCATTER into a
        fresh shard. Every rank of the group must call it, in the same order as its other collectives."""
        if self.reduction is GradReduction.ALL_REDUCE:
            self._pending = comm.all_reduce(self.grad_flat, op=ReduceOp.AVG, group=self.group, async_op=True)
            return
        if self._unfilled:
            self._zero_unfilled()
        self._pending = self.reduce_scatter.start(self.grad_flat, arranged=self._grad_pieces is not None)
        if self._pending.holds_input:
            self.grad_flat = None  # the reduction holds it until it is done with it (release_reduce_buffer)

    def release_reduce_buffer(self) -> bool:
        """Waits until the pending reduction no longer holds a buffer of the group's full size; False where
        only finish_reduce() releases it (PendingReduce.release_input)."""
        if self._pending is None or self.reduction is GradReduction.ALL_REDUCE:
            return False
        return self._pending.release_input()

    def finish_reduce(self):
        """Waits for the reduction and adds this rank's averaged shard into master.grad (float32);
        does nothing when no reduction is pending."""
        if self._pending is None:
            return
        pending = self._pending
        pending.wait()
        self._pending = None
        replicated = self.reduction is GradReduction.ALL_REDUCE
        if replicated:
            shard = self.layout.shard(self.grad_flat)
        else:
            shard = pending.out
            self.grad_flat = None  # REDUCE_SCATTER keeps only the shard
        m = self.master
        if m.grad is None:
            if shard.dtype == torch.float32 and shard.device == m.device:
                # No copy: REDUCE_SCATTER gives a fresh shard, ALL_REDUCE a view of this rank's part of
                # grad_flat (copy_grad_in moves it out before another backward writes the buffer).
                m.grad = shard
                if replicated:
                    self._grad_view = shard
            else:
                m.grad = shard.to(m.device, torch.float32, copy=True)
        else:
            m.grad.add_(shard.to(m.device, torch.float32))

    def _grad_is_view(self) -> bool:
        return self._grad_view is not None and self.master.grad is self._grad_view

    # ---- accounting ----------------------------------------------------------------------------
    def persistent_bytes(self) -> dict:
        """Bytes this group holds now: full weights, gradient buffers, master shard."""
        full = self.full.untyped_storage().nbytes()
        grads = self.grad_flat.numel() * self.grad_flat.element_size() if self.grad_flat is not None else 0
        if self.master.grad is not None and not self._grad_is_view():
            grads += self.master.grad.numel() * 4
        full += self.gather.kept_bytes()
        return {"params": full, "grads": grads, "master": self.master.numel() * 4}
