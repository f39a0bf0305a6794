"""Pipeline stages for Hugging Face decoder models: the model as one nn.Sequential (embedding first,
decoder layers, final norm and head last) for pipeline.split, the loss for the last stage, and the
gradient exchange of an embedding tied to the head when the two sit on different stages.

    seq = hf_as_sequential(model)                 # parallelized (tensor axis) or not
    parts = pipeline.split(seq, pp, by="layers")
    stage = PipelineStage(parts[s], s, pp, group=mesh.group("pp"))
    runner = PipelineRunner(stage, "1F1B", m, loss_fn=hf_pipeline_loss(model),
                            grad_sync=tied_embedding_sync(model, [stage]), optimizer=opt)

A stage carries one tensor: positions are 0 .. T-1 and the mask is causal (no padding masks, no
position_ids across a pipeline).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .hf_layers import causal_lm_loss
from .hf_plans import HFPlan, find_module, resolve_plan
from ..data_parallel.zero import ZeroDataParallel


def _plan_of(model: nn.Module, plan) -> HFPlan:
    info = getattr(model, "ringzero_parallel", None)
    if info is not None:
        if not isinstance(info.plan, HFPlan):
            raise ValueError(f"plan {info.plan.name!r}: pipeline stages of an expert-parallel model are not "
                             "supported yet")
        return info.plan
    if plan is None:
        raise ValueError("plan: name the model's plan (e.g. plan='llama') for a model that parallelize() has not seen")
    return resolve_plan(plan)


class HFEmbedding(nn.Module):
    """Token ids (B, T) int64 -> hidden states (B, T, d): the token embedding plus, if the model has one,
    the learned position embedding of positions 0 .. T-1."""

    def __init__(self, tokens: nn.Module, positions: nn.Module | None):
        super().__init__()
        self.tokens, self.positions = tokens, positions

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx)
        if self.positions is not None:
            x = x + self.positions(torch.arange(idx.shape[1], device=idx.device))
        return x


class HFDecoderLayer(nn.Module):
    """One transformers decoder layer called with what the model's forward would pass it for positions
    0 .. T-1 and a causal mask. rotary: the model's rotary module for an unparallelized layer (None for
    a ParallelAttention, which makes its own tables from the whole sequence); eager_mask: build the
    additive causal mask ('eager' attention does not mask without one); recompute: keep only the layer's
    input for backward and run the layer again there (torch.utils.checkpoint, non-reentrant, inside this
    module's forward: models/gpt.py's [Note: recompute inside the Block] holds for it too, so ZeRO-3 may
    take HFDecoderLayer as its unit)."""

    def __init__(self, layer: nn.Module, rotary: nn.Module | None, eager_mask: bool, recompute: bool = False):
        super().__init__()
        self.layer, self.eager_mask, self.recompute = layer, eager_mask, bool(recompute)
        self._rotary = [rotary] if rotary is not None else []  # the model owns it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(self._layer, x, use_reentrant=False)
        return self._layer(x)

    def _layer(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        kwargs = {}
        if self._rotary:
            kwargs["position_embeddings"] = self._rotary[0](x, torch.arange(t, device=x.device).unsqueeze(0))
        if self.eager_mask:
            future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            kwargs["attention_mask"] = torch.zeros(t, t, dtype=x.dtype, device=x.device).masked_fill(
                future, torch.finfo(x.dtype).min)[None, None]
        out = self.layer(x, **kwargs)
        return out[0] if isinstance(out, tuple) else out


class HFHead(nn.Module):
    """Final norm and LM head: hidden states (B, T, d) -> logits (B, T, vocab), this rank's vocabulary
    block (B, T, vocab / tp) after parallelize."""

    def __init__(self, norm: nn.Module, head: nn.Module):
        super().__init__()
        self.norm, self.head = norm, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(x))


def hf_as_sequential(model: nn.Module, plan=None, recompute: bool = False) -> nn.Sequential:
    """nn.Sequential(HFEmbedding, HFDecoderLayer for each layer, HFHead) sharing `model`'s modules (no
    copies), for pipeline.split; forward(idx (B, T) int64) -> logits, as the model's for positions 0 .. T-1
    and a causal mask. plan: the model's plan; taken from parallelize() when it ran. recompute: every
    decoder layer recomputes itself in backward (HFDecoderLayer)."""
    plan = _plan_of(model, plan)
    parallel = getattr(model, "ringzero_parallel", None) is not None
    rotary = None if parallel or plan.rotary is None else find_module(model, plan.rotary, plan, "rotary")
    eager = not parallel and getattr(model.config, "_attn_implementation", "sdpa") == "eager"
    positions = find_module(model, plan.position_embedding, plan, "position_embedding") if plan.position_embedding else None
    layers = find_module(model, plan.layers, plan, "layers")
    return nn.Sequential(HFEmbedding(find_module(model, plan.embedding, plan, "embedding"), positions),
                         *(HFDecoderLayer(layer, rotary, eager, recompute) for layer in layers),
                         HFHead(find_module(model, plan.final_norm, plan, "final_norm"),
                                find_module(model, plan.head, plan, "head")))


def hf_pipeline_loss(model: nn.Module, ignore_index: int = -100):
    """loss_fn(logits, targets) for the last stage: mean cross-entropy against already shifted targets
    (B, T) skipping ignore_index, over the tensor-parallel group when parallelize() split the vocabulary."""
    info = getattr(model, "ringzero_parallel", None)
    if info is not None:
        return lambda logits, targets: causal_lm_loss(logits, targets, info.group, ignore_index)
    return lambda logits, targets: F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(),
                                                   ignore_index=ignore_index)


def tied_embedding_sync(model: nn.Module, stages, plan=None):
    """grad_sync for PipelineRunner: when the LM head shares the embedding's weight and the first and last
    stages sit on different pipeline ranks, those two ranks each hold one part of its gradient (the
    embedding's, the head's); this exchanges the parts point-to-point so that both hold the sum, as the
    unsplit model's gradient is, and their optimizers keep the two copies equal. Does nothing on other
    ranks or for an untied head. stages: this rank's PipelineStage(s); every rank of the pipeline calls
    the returned function after backward (the runner does)."""
    plan = _plan_of(model, plan)
    weight = find_module(model, plan.embedding, plan, "embedding").weight
    stages = list(stages)
    holds_first = any(s.is_first for s in stages)
    holds_last = any(s.is_last for s in stages)
    tied = find_module(model, plan.head, plan, "head").weight is weight
    if not tied or holds_first == holds_last:
        return lambda: None
    group, num_stages = stages[0].group, stages[0].num_stages
    size = dist.get_world_size(group)
    peer = dist.get_global_rank(group, (num_stages - 1) % size if holds_first else 0)
    zero = next((s.module for s in stages if isinstance(s.module, ZeroDataParallel)), None)
    # Under ZeRO (stages 1-2, the weight in a bucket of its own: ZeroDataParallel's own_bucket) the gradient
    # to add is this rank's shard of the data-parallel reduced one, which holds the same elements on both
    # stages; the sum of the two reduced parts is the reduced sum (a mean over replicas is linear).
    holder = weight
    if zero is not None:
        bucket = zero.group_of(weight)
        if len(bucket.layout.params) != 1:
            raise ValueError("tied_embedding_sync: under ZeroDataParallel the tied weight needs a bucket of its own: "
                             "wrap the stage with ZeroDataParallel(..., own_bucket=[weight])")
        holder = bucket.master

    def sync():
        grad = holder.grad if holder.grad is not None else torch.zeros_like(holder)
        other = torch.empty_like(grad)
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, grad.contiguous(), peer, group),
                                        dist.P2POp(dist.irecv, other, peer, group)])
        for work in works:
            work.wait()
        holder.grad = grad + other  # a + b == b + a in floating point: both ranks hold the same sum

    return sync
