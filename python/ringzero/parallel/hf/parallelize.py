"""parallelize(model, mesh, plan): a Hugging Face causal LM sharded in place over the mesh's tensor axis.

Everything is checked before anything is replaced (hf_plans.check_config, every module the plan names),
so a refusal leaves the model as it was. The user's guide, with what is refused and why, is
docs/parallelize.md.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from .hf_layers import (HFCausalLMLoss, ParallelAttention, ParallelMLP, shard_sequence_between, sum_gradient_over_group,
                        zero_gradient_row)
from .hf_expert import parallelize_experts
from .hf_plans import EXPERT_PARALLEL, HFMoEPlan, HFPlan, attention_shape, check_config, find_module, resolve_plan
from ..mesh import Mesh
from ..tensor_parallel.tensor import ColumnParallelLinear, RowParallelLinear
from ..tensor_parallel.vocab import VocabParallelEmbedding, vocab_range


@dataclasses.dataclass
class ParallelInfo:
    """What parallelize did, kept on the model as `model.ringzero_parallel`."""

    plan: HFPlan
    group: object
    """The tensor-parallel process group."""
    tp: int
    sequence_parallel: bool


def linear_weight(module: nn.Module, conv1d: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight (out, in), bias (out) or None) of an nn.Linear, or of a Conv1D (which stores (in, out))."""
    weight = module.weight.detach()
    return (weight.t() if conv1d else weight), (None if module.bias is None else module.bias.detach())


def _fused_qkv(attention: nn.Module, plan: HFPlan, sizes: list[int], group, sp: bool):
    """One ColumnParallelLinear holding this rank's q, k and v heads, loaded from the plan's projections;
    sizes: the rows of q, k and v."""
    projections = [find_module(attention, n, plan, "qkv") for n in plan.qkv]
    weights = [linear_weight(m, plan.conv1d) for m in projections]
    if len(weights) == 1:  # GPT-2's fused c_attn: [q | k | v] along the output
        w, b = weights[0]
        weights = list(zip(w.split(sizes), b.split(sizes) if b is not None else [None] * 3))
    if len({b is None for _, b in weights}) > 1:
        raise ValueError(f"plan {plan.name!r}: {plan.qkv} mix projections with and without bias")
    has_bias = weights[0][1] is not None
    d = weights[0][0].shape[1]
    # Three blocks, [q | k | v], each cut by heads: rank r holds [q heads of r | k heads of r | v heads of r].
    # Given by their sizes (grouped-query attention's q is larger than k and v), so tensor_state knows the
    # cut and checkpoints re-cut it for any tp.
    qkv = ColumnParallelLinear(d, sum(sizes), group, bias=has_bias, chunks=tuple(sizes), sequence_parallel=sp)
    qkv.load_full_(torch.cat([w for w, _ in weights]), torch.cat([b for _, b in weights]) if has_bias else None)
    return qkv


def _row_parallel(module: nn.Module, plan: HFPlan, group, sp: bool) -> RowParallelLinear:
    w, b = linear_weight(module, plan.conv1d)
    layer = RowParallelLinear(w.shape[1], w.shape[0], group, bias=b is not None, sequence_parallel=sp)
    layer.load_full_(w, b)
    return layer


def _sources(ours: str, theirs: tuple, sizes, plan: HFPlan, has_bias: bool) -> dict:
    """tensor_state.fused_sources' entries of one parallel layer `ours` made from the transformers layers
    `theirs` (rows `sizes` of ours each, None: one layer, whole)."""
    out = {f"{ours}.weight": {"parts": [f"{n}.weight" for n in theirs], "sizes": sizes, "transposed": plan.conv1d}}
    if has_bias:
        out[f"{ours}.bias"] = {"parts": [f"{n}.bias" for n in theirs], "sizes": sizes, "transposed": False}
    return out


def _parallel_attention(attention, plan, config, group, sp, rotary) -> ParallelAttention:
    heads, kv_heads, head_dim = attention_shape(config, plan)
    sizes = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
    qkv = _fused_qkv(attention, plan, sizes, group, sp)
    out = _row_parallel(find_module(attention, plan.attention_out, plan, "attention_out"), plan, group, sp)
    scaling = getattr(attention, "scaling", head_dim ** -0.5)
    layer = ParallelAttention(qkv, out, heads, kv_heads, head_dim, scaling, rotary)
    layer.sources = {**_sources("qkv", plan.qkv, sizes if len(plan.qkv) == 3 else None, plan, qkv.bias is not None),
                     **_sources("out", (plan.attention_out,), None, plan, out.bias is not None)}
    return layer


def _parallel_mlp(mlp: nn.Module, plan: HFPlan, group, sp: bool) -> ParallelMLP:
    ins = [linear_weight(find_module(mlp, n, plan, "mlp_in"), plan.conv1d) for n in plan.mlp_in]
    width, d = ins[0][0].shape
    has_bias = ins[0][1] is not None
    up_in = ColumnParallelLinear(d, width * len(ins), group, bias=has_bias, chunks=len(ins), sequence_parallel=sp)
    up_in.load_full_(torch.cat([w for w, _ in ins]), torch.cat([b for _, b in ins]) if has_bias else None)
    down = _row_parallel(find_module(mlp, plan.mlp_out, plan, "mlp_out"), plan, group, sp)
    layer = ParallelMLP(up_in, down, find_module(mlp, plan.activation, plan, "activation"), gated=len(ins) == 2)
    layer.sources = {**_sources("up_in", plan.mlp_in, [width] * len(ins) if len(ins) > 1 else None, plan, has_bias),
                     **_sources("down", (plan.mlp_out,), None, plan, down.bias is not None)}
    return layer


def _set_submodule(root: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, module)


def _check_names(model: nn.Module, plan: HFPlan) -> nn.ModuleList:
    """Resolves every path the plan names (ValueError for a missing one); returns the decoder layers."""
    for field in ("embedding", "layers", "final_norm", "head", "rotary", "position_embedding"):
        if getattr(plan, field) is not None:
            find_module(model, getattr(plan, field), plan, field)
    layers = find_module(model, plan.layers, plan, "layers")
    for layer in layers:
        attention = find_module(layer, plan.attention, plan, "attention")
        for n in plan.qkv + (plan.attention_out,):
            find_module(attention, n, plan, "qkv / attention_out")
        mlp = find_module(layer, plan.mlp, plan, "mlp")
        for n in plan.mlp_in + (plan.mlp_out, plan.activation):
            find_module(mlp, n, plan, "mlp_in / mlp_out / activation")
        for n in plan.layer_norms:
            find_module(layer, n, plan, "layer_norms")
    if len(plan.qkv) not in (1, 3) or len(plan.mlp_in) not in (1, 2):
        raise ValueError(f"plan {plan.name!r}: qkv names 1 (fused) or 3 projections and mlp_in 1 (plain) or 2 "
                         f"(gate, up); got qkv={plan.qkv}, mlp_in={plan.mlp_in}")
    return layers


def parallelize(model: nn.Module, mesh: Mesh, plan="llama", sequence_parallel: bool = False) -> nn.Module:
    """Shards `model` (a transformers ...ForCausalLM) in place over mesh.group("tp") and returns it.

    plan: a name in hf_plans.PLANS ("llama", "qwen2", "gpt2") or an HFPlan; or "ep" (or an HFMoEPlan) for a
    mixture-of-experts model (Mixtral, Qwen2-MoE): its experts sharded over mesh.group("ep") instead, and
    nothing else changed (hf_expert.parallelize_experts says what it does and refuses). Replaced: the
    token embedding (VocabParallelEmbedding), each layer's attention (ParallelAttention: q, k, v fused
    column-parallel by heads, output row-parallel) and MLP (ParallelMLP), the LM head (column-parallel
    over the vocabulary; still tied to the embedding if it was). model(input_ids) then returns this
    rank's logits (B, T, vocab / tp), and model(input_ids, labels=...).loss the loss of the whole
    vocabulary (hf_layers.HFCausalLMLoss). sequence_parallel: the decoder layers' norms and residuals
    run on T / tp positions ([Note: sequence parallelism in a Hugging Face model]); tp must divide T.

    Every rank of the mesh calls it with the same model (same weights: build it from the same seed or
    checkpoint). Raises ValueError, before changing anything, for an unknown plan, a module the plan
    names that the model lacks, heads / key-value heads / vocabulary / MLP width not divisible by tp,
    dropout above 0, or an attention implementation other than sdpa/eager. The KV cache is turned off.
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a ringzero.parallel.Mesh, got {type(mesh).__name__}")
    if getattr(model, "ringzero_parallel", None) is not None:
        raise ValueError("model was already parallelized; build a fresh model")
    if isinstance(plan, HFMoEPlan) or (isinstance(plan, str) and plan == EXPERT_PARALLEL):
        if sequence_parallel:
            raise ValueError("sequence_parallel=True: the expert-parallel plan has no tensor axis to shard the "
                             "sequence over; leave it False")
        return parallelize_experts(model, mesh, plan)
    plan = resolve_plan(plan)
    group, tp, sp = mesh.group("tp"), mesh.size("tp"), bool(sequence_parallel)
    config = model.config
    check_config(config, plan, tp, sp)
    layers = _check_names(model, plan)
    for layer in layers:
        mlp = find_module(layer, plan.mlp, plan, "mlp")
        width = linear_weight(find_module(mlp, plan.mlp_in[0], plan, "mlp_in"), plan.conv1d)[0].shape[0]
        if width % tp:
            raise ValueError(f"the MLP's intermediate size {width} ({plan.mlp}.{plan.mlp_in[0]}) is not divisible by "
                             f"the tensor-parallel size {tp}; choose a tp that divides it")
    like = next(model.parameters())
    rotary = find_module(model, plan.rotary, plan, "rotary") if plan.rotary else None

    embedding = find_module(model, plan.embedding, plan, "embedding")
    head = find_module(model, plan.head, plan, "head")
    tied = head.weight is embedding.weight
    new_embedding = VocabParallelEmbedding(embedding.num_embeddings, embedding.embedding_dim, group)
    new_embedding.load_full_(embedding.weight.detach())
    padding_idx = getattr(embedding, "padding_idx", None)
    start, end = vocab_range(embedding.num_embeddings, group)
    if padding_idx is not None and start <= padding_idx < end:
        zero_gradient_row(new_embedding.weight, padding_idx - start)
    new_head = ColumnParallelLinear(head.in_features, head.out_features, group, bias=head.bias is not None)
    if tied:
        new_head.weight = new_embedding.weight  # the same rows vocab_range of the same matrix
    else:
        new_head.load_full_(head.weight.detach(), None if head.bias is None else head.bias.detach())
    _set_submodule(model, plan.embedding, new_embedding.to(like.device, like.dtype))
    _set_submodule(model, plan.head, new_head.to(like.device, like.dtype))

    for layer in layers:
        attention = find_module(layer, plan.attention, plan, "attention")
        _set_submodule(layer, plan.attention,
                       _parallel_attention(attention, plan, config, group, sp, rotary).to(like.device, like.dtype))
        mlp = find_module(layer, plan.mlp, plan, "mlp")
        _set_submodule(layer, plan.mlp, _parallel_mlp(mlp, plan, group, sp).to(like.device, like.dtype))
        if sp:
            for n in plan.layer_norms:
                for p in find_module(layer, n, plan, "layer_norms").parameters():
                    sum_gradient_over_group(p, group)
    if sp:
        shard_sequence_between(layers[0], layers[-1], group)
    model.loss_function = HFCausalLMLoss(group)
    config.use_cache = False
    model.ringzero_parallel = ParallelInfo(plan, group, tp, sp)
    return model


__all__ = ["parallelize", "ParallelInfo"]
