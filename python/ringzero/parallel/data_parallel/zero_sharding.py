"""The interface between ZeroDataParallel and its sharding (buckets for stages 1-2, units for stage 3),
and the gradient path they share: count gradients, copy them into flat buffers, reduce in a fixed order.

ZeroDataParallel builds one ZeroSharding at construction and delegates to it; it never asks for the
stage again. Subclasses differ in when a gradient is copied into its group's flat buffer and in what
happens around forward (gather stale buckets, or gather and free units).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from .grad_ready import GradReadyTracker
from .sharded_group import GradReduction, ShardedGroup
from .zero_comm import ZeroComm


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """What every flat group of one ZeroDataParallel shares; make() builds one group from it."""

    group: object
    """The process group the shards are spread over (ranks of the data-parallel group)."""
    world: int
    rank: int
    param_dtype: torch.dtype
    """dtype of the gathered weights that forward and backward read."""
    reduce_dtype: torch.dtype
    """dtype the gradients are reduced in."""
    master_device: torch.device
    """Where the float32 master shards (and so the optimizer state) live: the compute device, or the CPU."""
    comm: ZeroComm = ZeroComm()
    """The gather and reduce-scatter forms of every group (zero_comm.py; ZeRO++'s: zeropp.communication)."""

    def make(self, named_params, reduction: GradReduction, repeated: bool = True) -> ShardedGroup:
        """A ShardedGroup of `named_params` (UNSHARDED: the caller frees it if it starts sharded), with fresh
        instances of the chosen forms. repeated=False: a group gathered once per step (stage 3's root), which
        takes the plain gather from the masters (a kept copy such as hpz's secondary would never be read)."""
        return ShardedGroup(named_params, self.group, self.world, self.rank, reduction, self.param_dtype,
                            self.reduce_dtype, self.master_device, self.comm.make_gather(repeated),
                            self.comm.reduce_scatter())


class ZeroSharding:
    """The flat groups of one wrapped module and their backward.

    groups: every ShardedGroup, in the order of parameters() and of checkpoint entries.
    reduce_order: the same groups in the order their reductions launch (the order backward finishes
      them; every rank launches in this order: see grad_ready.py).
    Subclasses implement forward and gather_params and may override the _on_grad/_on_missing/_finish
    callbacks of the GradReadyTracker installed here.
    """

    def __init__(self, groups: list[ShardedGroup], reduce_order: list[ShardedGroup]):
        self.groups, self.reduce_order = groups, reduce_order
        self._pending: list[ShardedGroup] = []  # groups whose reduction is in flight
        self._tracker = GradReadyTracker([g.layout.params for g in reduce_order], self._on_grad, self._launch,
                                         self._on_missing, self._finish)

    # ---- forward (subclasses) --------------------------------------------------------------------
    def gather_params(self, masters_changed: bool):
        """Makes the module's weights current where they live between forwards (buckets); nothing
        where weights are gathered around each use (units). masters_changed: an optimizer step or a
        checkpoint load wrote the master shards (their version counters may not show it)."""
        raise NotImplementedError

    def forward(self, module: nn.Module, args, kwargs):
        """Runs module(*args, **kwargs) with its weights gathered where it needs them."""
        raise NotImplementedError

    # ---- backward ------------------------------------------------------------------------------
    def _on_grad(self, i: int, p: nn.Parameter, group_done: bool):
        """Default (sharded gradients): a group's gradients wait in param.grad until it has them all."""
        if group_done:
            self._flatten_grads(self.reduce_order[i])

    def _on_missing(self, i: int, params):
        self._flatten_grads(self.reduce_order[i])  # the group's other gradients are still waiting in param.grad

    def _flatten_grads(self, g: ShardedGroup):
        """A group's gradients move into its flat buffer only once it has them all. Allocating the buffer
        at the group's first gradient would add a whole unit's gradients at the start of its backward,
        while all activations are still alive (the step's peak); by the group's end its own activations
        are freed. Reductions launched before overlapped with the backward since; finishing them first
        keeps one flat buffer alive at a time (FSDP2 on CPU is as tight: its reductions are inline).
        A reduction that releases its input early is the exception (PendingReduce.release_input; zeropp's
        qg): once its in-host step is done it holds only shard-sized buffers, and its cross-host steps
        (quantize, all-to-all over the link) run on behind this backward until the end of it, or until its
        group's next backward. A parameter without a gradient counts as zeros."""
        self._finish_pending(lambda p: p is g or not p.release_reduce_buffer())
        for q in g.layout.params:
            g.copy_grad_in(q, q.grad)

    def _launch(self, i: int):
        self.reduce_order[i].reduce_async()
        self._pending.append(self.reduce_order[i])

    def _finish_pending(self, which=lambda g: True):
        keep = []
        for g in self._pending:
            if which(g):
                g.finish_reduce()
            else:
                keep.append(g)
        self._pending = keep

    def _finish(self):
        self._finish_pending()
