"""One ZeRO flat group (a bucket for stages 1-2, a unit for stage 3): its float32 master shard, the
gather of full parameters from the shards, and the reduction of gradients into the master shard.
The group knows nothing of stages: its owner (zero_buckets.py, zero_units.py) picks the gradient
reduction at construction and frees the full weights when it wants them sharded.

Buffers (1D = flat, padded to a multiple of the world size; shard = 1/N of it):
  master        1D shard, float32, on master_device: the only copy of the weights that the optimizer steps
                (registered, comm.flat_zeros, where it is the all-gather's input: CPU, float32 parameters)
  master.grad   1D shard, float32: averaged gradient (summed over backward passes until zero_grad)
  full          1D padded, param_dtype: the gathered weights; module parameters are views into it
                (kept between steps in stages 1-2; in stage 3 its storage is resized to 0 bytes when
                freed and back when gathered, around each use)
  grad_flat     1D padded, reduce_dtype: this rank's gradients of the group, input of the reduction
                (kept between steps under ALL_REDUCE, where gradients are replicated; transient under
                REDUCE_SCATTER)
  secondary     zeropp hpz only: 1D padded / ranks-per-host, param_dtype: this rank's chunk of `full` in a
                split over its host's ranks, copied after each gather from the masters; while the masters
                are unchanged, gathers read it over the host instead (zeropp.py)
"""
from __future__ import annotations

import collections
import enum

import torch
import torch.nn as nn

from ... import comm
from ...comm.types import ReduceOp
from . import quantize as qz
from .flat import FlatLayout
from .zeropp import QuantizedReduceScatter, ZeroPP, words


class ParamState(enum.Enum):
    SHARDED = "sharded"        # module parameters are empty; only the master shard exists
    GATHERING = "gathering"    # an async all-gather into `full` is in flight
    UNSHARDED = "unsharded"    # module parameters are views of `full`


class GradReduction(enum.Enum):
    """How a group reduces its gradients; chosen once, when the group is built."""

    ALL_REDUCE = "all_reduce"          # stage 1: grad_flat averaged in place, kept (replicated gradients)
    REDUCE_SCATTER = "reduce_scatter"  # stages 2-3: averaged into a fresh shard; grad_flat dropped


class _FutureWork:
    """A concurrent.futures.Future with the wait() of a collective's work: the future's result is None, or
    (CUDA) an event recorded after its kernels and its device, and the waiter's current stream waits on it
    (the waiting thread may be on another stream than the starting one: autograd's device threads)."""

    def __init__(self, future, host_done=None):
        self.future, self.host_done = future, host_done

    def wait(self):
        done = self.future.result()
        if done is not None:
            event, device = done
            torch.cuda.current_stream(device).wait_event(event)


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
    """qg's gradient buffer holds the shard-sized rows of the flat layout in the order its in-host
    reduce-scatter takes them (HostSplit.gather_rows: physical row i is the layout's row rows[i]), so that
    copy_grad_in writes each gradient where that step reads it, with no rearranged copy of the buffer.
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

    Takes over the parameters: their current values (float32 of them) become the master shard, and
    their .data becomes views into `full` (or empty while sharded). Starts UNSHARDED; free() shards it."""

    def __init__(self, named_params, group, world: int, rank: int, reduction: GradReduction,
                 param_dtype: torch.dtype, reduce_dtype: torch.dtype, master_device: torch.device,
                 zeropp: ZeroPP = ZeroPP(), split=None):
        self.layout = FlatLayout(named_params, world, rank)
        self._slots = {id(s.param): s for s in self.layout.slots}
        self.group, self.reduction = group, reduction
        self.param_dtype, self.reduce_dtype = param_dtype, reduce_dtype
        params = self.layout.params
        self.compute_device = params[0].device if params else torch.device("cpu")
        flat32 = self.layout.flatten([p.detach() for p in params], torch.float32)
        shard = self.layout.shard(flat32)
        if torch.device(master_device) == self.compute_device == torch.device("cpu") and param_dtype == torch.float32:
            # The all-gather reads it in place (gather_async): registered, the peers read it directly.
            master = comm.flat_zeros(shard.numel(), torch.float32, master_device, group).copy_(shard)
        else:
            master = shard.to(master_device, copy=True)
        self.master = nn.Parameter(master)
        self.state = ParamState.SHARDED
        self._gather_work = self._gather_input = None
        self.grad_flat = None
        self._unfilled = set()  # REDUCE_SCATTER: ids of the parameters whose slots in grad_flat hold no value yet
        self._grad_view = None  # ALL_REDUCE: the view of grad_flat handed to master.grad, if any
        self._reduce_work = self._reduce_out = None
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
        self._init_zeropp(zeropp, split)

    def _init_zeropp(self, zeropp: ZeroPP, split):
        """zeropp's buffers (zeropp.py); collective where they are registered, like the master."""
        lay, cpu = self.layout, self.compute_device.type == "cpu"
        self.zeropp, self.split = zeropp, split
        self._gather_kind = None
        self.gathers = collections.Counter()  # gathers started, by source: master, qw, secondary
        self.qw_fused = 0  # qw gathers whose host step dequantized straight from the peers (HostSplit.gather_dequantize)
        self.secondary = None
        self._secondary_version = None  # master._version the secondary was taken at; None: not valid
        several = split is not None and split.several_hosts
        if zeropp.hpz and several:
            n = lay.padded_numel // split.local_world
            self.secondary = (comm.flat_zeros(n, self.param_dtype, self.compute_device, split.host_group) if cpu
                              else torch.zeros(n, dtype=self.param_dtype, device=self.compute_device))
        self._qw_bytes = qz.packed_bytes(lay.shard_numel, 8, zeropp.block) if zeropp.qw else 0
        self._qw_send = self._qw_cross = self._qw_recv = None
        self._qw_early = None  # (work, master version): step 1 of a qw gather started by start_qw_cross()
        if zeropp.qw and several:
            # Across hosts in two steps, each over its subgroup: the cross-host group's shards (one per host),
            # then the host's (registered: read where it lies). The world's all-gather would take its flat
            # ring below the pipelined sizes (3/4 of the bytes across 2 hosts x 2 ranks instead of 1/2).
            self._qw_send = torch.empty(self._qw_bytes, dtype=torch.uint8, device=self.compute_device)
            self._qw_cross = comm.flat_zeros(split.num_hosts * self._qw_bytes, torch.uint8, self.compute_device,
                                             split.host_group)
        elif zeropp.qw:
            self._qw_send = comm.flat_zeros(self._qw_bytes, torch.uint8, self.compute_device, self.group)
        self._qg = None
        self._qg_pieces = None
        if zeropp.qg_bits and several and self.reduction is GradReduction.REDUCE_SCATTER:
            self._qg = QuantizedReduceScatter(split, lay.shard_numel, lay.world, zeropp.qg_bits, zeropp.block,
                                              zeropp.error_feedback, self.compute_device)
            self._qg_pieces = _arranged_pieces(lay, split.gather_rows.tolist())

    def secondary_valid(self) -> bool:
        """hpz: the secondary holds the weights of the current masters."""
        return self.secondary is not None and self._secondary_version == self.master._version

    def drop_secondary(self):
        """The masters were written behind their version counter: the next gather reads them."""
        self._secondary_version = None

    # ---- parameters ----------------------------------------------------------------------------
    def start_qw_cross(self):
        """qw across hosts: quantizes the master and starts the gather's cross-host step now, ahead of
        gather_async() (which then does the rest). Stage 3 calls it for every unit at the start of a
        forward: the int8 buffers it fills are kept anyway, so the link carries every unit's weights
        back to back while the host steps and the compute of the first units run. Nothing when the gather
        would not read the masters (hpz's secondary is valid) or a step 1 is already in flight."""
        if self._qw_cross is None or self._qw_early is not None or self.secondary_valid():
            return
        qz.quantize(self.master.detach().to(self.compute_device), 8, self.zeropp.block, out=self._qw_send)
        self._qw_early = (comm.all_gather_single(words(self._qw_cross), words(self._qw_send),
                                                 group=self.split.cross_group, async_op=True), self.master._version)

    def _qw_step1(self, master):
        """The gather's cross-host step: the one start_qw_cross() began if it holds the current masters."""
        if self._qw_early is not None:
            work, version = self._qw_early
            self._qw_early = None
            if version == self.master._version:
                return work
            work.wait()  # stale: the masters changed since; its buffers are reused below
        qz.quantize(master.to(self.compute_device), 8, self.zeropp.block, out=self._qw_send)
        return comm.all_gather_single(words(self._qw_cross), words(self._qw_send), group=self.split.cross_group,
                                      async_op=True)

    def gather_async(self):
        """Starts the all-gather of the master shards (as param_dtype) into `full`. Every rank of the
        group must call it, in the same order as its other collectives."""
        master = self.master.detach()
        storage = self.full.untyped_storage()
        if storage.nbytes() != self._full_bytes:
            storage.resize_(self._full_bytes)
        self._gather_input = None
        if self.secondary_valid():  # hpz: over the host only, from the weights the masters last gave
            self._gather_kind = "secondary"
            self._gather_work = comm.all_gather_single(self.full, self.secondary, group=self.split.host_group,
                                                       async_op=True)
        elif self._qw_send is not None:  # qw: int8 blocks of the float32 master, dequantized at the wait
            self._gather_kind = "qw"
            if self._qw_cross is not None:  # step 1 of 2 (the host's step at the wait)
                self._gather_work = self._qw_step1(master)
            else:
                self._qw_recv = torch.empty(self.layout.world * self._qw_bytes, dtype=torch.uint8,
                                            device=self.compute_device)
                qz.quantize(master.to(self.compute_device), 8, self.zeropp.block, out=self._qw_send)
                self._gather_work = comm.all_gather_single(words(self._qw_recv), words(self._qw_send), group=self.group,
                                                           async_op=True)
        else:
            self._gather_kind = "master"
            if master.dtype == self.param_dtype and master.device == self.compute_device:
                # Read in place (no copy of the shard while the gather is in flight): nothing writes the
                # master between here and the wait, which checks that.
                self._gather_input = master
            else:
                self._gather_input = master.to(self.compute_device, self.param_dtype, copy=True)
            self._gather_work = comm.all_gather_single(self.full, self._gather_input, group=self.group, async_op=True)
        self.gathers[self._gather_kind] += 1
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
        self._gather_work.wait()
        self._gather_work = self._gather_input = None
        lay, kind = self.layout, self._gather_kind
        if kind == "qw":
            rows = self.full.view(lay.world, lay.shard_numel)
            order = None
            if self._qw_cross is not None:  # step 2: the host's, dequantizing straight from the peers' rows
                H = self.split.num_hosts
                if self.split.gather_dequantize(self._qw_cross.view(H, self._qw_bytes), rows, lay.shard_numel, 8,
                                                self.zeropp.block):
                    kind = "qw-fused"
                    self.qw_fused += 1
                else:  # not registered: gathered, then dequantized; rows in HostSplit.gathered_order's order
                    self._qw_recv = torch.empty(lay.world * self._qw_bytes, dtype=torch.uint8, device=self.compute_device)
                    comm.all_gather_single(words(self._qw_recv), words(self._qw_cross), group=self.split.host_group)
                    order = self.split.gathered_order
        if kind == "qw":
            packed = self._qw_recv.view(lay.world, self._qw_bytes)
            if order is None:
                qz.dequantize(packed, lay.shard_numel, 8, self.zeropp.block, out=rows)
            else:  # each row straight into its place
                for j, r in enumerate(order.tolist()):
                    qz.dequantize(packed[j], lay.shard_numel, 8, self.zeropp.block, out=rows[r])
            self._qw_recv = None
        if self.secondary is not None and kind != "secondary":
            n, i = self.secondary.numel(), self.split.host_position
            self.secondary.copy_(self.full[i * n:(i + 1) * n])
            self._secondary_version = self.gathered_version
        if self.master._version != self.gathered_version:
            self._secondary_version = None
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
        if self._qg_pieces is None:
            view = self.layout.view(self.grad_flat, self._slots[id(p)])
            view.copy_(grad) if grad is not None else view.zero_()
        else:  # qg: each piece straight into the row order its in-host step reduces (_arranged_pieces)
            flat = grad.reshape(-1) if grad is not None else None
            for src, dst, n in self._qg_pieces[id(p)]:
                piece = self.grad_flat[dst:dst + n]
                piece.copy_(flat[src:src + n]) if flat is not None else piece.zero_()
        self._unfilled.discard(id(p))
        p.grad = None

    def _padding_pieces(self) -> list[tuple[int, int]]:
        """(offset, elements) of grad_flat's padding: the layout's tail, or where qg's row order puts it."""
        if self._qg_pieces is not None:
            return self._qg_pieces["padding"]
        return [(self.layout.numel, self.layout.padded_numel - self.layout.numel)]

    def _zero_unfilled(self):
        """REDUCE_SCATTER: zeroes the slots of grad_flat that no copy_grad_in filled since it was allocated."""
        for key in list(self._unfilled):
            self.copy_grad_in(self._slots[key].param, None)

    def reduce_async(self):
        """Starts the reduction of grad_flat (average): ALL_REDUCE in place, REDUCE_SCATTER into a
        fresh shard. Every rank of the group must call it, in the same order as its other collectives."""
        if self.reduction is GradReduction.ALL_REDUCE:
            self._reduce_work = comm.all_reduce(self.grad_flat, op=ReduceOp.AVG, group=self.group, async_op=True)
            return
        if self._unfilled:
            self._zero_unfilled()
        if self._qg is not None:  # qg: in the host in full precision, across hosts quantized (zeropp.py)
            self._reduce_out = torch.empty(self.layout.shard_numel, dtype=torch.float32, device=self.compute_device)
            self._reduce_work = _FutureWork(*self._qg.start(self.grad_flat, self._reduce_out,
                                                            arranged=self._qg_pieces is not None))
            self.grad_flat = None  # the in-host step holds it until it is done (release_reduce_buffer)
        else:
            self._reduce_out = torch.empty(self.layout.shard_numel, dtype=self.reduce_dtype, device=self.compute_device)
            self._reduce_work = comm.reduce_scatter_single(self._reduce_out, self.grad_flat, op=ReduceOp.AVG,
                                                           group=self.group, async_op=True)

    def release_reduce_buffer(self) -> bool:
        """Waits until the pending reduction no longer holds a buffer of the group's full size; False where
        only finish_reduce() releases it. qg: its in-host step (which reads grad_flat)."""
        if self._qg is None or self._reduce_work is None:
            return False
        # Bounded: a wait past the group's timeout leaves it to finish_reduce, which raises the step's error.
        return self._reduce_work.host_done.wait(self.split.timeout_s)

    def finish_reduce(self):
        """Waits for the reduction and adds this rank's averaged shard into master.grad (float32);
        does nothing when no reduction is pending."""
        if self._reduce_work is None:
            return
        self._reduce_work.wait()
        self._reduce_work = None
        replicated = self.reduction is GradReduction.ALL_REDUCE
        if replicated:
            shard = self.layout.shard(self.grad_flat)
        else:
            shard, self._reduce_out = self._reduce_out, None
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
        if self.secondary is not None:
            full += self.secondary.numel() * self.secondary.element_size()
        return {"params": full, "grads": grads, "master": self.master.numel() * 4}
