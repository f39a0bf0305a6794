"""The expert-parallel plan of a Hugging Face mixture-of-experts model (parallelize(model, mesh, plan="ep")):
the experts of every sparse MoE block sharded over mesh.group("ep"), the tokens carried to their expert's
owner and back on ringzero's all-to-all (parallel/expert/layer.py's run_on_owners).

[Note: the model routes, we only move the tokens]
Mixtral's and Qwen2-MoE's blocks call their router (`gate`: softmax over all experts, top-k, renormalised
for Mixtral and for Qwen2-MoE with norm_topk_prob) and then experts(hidden, top_k_index, top_k_weights).
Only the experts module is replaced: the router, Qwen2-MoE's shared expert and its sigmoid gate, and the
block's forward stay transformers' own, so the routing is the model's by construction (no second copy of
it to keep in step with transformers), the router logits its load-balancing loss reads
(output_router_logits=True) are still recorded, and the loss is transformers' own. The replacement
computes what the eager experts compute (per expert: act(x W_gate) * (x W_up), then W_down, times the
token's weight, summed over the token's experts in expert order) with the copies moved between ranks
in between: sort by expert (models/moe.py's sort_by_expert), dispatch, the local experts, the reverse
exchange, the weighted sum (models/moe.py's combine).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ...models.moe import Routing, combine, sort_by_expert
from ..expert.layer import run_on_owners
from ..mesh import Mesh
from .hf_plans import HFMoEPlan, find_module, resolve_moe_plan

EXPERT_LAYOUT = (("has_bias", False), ("is_transposed", False), ("has_gate", True), ("is_concatenated", True),
                 ("has_post_expert_norm", False))
"""The experts module's layout flags (transformers' use_experts_implementation sets them; absent: this
value) that ExpertParallelHFExperts computes: no biases, weights [out, in], a gate, [gate | up] stacked."""


@dataclasses.dataclass
class ExpertParallelInfo:
    """What parallelize(plan="ep") did, kept on the model as `model.ringzero_parallel`."""

    plan: HFMoEPlan
    group: object
    """The expert-parallel process group (mesh.group("ep"))."""
    ep: int
    blocks: int
    """How many sparse MoE blocks were sharded."""


class ExpertParallelHFExperts(nn.Module):
    """This rank's E / P experts of a transformers experts module (MixtralExperts, Qwen2MoeExperts), P the
    size of `group`: gate_up_proj [E/P, 2 I, d] and down_proj [E/P, d, I], experts [rank E/P, (rank + 1) E/P)
    of the original (same parameter names, so optimizers and checkpoints see the slice under the model's own
    names).

    forward(hidden_states [N, d], top_k_index [N, k] int64, top_k_weights [N, k]) -> [N, d], as the module it
    replaces, on this rank's N tokens ([Note: the model routes, we only move the tokens]). Collective: every
    rank of the group calls forward and backward together (any N, zero included). Gradients: an expert's is
    the sum over the group's ranks of each rank's loss; ExpertDataParallel scales it to the mean over dp
    ([Note: expert gradients under data parallelism] in parallel/expert/expert_data_parallel.py), which
    finds this module by `holds_expert_shard`.
    """

    holds_expert_shard = True
    """Every parameter here is one of this rank's experts (ExpertDataParallel's expert_holders)."""

    def __init__(self, experts: nn.Module, group):
        super().__init__()
        self.group = group
        self.ep_size, self.ep_rank = dist.get_world_size(group), dist.get_rank(group)
        self.num_experts = experts.gate_up_proj.shape[0]
        self.local_count = self.num_experts // self.ep_size
        self.first_expert = self.ep_rank * self.local_count
        keep = slice(self.first_expert, self.first_expert + self.local_count)
        self.gate_up_proj = nn.Parameter(experts.gate_up_proj.detach()[keep].clone())
        self.down_proj = nn.Parameter(experts.down_proj.detach()[keep].clone())
        self.act_fn = experts.act_fn

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        n = hidden_states.shape[0]
        copies = sort_by_expert(Routing(top_k_index.long(), top_k_weights, probs=None), self.num_experts)
        y = run_on_owners(hidden_states[copies.token], copies.counts, self.group, self.local_count,
                          self.run_local)
        return combine(y, copies, n).to(hidden_states.dtype)

    def run_local(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """The local experts on their runs of x [R, d] (counts: the rows of each, in order) -> [R, d].
        unbind, not w[e]: one backward node per weight (as models/moe.py's Experts); every expert runs,
        on zero rows if need be, so each weight has a gradient in every backward."""
        out = []
        for xe, gate_up, down in zip(x.split(counts), self.gate_up_proj.unbind(0), self.down_proj.unbind(0)):
            gate, up = F.linear(xe, gate_up).chunk(2, dim=-1)
            out.append(F.linear(self.act_fn(gate) * up, down))
        return torch.cat(out)

    def extra_repr(self) -> str:
        return (f"experts {self.first_expert}..{self.first_expert + self.local_count - 1} of {self.num_experts} "
                f"(ep rank {self.ep_rank} of {self.ep_size})")


def moe_blocks(model: nn.Module, plan: HFMoEPlan) -> list[nn.Module]:
    """The sparse MoE blocks of `model` (those of its layers whose plan.moe_block holds plan.experts and
    plan.router), in layer order; ValueError naming the plan field when `layers` is missing."""
    found = []
    for layer in find_module(model, plan.layers, plan, "layers"):
        try:
            block = layer.get_submodule(plan.moe_block)
            block.get_submodule(plan.experts), block.get_submodule(plan.router)
        except AttributeError:
            continue  # a dense layer (Qwen2-MoE's mlp_only_layers)
        found.append(block)
    return found


def _check_experts(experts: nn.Module, plan: HFMoEPlan, config, ep: int) -> None:
    """ValueError unless `experts` holds stacked weights of the layout ExpertParallelHFExperts computes and ep
    divides its expert count."""
    if not all(isinstance(getattr(experts, n, None), nn.Parameter) for n in ("gate_up_proj", "down_proj")):
        raise ValueError(f"plan {plan.name!r}: {type(experts).__name__} ({plan.moe_block}.{plan.experts}) holds no "
                         "stacked gate_up_proj and down_proj: the ep plan shards experts stored as 3-D tensors "
                         "(transformers 5's MoE layout)")
    for flag, want in EXPERT_LAYOUT:
        if getattr(experts, flag, want) != want:
            raise ValueError(f"plan {plan.name!r}: {type(experts).__name__}.{flag}={getattr(experts, flag)!r}: the "
                             f"expert-parallel experts compute {flag}={want} only")
    count = experts.gate_up_proj.shape[0]
    if count % ep:
        raise ValueError(f"config.{plan.num_experts}={getattr(config, plan.num_experts, count)} experts are not "
                         f"divisible by the expert-parallel size ep={ep}: every rank holds E / ep whole experts; "
                         "choose an ep that divides it")


def parallelize_experts(model: nn.Module, mesh: Mesh, plan) -> nn.Module:
    """parallelize(model, mesh, plan="ep" or an HFMoEPlan): the experts of every sparse MoE block sharded
    over mesh.group("ep") in place (each rank keeps E / ep of them), everything else as it was (replicated);
    returns `model`. Every rank of the mesh calls it with the same model (same weights: the same seed or
    checkpoint). The model's outputs and loss are transformers' own, on this rank's batch.
    For training wrap it in ExpertDataParallel(model, mesh.group("dp"), mesh.group("edp")) (the replicated
    parameters averaged over dp, the experts scaled to the mean) and build the optimizer afterwards.

    ValueError, before changing anything: a model without sparse MoE blocks (or of a model type no plan
    in MOE_PLANS knows), a mesh with tp > 1 or without an ep axis (Mesh(ep=1)), E not divisible by ep,
    an experts module of another layout. The KV cache is turned off.
    """
    plan = resolve_moe_plan(plan, model)
    if mesh.size("tp") != 1:
        raise ValueError(f"plan={plan.name!r} (expert parallel) shards the experts only: build the Mesh with tp=1, "
                         f"got tp={mesh.size('tp')}")
    if mesh.size("ep") == 1:
        raise ValueError("the expert-parallel plan needs an ep axis: build Mesh(..., ep=P) with P > 1 dividing dp "
                         "and the number of experts")
    blocks = moe_blocks(model, plan)
    if not blocks:
        raise ValueError(f"plan {plan.name!r}: {type(model).__name__} has no sparse MoE block (no "
                         f"{plan.layers}[i].{plan.moe_block}.{plan.experts}): nothing for expert parallelism "
                         "to shard")
    group, ep = mesh.group("ep"), mesh.size("ep")
    for block in blocks:
        _check_experts(block.get_submodule(plan.experts), plan, model.config, ep)
    for block in blocks:
        parent, _, name = plan.experts.rpartition(".")
        setattr(block.get_submodule(parent) if parent else block, name,
                ExpertParallelHFExperts(block.get_submodule(plan.experts), group))
    model.config.use_cache = False
    model.ringzero_parallel = ExpertParallelInfo(plan, group, ep, len(blocks))
    return model


__all__ = ["ExpertParallelHFExperts", "ExpertParallelInfo", "parallelize_experts", "moe_blocks"]
