"""ZeRO++'s parameter gathers (zeropp.py has the options and the reasons): hpz's in-host secondary around
another gather, and qw's gather of block-quantized int8 masters, over one host or across hosts in two steps.
Each is a ParamGather (zero_comm.py) that ShardedGroup is handed; zeropp.communication() picks them.

Buffers (1D; shard = the group's shard_numel; packed = quantize.packed_bytes(shard, 8, block) bytes):
  secondary  hpz: padded_numel / ranks-per-host, param_dtype: this rank's chunk of `full` in a split over its
             host's ranks, copied after each gather from the masters; while the masters are unchanged, gathers
             read it over the host instead
  send       qw: packed, uint8: this rank's quantized master (registered where the host's ranks read it)
  cross      qw across hosts: num_hosts * packed, uint8, registered with the host group: the cross-host
             group's quantized masters (step 1), which the host's ranks read in step 2
  recv       qw: world * packed, uint8: every rank's quantized master, where step 2 cannot read in place
"""
from __future__ import annotations

import torch

from ... import comm
from . import quantize as qz
from .quantize import words
from .zero_comm import GroupShape, ParamGather

WEIGHT_BITS = 8
"""qw quantizes the weights to int8 (ZeRO++'s qwZ); int4 weights lost too much in its paper."""


class SecondaryGather(ParamGather):
    """hpz around `inner`: after a gather from the masters, keeps this rank's chunk of the full weights in a
    secondary split over the host's ranks; while the masters are unchanged (their version counter), the next
    gathers read the secondaries over the host group only and never cross hosts."""

    def __init__(self, inner: ParamGather, split):
        self.inner, self.split = inner, split
        self.secondary = None
        self._version = None  # master._version the secondary was taken at; None: not valid
        self._taken_at = None  # master._version of the gather in flight, from the masters
        self._work = None  # the gather in flight from the secondaries, if it is one

    def bind(self, shape: GroupShape):
        super().bind(shape)
        n = shape.padded_numel // self.split.local_world
        # Registered on CPU: the host's all-gather reads each secondary where it lies.
        self.secondary = (comm.flat_zeros(n, shape.param_dtype, shape.device, self.split.host_group)
                          if shape.device.type == "cpu" else torch.zeros(n, dtype=shape.param_dtype, device=shape.device))
        self.inner.bind(shape)

    def valid(self, master) -> bool:
        """The secondary holds the weights of the current masters."""
        return self._version == master._version

    def start(self, master, full):
        if self.valid(master):  # over the host only, from the weights the masters last gave
            self._work = comm.all_gather_single(full, self.secondary, group=self.split.host_group, async_op=True)
            return "secondary"
        self._taken_at = master._version
        return self.inner.start(master, full)

    def finish(self, full):
        if self._work is not None:
            self._work.wait()
            self._work = None
            return
        self.inner.finish(full)
        n, i = self.secondary.numel(), self.split.host_position
        self.secondary.copy_(full[i * n:(i + 1) * n])
        self._version = self._taken_at

    def start_early(self, master):
        if not self.valid(master):  # a gather from the secondary has nothing to start early
            self.inner.start_early(master)

    def forget(self):
        self._version = None
        self.inner.forget()

    def kept_bytes(self) -> int:
        return self.secondary.numel() * self.secondary.element_size() + self.inner.kept_bytes()

    def parts(self):
        yield self
        yield from self.inner.parts()


class QuantizedGather(ParamGather):
    """qw over the group in one step: every rank's master quantized to int8 blocks (a float32 scale per
    `block` values), all-gathered as int32 words, and dequantized into `full` at finish(). The masters stay
    float32; every rank reads the same dequantized weights. `fused` counts the gathers whose dequantization
    read the peers' rows where they lie (QuantizedGatherAcrossHosts)."""

    def __init__(self, block: int):
        self.block = block
        self.fused = 0
        self._work = self._recv = None

    def bind(self, shape: GroupShape):
        super().bind(shape)
        self.packed = qz.packed_bytes(shape.shard_numel, WEIGHT_BITS, self.block)
        self._make_buffers(shape)

    def _make_buffers(self, shape: GroupShape):
        self.send = comm.flat_zeros(self.packed, torch.uint8, shape.device, shape.group)

    def _quantize(self, master):
        qz.quantize(master.detach().to(self.shape.device), WEIGHT_BITS, self.block, out=self.send)

    def start(self, master, full):
        s = self.shape
        self._recv = torch.empty(s.world * self.packed, dtype=torch.uint8, device=s.device)
        self._quantize(master)
        self._work = comm.all_gather_single(words(self._recv), words(self.send), group=s.group, async_op=True)
        return "qw"

    def finish(self, full):
        self._work.wait()
        self._work = None
        self._dequantize(full, None)

    def _dequantize(self, full, order):
        """recv's rows into `full`: row j of recv is group rank order[j]'s (None: rank j's)."""
        s = self.shape
        rows, packed = full.view(s.world, s.shard_numel), self._recv.view(s.world, self.packed)
        if order is None:
            qz.dequantize(packed, s.shard_numel, WEIGHT_BITS, self.block, out=rows)
        else:  # each row straight into its place
            for j, r in enumerate(order.tolist()):
                qz.dequantize(packed[j], s.shard_numel, WEIGHT_BITS, self.block, out=rows[r])
        self._recv = None


class QuantizedGatherAcrossHosts(QuantizedGather):
    """qw across hosts, in two steps, each over its subgroup: the cross-host group's quantized masters (one
    per host), then the host's, whose rows are dequantized straight from the peers' registered buffers
    (comm.all_gather_dequantize). The world's all-gather would take its flat ring below the pipelined sizes
    (3/4 of the bytes across 2 hosts x 2 ranks instead of 1/2). Step 1 may start early (start_early): stage 3
    starts it for every unit at the start of a forward, so the link carries every unit's weights back to back
    while the host steps and the compute of the first units run."""

    def __init__(self, block: int, split):
        super().__init__(block)
        self.split = split
        self._early = None  # (work, master version): a step 1 started by start_early()

    def _make_buffers(self, shape: GroupShape):
        self.send = torch.empty(self.packed, dtype=torch.uint8, device=shape.device)
        self.cross = comm.flat_zeros(self.split.num_hosts * self.packed, torch.uint8, shape.device,
                                     self.split.host_group)

    def _step1(self, master):
        self._quantize(master)
        return comm.all_gather_single(words(self.cross), words(self.send), group=self.split.cross_group,
                                      async_op=True)

    def start_early(self, master):
        if self._early is None:
            self._early = (self._step1(master), master._version)

    def start(self, master, full):
        self._work = None
        if self._early is not None:
            work, version = self._early
            self._early = None
            if version == master._version:
                self._work = work
            else:
                work.wait()  # stale: the masters changed since; its buffers are reused below
        if self._work is None:
            self._work = self._step1(master)
        return "qw"

    def finish(self, full):
        self._work.wait()
        self._work = None
        s, split = self.shape, self.split
        rows = full.view(s.world, s.shard_numel)
        if split.gather_dequantize(self.cross.view(split.num_hosts, self.packed), rows, s.shard_numel, WEIGHT_BITS,
                                   self.block):
            self.fused += 1
            return
        # Not registered: gathered, then dequantized; rows in HostSplit.gathered_order's order.
        self._recv = torch.empty(s.world * self.packed, dtype=torch.uint8, device=s.device)
        comm.all_gather_single(words(self._recv), words(self.cross), group=split.host_group)
        self._dequantize(full, split.gathered_order)
