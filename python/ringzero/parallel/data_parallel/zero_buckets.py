"""ZeRO stages 1 and 2: the module's weights stay gathered between steps in flat buckets; the optimizer
state (1) and also the gradients (2) are sharded. One class per stage, sharing the buckets.

  stage 1 (ReplicatedGradBuckets): each gradient is copied into its bucket as soon as autograd has it;
          a full bucket is all-reduced (ALL_REDUCE) and every rank keeps all gradients.
  stage 2 (ShardedGradBuckets): a bucket's gradients wait in param.grad until the bucket has them all
          (zero_sharding.py's _flatten_grads), then are reduce-scattered (REDUCE_SCATTER): only a shard
          is kept.
After an optimizer step, the changed shards are all-gathered into the buckets before the next forward.
"""
from __future__ import annotations

import torch.nn as nn

from .flat import bucket_params
from .sharded_group import GradReduction
from .zero_sharding import ShardSpec, ZeroSharding


class Buckets(ZeroSharding):
    """Flat buckets of at most cap_bytes (counted in spec.reduce_dtype) over `named` (name, Parameter),
    filled in reverse registration order (roughly the order backward produces gradients); each parameter
    in `own` gets a bucket of its own, in its place in that order."""

    REDUCTION: GradReduction

    def __init__(self, named, spec: ShardSpec, cap_bytes: int, own=()):
        runs, run = [], []  # stretches of parameters between the ones that get their own bucket
        for name, p in reversed(named):
            if any(p is q for q in own):
                runs += [run, [(name, p)]]
                run = []
            else:
                run.append((name, p))
        runs.append(run)
        buckets = [spec.make(b, self.REDUCTION)
                   for r in runs if r for b in bucket_params(r, cap_bytes, lambda p: spec.reduce_dtype)]
        super().__init__(buckets, reduce_order=buckets)

    def gather_params(self, masters_changed: bool):
        """All-gathers every bucket whose master changed since its last gather (all of them when
        masters_changed). Every rank of the group must call it."""
        stale = [g for g in self.groups if masters_changed or g.master._version != g.gathered_version]
        for g in stale:
            g.gather_async()
        for g in stale:
            g.wait_gathered()

    def forward(self, module: nn.Module, args, kwargs):
        return module(*args, **kwargs)  # the caller gathered stale buckets first


class ReplicatedGradBuckets(Buckets):
    """Stage 1: the flat gradient buffer lives across steps, so a gradient is copied in as soon as it is ready."""

    REDUCTION = GradReduction.ALL_REDUCE

    def _on_grad(self, i: int, p: nn.Parameter, group_done: bool):
        self.reduce_order[i].copy_grad_in(p, p.grad)

    def _on_missing(self, i: int, params):
        for p in params:
            self.reduce_order[i].copy_grad_in(p, None)


class ShardedGradBuckets(Buckets):
    """Stage 2: the zero_sharding.py default: gradients flattened once their bucket is complete."""

    REDUCTION = GradReduction.REDUCE_SCATTER
