"""Data parallelism around an expert-parallel model: ringzero's DDP or ZeRO-1/2 over the replicated
(non-expert) parameters, and a separate gradient rule for the experts.

[Note: expert gradients under data parallelism]
Every rank of the data-parallel group `dp` (D ranks) sees its own batch, and the step follows the mean
of their losses. The replicated parameters' gradients are averaged over dp by the wrapper (DDP or ZeRO).
An expert lives on one rank of each ep group (P ranks) and on each of the D / P ranks of its `edp`
group (the ranks holding the same experts). Its owner's gradient after backward is already the sum over
its ep group of every rank's loss (the combine all-to-all brought every copy's gradient back), so
averaging it over ep would be wrong (the ranks hold different experts). The mean over dp is:
scale by 1/P as each gradient arrives (a tensor hook, so that gradients accumulated over several
backward passes are each scaled once), then average over edp at the end of backward (nothing to do when
edp has one rank, pure expert parallelism).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from ... import comm
from ...comm.types import ReduceOp
from ..data_parallel.clip import clip_grad_norm_
from ..data_parallel.ddp import DistributedDataParallel, broadcast_module_state
from ..data_parallel.grad_ready import GradReadyTracker
from ..data_parallel.zero import ZeroDataParallel
from .layer import ExpertParallelMoE


def expert_holders(model: nn.Module) -> list[tuple[nn.Module, list[nn.Parameter]]]:
    """(module, its expert parameters) for each module of `model` that holds this rank's experts of an ep
    group: an ExpertParallelMoE (the parameters of its `experts`), or a module marked with the class
    attribute `holds_expert_shard = True`, all of whose parameters are experts and which has `ep_size`
    (parallel/hf/hf_expert.py's ExpertParallelHFExperts). In module order."""
    found = []
    for m in model.modules():
        if isinstance(m, ExpertParallelMoE):
            found.append((m, list(m.experts.parameters())))
        elif getattr(m, "holds_expert_shard", False):
            found.append((m, list(m.parameters())))
    return found


def split_expert_parameters(model: nn.Module) -> tuple[list, list]:
    """(expert, other): the (name, parameter) pairs of `model` that are experts of its expert-parallel
    layers (expert_holders: distinct on each rank of an ep group) and all the others (replicated), each in
    registration order."""
    expert_ids = {id(p) for _, params in expert_holders(model) for p in params}
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [(n, p) for n, p in named if id(p) in expert_ids], [(n, p) for n, p in named if id(p) not in expert_ids]


class _Holder(nn.Module):
    """Some of a model's parameters as a module of their own (names with '.' -> '__'), whose forward runs
    the whole model: what the DDP/ZeRO wrappers wrap, so that they see only the replicated parameters."""

    def __init__(self, model: nn.Module, named):
        super().__init__()
        self.__dict__["whole"] = model  # not a submodule: its expert parameters must stay out of this one
        for n, p in named:
            self.register_parameter(n.replace(".", "__"), p)

    def forward(self, *args, **kwargs):
        return self.whole(*args, **kwargs)


class ExpertDataParallel(nn.Module):
    """Wraps `model`, whose MoE layers are already expert parallel (expert_parallel(model, ep_group), or for a
    Hugging Face MoE model parallelize(model, mesh, plan="ep")), for data parallelism: see [Note: expert
    gradients under data parallelism].

    dp_group: every rank that holds the replicated parameters and sees its own data (None: the default
      group); with a Mesh(ep=P): mesh.group("dp"). Its size must be P times that of expert_dp_group.
    expert_dp_group: the ranks holding the same experts (mesh.group("edp")); None: every expert lives once
      (pure expert parallelism: dp is the ep group).
    wrap: builds the wrapper of the replicated parameters, called as wrap(module, process_group=dp_group):
      DistributedDataParallel (default), or functools.partial(ZeroDataParallel, stage=1 or 2, ...).
    Every rank of dp_group must wrap; rank 0's replicated parameters (of dp) and experts (of edp) are
    broadcast. forward() is the model's (ZeRO gathers its shards first); after loss.backward() every
    gradient is that of the mean loss over dp. parameters() is what the optimizer steps: the wrapper's
    (DDP: the replicated parameters; ZeRO: this rank's master shards) and this rank's experts.
    """

    def __init__(self, model: nn.Module, dp_group=None, expert_dp_group=None, wrap=DistributedDataParallel):
        super().__init__()
        layers = [m for m, _ in expert_holders(model)]
        if not layers:
            raise ValueError("ExpertDataParallel: the model has no ExpertParallelMoE layer; call "
                             "expert_parallel(model, ep_group) first (a Hugging Face MoE model: "
                             "parallelize(model, mesh, plan='ep'))")
        self.ep_size = layers[0].ep_size
        if any(m.ep_size != self.ep_size for m in layers):
            raise ValueError(f"ExpertDataParallel: every MoE layer must use one ep group size, got "
                             f"{sorted({m.ep_size for m in layers})}")
        self.dp_group = dist.group.WORLD if dp_group is None else dp_group
        self.expert_dp_group = expert_dp_group
        dp_size = dist.get_world_size(self.dp_group)
        self.edp_size = 1 if expert_dp_group is None else dist.get_world_size(expert_dp_group)
        if dp_size != self.ep_size * self.edp_size:
            raise ValueError(f"ExpertDataParallel: the dp group ({dp_size} ranks) must be ep x edp = {self.ep_size} x "
                             f"{self.edp_size} ranks (rank {dist.get_rank(self.dp_group)} of dp)")
        self.module = model
        expert, other = split_expert_parameters(model)
        self.expert_params = [p for _, p in expert]
        self.expert_names = [n for n, _ in expert]
        self.dense = wrap(_Holder(model, other), process_group=self.dp_group)
        # Decided once: ZeRO's gradients are shards (each counted once), DDP's are replicated over dp.
        self._dense_is_sharded = isinstance(self.dense, ZeroDataParallel)
        if expert_dp_group is not None:
            broadcast_module_state(_Holder(model, expert), expert_dp_group)
        scale = 1.0 / self.ep_size
        self._hooks = [p.register_hook(lambda g: g * scale) for p in self.expert_params] if self.ep_size > 1 else []
        self._tracker = None
        if self.edp_size > 1:
            self._tracker = GradReadyTracker([self.expert_params], lambda *a: None, lambda g: None,
                                             lambda g, ps: None, self._average_experts)

    def forward(self, *args, **kwargs):
        """The model's forward through the wrapper (ZeRO gathers stale shards). Every rank of dp calls it."""
        return self.dense(*args, **kwargs)

    def _average_experts(self):
        """End of backward: average the experts' gradients over edp in one flat all-reduce (an expert that got
        no gradient on this rank counts as zeros, as in ZeRO)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.expert_params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        comm.all_reduce(flat, op=ReduceOp.AVG, group=self.expert_dp_group)
        offset = 0
        for p, g in zip(self.expert_params, grads):
            p.grad = flat[offset: offset + g.numel()].view_as(p).clone()
            offset += g.numel()

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        """The wrapper's parameters (under 'dense.'), then this rank's experts (under 'experts.' and their
        name in the model): what the optimizer steps."""
        dot = f"{prefix}." if prefix else ""
        yield from self.dense.named_parameters(prefix=f"{dot}dense")
        for n, p in zip(self.expert_names, self.expert_params):
            yield f"{dot}experts.{n}", p

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Scales every gradient so that the global 2-norm (each distinct value counted once: replicated
        gradients once over dp, experts once per ep group) is at most max_norm; returns the norm before
        clipping (float32, the same on every rank). Every rank of dp calls it."""
        if norm_type != 2.0:
            raise ValueError(f"ExpertDataParallel.clip_grad_norm_: only norm_type=2.0 is supported, got {norm_type}")
        experts = [p.grad for p in self.expert_params]
        if self._dense_is_sharded:
            shards = [g.master.grad for g in self.dense.groups]
            return clip_grad_norm_(shards, max_norm, group=self.dp_group, copies=[(experts, self.edp_size)])
        replicated = [p.grad for p in self.dense.module.parameters()]
        return clip_grad_norm_([], max_norm, group=self.dp_group, replicated=replicated,
                               copies=[(experts, self.edp_size)])
