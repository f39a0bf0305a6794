"""ZeRO data parallelism (stages 1, 2 and 3) on ringzero's collectives.

The wrapper owns float32 master shards (one flat shard per bucket or unit, 1/N of it per rank) and
exposes only them through parameters(), so any torch optimizer built on model.parameters() steps just
this rank's shard. The training loop stays:

    loss = lm_loss(model(x), y); loss.backward(); model.clip_grad_norm_(1.0); opt.step(); opt.zero_grad()

  stage 1: gradients all-reduced bucket by bucket during backward (each rank keeps them all);
           the optimizer state is sharded; updated shards are all-gathered into the module's
           parameters before the next forward.
  stage 2: gradients reduce-scattered bucket by bucket during backward: only a shard is kept.
  stage 3: parameters sharded too; each unit is gathered just before its forward and its backward
           (the next one prefetched while the current one computes) and freed right after.

This file holds the wrapper (arguments, the optimizer-facing side) and decides the stage once, at
construction: it builds a ZeroSharding (zero_sharding.py): the buckets of zero_buckets.py for stages
1-2 or the units of zero_units.py for stage 3, and delegates forward and backward to it.
"""
from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from .clip import clip_grad_norm_
from .ddp import broadcast_module_state, check_bucket_cap, resolve_group
from .sharded_group import ShardedGroup
from .zero_buckets import ReplicatedGradBuckets, ShardedGradBuckets
from .zero_sharding import ShardSpec, ZeroSharding
from .zero_units import ShardedUnits
from .zeropp import HostSplit, communication
from .zeropp import parse as zeropp_parse

_LIVE: "weakref.WeakSet[ZeroDataParallel]" = weakref.WeakSet()


def _mark_stepped(optimizer, args, kwargs):
    # Any optimizer step that touched our master shards makes the gathered weights stale (the next
    # forward gathers them); this also covers optimizers whose kernels write memory without bumping
    # tensor version counters.
    if not _LIVE:  # the hook is global (every optimizer of the process): cost nothing without ZeRO
        return
    ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for model in list(_LIVE):
        if any(id(g.master) in ids for g in model.groups):
            model.masters_written()


register_optimizer_step_post_hook(_mark_stepped)


def _check_dtype(value, arg: str, allow_none: bool):
    if value is None and allow_none:
        return
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise TypeError(f"ZeroDataParallel: {arg} must be a floating torch.dtype{' or None' if allow_none else ''}, "
                        f"got {value!r}")


class ZeroDataParallel(nn.Module):
    """Wraps `module` for ZeRO data parallelism over `process_group` (default: the world).

    Every rank of the group must wrap a module of the same structure (rank 0's values are broadcast).
    stage: 1, 2 or 3 (see the module docstring).
    param_dtype: dtype of the module's parameters during forward/backward (e.g. torch.bfloat16);
      None keeps float32. Masters and optimizer state are float32 whatever it is.
    reduce_dtype: dtype gradients are reduced in (float32 by default).
    bucket_cap_mb: size of the flat buckets of stages 1-2 (counted in reduce_dtype).
    unit: stage 3 only: a module class (every outermost submodule of that class is a unit) or a list
      of submodules; the parameters outside every unit form the root group, gathered for the whole
      forward and backward. None: the whole module is one root group.
    prefetch: stage 3: gather the next unit while the current one computes.
    reshard_after_forward: stage 3: free each unit after its forward (gathered again for backward).
    offload_optimizer: keep master shards (and so the optimizer state) in CPU memory (ZeRO-Offload);
      step them with a CPU optimizer (ringzero.optim.FusedAdamW runs its fused CPU kernel on them).
    own_bucket: stages 1-2: parameters that each get a bucket of their own, so that its flat layout, and
      which of its elements a rank's shard holds, depend on the parameter alone: a weight that two
      modules on different ranks share (an embedding tied to the LM head on the first and the last
      pipeline stage) then has the same shard on both, and group_of(p).master.grad can be exchanged.
    zeropp: stage 3 across hosts: ZeRO++'s options (zeropp.py), names as 'hpz,qw,qg' or a list: hpz (a
      secondary shard of the weights in each host: backward's all-gather stays in the host), qw (the
      weights' all-gather in block-quantized int8), qg / qg4 / qg8 (gradients reduced across hosts from
      int4 / int8 partial sums), ef (error feedback for qg). CPU or CUDA modules (CUDA: not yet run on a GPU).
    find_unused_parameters is implied: a parameter that gets no gradient contributes zeros (as in
    DeepSpeed and FSDP's flat parameters), so weight decay still applies to it.
    """

    def __init__(self, module: nn.Module, stage: int = 2, process_group=None, param_dtype=None,
                 reduce_dtype=torch.float32, bucket_cap_mb: float = 25, unit=None, prefetch: bool = True,
                 reshard_after_forward: bool = True, offload_optimizer: bool = False, own_bucket=(), zeropp=None):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"ZeroDataParallel: module must be an nn.Module, got {type(module).__name__}")
        if stage not in (1, 2, 3) or isinstance(stage, bool):
            raise ValueError(f"ZeroDataParallel: stage must be 1, 2 or 3, got {stage!r}")
        _check_dtype(param_dtype, "param_dtype", allow_none=True)
        _check_dtype(reduce_dtype, "reduce_dtype", allow_none=False)
        if unit is not None and stage != 3:
            raise ValueError(f"ZeroDataParallel: unit= applies to stage 3 only (got stage={stage}); drop unit or use stage=3")
        own_bucket = list(own_bucket)
        if own_bucket and stage == 3:
            raise ValueError("ZeroDataParallel: own_bucket= applies to stages 1-2 (stage 3 shards by unit); drop it "
                             "or use stage 1 or 2")
        if not all(any(p is q for q in module.parameters()) for p in own_bucket):
            raise ValueError("ZeroDataParallel: every own_bucket parameter must be a parameter of module")
        cap_bytes = check_bucket_cap(bucket_cap_mb) if stage < 3 else None
        self.zeropp = zeropp_parse(zeropp, "ZeroDataParallel: zeropp")
        if self.zeropp.any and stage != 3:
            raise ValueError(f"ZeroDataParallel: zeropp={self.zeropp.names()!r} applies to stage 3 only (got stage={stage}); "
                             "drop zeropp or use stage=3")
        self.module = module
        self.stage = stage
        self.group = resolve_group(process_group, "ZeroDataParallel")
        self.world, self.rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        self.param_dtype = param_dtype or torch.float32
        self.reduce_dtype = reduce_dtype
        self.offload_optimizer = bool(offload_optimizer)
        broadcast_module_state(module, self.group)

        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        compute_device = named[0][1].device if named else torch.device("cpu")
        if self.zeropp.any and compute_device.type not in ("cpu", "cuda"):
            raise ValueError(f"ZeroDataParallel: zeropp={self.zeropp.names()!r} runs on CPU and CUDA modules (this one "
                             f"is on {compute_device}); drop zeropp or move the module")
        self.split = HostSplit(self.group) if self.zeropp.any else None
        # The one place the communication forms are chosen: every group gets its own instances of them.
        spec = ShardSpec(self.group, self.world, self.rank, self.param_dtype, reduce_dtype,
                         torch.device("cpu") if offload_optimizer else compute_device,
                         communication(self.zeropp, self.split))
        # The one place the stage is read: the sharding built here does the rest.
        self.sharding: ZeroSharding
        if stage == 3:
            self.sharding = ShardedUnits(module, named, spec, unit, bool(prefetch), bool(reshard_after_forward))
        else:
            self.sharding = (ReplicatedGradBuckets if stage == 1 else ShardedGradBuckets)(named, spec, cap_bytes,
                                                                                          own_bucket)
        self._stale = False  # the masters were written behind their version counters (optimizer step, load)
        _LIVE.add(self)

    @property
    def groups(self) -> list[ShardedGroup]:
        """Every flat group (bucket or unit), in the order of parameters() and of checkpoint entries."""
        return self.sharding.groups

    def group_of(self, param: nn.Parameter) -> ShardedGroup:
        """The flat group holding `param` (a parameter of the wrapped module); ValueError if none does."""
        for g in self.groups:
            if any(p is param for p in g.layout.params):
                return g
        raise ValueError("ZeroDataParallel.group_of: param is not a parameter of the wrapped module")

    # ---- parameters seen by the optimizer ------------------------------------------------------
    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        """Only this rank's float32 master shards (1-D), one per bucket or unit: what the optimizer steps."""
        for i, g in enumerate(self.groups):
            yield (f"{prefix}." if prefix else "") + f"flat_shard.{i}", g.master

    def state_dict(self, *args, **kwargs):
        raise RuntimeError("ZeroDataParallel holds sharded weights: save with ringzero.checkpoint.save(path, model, "
                           "optimizer, step) and get a full state_dict with ringzero.checkpoint.consolidate(path)")

    # ---- forward -------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        """The wrapped module's forward. Every rank of the group must call it (it gathers weights)."""
        self.gather_params()
        return self.sharding.forward(self.module, args, kwargs)

    def gather_params(self):
        """Stages 1-2: all-gathers every shard that changed since the last gather into the module's
        parameters (called by forward; call it before using self.module directly after a step).
        Stage 3: nothing (each unit is gathered around its use). Every rank of the group must call it."""
        self.sharding.gather_params(masters_changed=self._stale)
        self._stale = False

    def masters_written(self):
        """Says that the master shards were written behind their version counters (a checkpoint load, an
        optimizer that writes .data): the next gather_params gathers every one of them."""
        self._stale = True
        for g in self.groups:
            g.masters_written()

    # ---- optimizer-side helpers ----------------------------------------------------------------
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Scales every rank's gradient shards so that the global 2-norm is at most max_norm, with one
        all-reduce of a float64 scalar; returns the norm before clipping (float32, same on every rank).
        Every rank of the group must call it."""
        if norm_type != 2.0:
            raise ValueError(f"ZeroDataParallel.clip_grad_norm_: only norm_type=2.0 is supported, got {norm_type}")
        return clip_grad_norm_([g.master.grad for g in self.groups], max_norm, group=self.group)

    def memory_bytes(self, optimizer: torch.optim.Optimizer | None = None) -> dict:
        """Bytes held now by this rank: params (gathered weights), grads (gradient buffers and shards),
        master (float32 shards) and optimizer (state tensors of the masters in `optimizer`)."""
        total = {"params": 0, "grads": 0, "master": 0, "optimizer": 0}
        for g in self.groups:
            for k, v in g.persistent_bytes().items():
                total[k] += v
            if optimizer is not None:
                for v in optimizer.state.get(g.master, {}).values():
                    if isinstance(v, torch.Tensor) and v.dim() > 0:
                        total["optimizer"] += v.numel() * v.element_size()
        return total


def zero_memory_formula(stage: int, numel: int, world: int, param_bytes: int = 2, grad_bytes: int = 2) -> int:
    """The ZeRO paper's bytes per rank for params + grads + optimizer state of `numel` parameters with
    Adam in mixed precision (K = 12: float32 master, exp_avg, exp_avg_sq): stage 1: 4P + 12P/N,
    stage 2: 2P + 14P/N, stage 3: 16P/N (with 2-byte params and grads; pass other sizes to adapt)."""
    p, n, k = numel, world, 12
    if stage == 1:
        return (param_bytes + grad_bytes) * p + k * p // n
    if stage == 2:
        return param_bytes * p + (grad_bytes + k) * p // n
    if stage == 3:
        return (param_bytes + grad_bytes + k) * p // n
    raise ValueError(f"stage must be 1, 2 or 3, got {stage!r}")
