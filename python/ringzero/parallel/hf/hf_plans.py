"""Plans for Hugging Face decoder models: which submodule is which, as data. HFPlan: the tensor-parallel
layout of a dense decoder; HFMoEPlan: where a mixture-of-experts model keeps its experts (plan="ep").

A plan names, by attribute path, the pieces parallelize() (parallelize.py) replaces; it holds no code,
so a model family with the same layout reuses a plan (Qwen2's names are Llama's) and a
new family is one more HFPlan. docs/parallelize.md is the user's guide to these rules.
"""
from __future__ import annotations

import dataclasses

import torch.nn as nn


@dataclasses.dataclass(frozen=True)
class HFPlan:
    """Where the pieces of one decoder family live. Paths are dotted attribute names: `embedding`,
    `layers`, `final_norm`, `head`, `rotary` and `position_embedding` from the top model (the ...ForCausalLM);
    the others from one decoder layer (an element of `layers`), or from its MLP for `mlp_in`, `mlp_out`
    and `activation`."""

    name: str
    """What parallelize(plan=...) calls it."""
    embedding: str
    """The token embedding (nn.Embedding): vocabulary-parallel rows."""
    layers: str
    """The nn.ModuleList of decoder layers: pipeline stages are cut between them."""
    attention: str
    """A layer's self-attention module: replaced whole by a ParallelAttention."""
    qkv: tuple[str, ...]
    """Inside the attention: the query, key and value projections (three nn.Linear) or one fused Conv1D
    (GPT-2's c_attn, [q | k | v] along its output); column-parallel by heads."""
    attention_out: str
    """Inside the attention: the output projection; row-parallel."""
    mlp: str
    """A layer's MLP: replaced whole by a ParallelMLP."""
    mlp_in: tuple[str, ...]
    """Inside the MLP: (gate, up) for a gated MLP, act(gate(x)) * up(x); (fc,) for a plain one; column-parallel."""
    mlp_out: str
    """Inside the MLP: the down projection; row-parallel."""
    activation: str
    """Inside the MLP: the activation module (kept as it is)."""
    layer_norms: tuple[str, ...]
    """A layer's norms: with sequence parallelism they see a sequence shard and their gradients are summed."""
    final_norm: str
    """The norm after the last layer (replicated, on the whole sequence)."""
    head: str
    """The LM head (nn.Linear without bias, maybe tied to the embedding): vocabulary-parallel columns."""
    rotary: str | None = None
    """The rotary embedding module whose (cos, sin) the attention applies to q and k; None: no rotary."""
    position_embedding: str | None = None
    """A learned position embedding (GPT-2's wpe): replicated; None: none."""
    conv1d: bool = False
    """The projections are transformers' Conv1D (weight [in, out], the transpose of nn.Linear's)."""
    zero_config_fields: tuple[str, ...] = ()
    """Config fields that must be 0 (dropout: ranks would draw different masks on their shards)."""
    refused_config: tuple[tuple[str, object], ...] = ()
    """(field, value) pairs the plan cannot run (e.g. cross-attention, sliding windows)."""


LLAMA = HFPlan(
    name="llama", embedding="model.embed_tokens", layers="model.layers", attention="self_attn",
    qkv=("q_proj", "k_proj", "v_proj"), attention_out="o_proj", mlp="mlp", mlp_in=("gate_proj", "up_proj"),
    mlp_out="down_proj", activation="act_fn", layer_norms=("input_layernorm", "post_attention_layernorm"),
    final_norm="model.norm", head="lm_head", rotary="model.rotary_emb", zero_config_fields=("attention_dropout",),
    refused_config=(("use_sliding_window", True),))

GPT2 = HFPlan(
    name="gpt2", embedding="transformer.wte", layers="transformer.h", attention="attn", qkv=("c_attn",),
    attention_out="c_proj", mlp="mlp", mlp_in=("c_fc",), mlp_out="c_proj", activation="act",
    layer_norms=("ln_1", "ln_2"), final_norm="transformer.ln_f", head="lm_head", position_embedding="transformer.wpe",
    conv1d=True, zero_config_fields=("attn_pdrop", "resid_pdrop", "embd_pdrop"),
    refused_config=(("add_cross_attention", True),))

PLANS = {"llama": LLAMA, "qwen2": dataclasses.replace(LLAMA, name="qwen2"), "gpt2": GPT2}
"""The plans parallelize(plan=name) knows, by name."""


@dataclasses.dataclass(frozen=True)
class HFMoEPlan:
    """Where the sparse mixture-of-experts blocks of one decoder family live: what the expert-parallel plan
    (parallelize(model, mesh, plan="ep"), hf_expert.py) shards. `layers` is a path from the top model;
    `moe_block` from one decoder layer; `router` and `experts` from the block."""

    name: str
    """The family (its plan in MOE_PLANS)."""
    model_types: tuple[str, ...]
    """The config.model_type values plan="ep" picks this plan for."""
    num_experts: str
    """The config field holding E, the experts per block (what ep must divide)."""
    layers: str = "model.layers"
    """The nn.ModuleList of decoder layers."""
    moe_block: str = "mlp"
    """A layer's sparse MoE block. A layer whose module there holds no `experts` (Qwen2-MoE's
    mlp_only_layers, a dense MLP) is left as it is."""
    router: str = "gate"
    """Inside the block: the router, kept whole and replicated (the model's own routing and the router
    logits its load-balancing loss reads)."""
    experts: str = "experts"
    """Inside the block: the experts module, called as experts(hidden [N, d], top_k_index [N, k],
    top_k_weights [N, k]) and holding stacked gate_up_proj [E, 2 I, d] ([gate | up]) and down_proj [E, d, I]:
    replaced by this rank's E / ep of them (hf_expert.ExpertParallelHFExperts)."""


MIXTRAL = HFMoEPlan(name="mixtral", model_types=("mixtral",), num_experts="num_local_experts")
QWEN2_MOE = HFMoEPlan(name="qwen2_moe", model_types=("qwen2_moe",), num_experts="num_experts")
"""Qwen2-MoE's shared expert and its sigmoid gate sit beside `experts` in the block: replicated."""

MOE_PLANS = {"mixtral": MIXTRAL, "qwen2_moe": QWEN2_MOE}
"""The expert-parallel plans, by family; parallelize(plan="ep") picks one by the model's config.model_type."""

EXPERT_PARALLEL = "ep"
"""The plan name that asks parallelize for expert parallelism (the layout from MOE_PLANS)."""


def resolve_plan(plan) -> HFPlan:
    """The HFPlan for `plan` (a name in PLANS or an HFPlan); ValueError for an unknown name."""
    if isinstance(plan, HFPlan):
        return plan
    if isinstance(plan, str) and plan in PLANS:
        return PLANS[plan]
    raise ValueError(f"plan={plan!r}: use one of {', '.join(sorted(PLANS))}, an HFPlan naming your model's "
                     f"modules, or {EXPERT_PARALLEL!r} for a mixture-of-experts model (docs/parallelize.md)")


def resolve_moe_plan(plan, model: nn.Module) -> HFMoEPlan:
    """The HFMoEPlan for `plan` (EXPERT_PARALLEL: the one of MOE_PLANS whose model_types hold the model's
    config.model_type; or an HFMoEPlan); ValueError naming the model type when no plan knows it."""
    if isinstance(plan, HFMoEPlan):
        return plan
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    for moe_plan in MOE_PLANS.values():
        if model_type in moe_plan.model_types:
            return moe_plan
    raise ValueError(f"plan={EXPERT_PARALLEL!r}: {type(model).__name__} (config.model_type={model_type!r}) has no "
                     f"sparse MoE blocks that a plan knows; expert parallelism is for mixture-of-experts models "
                     f"({', '.join(sorted(MOE_PLANS))}, or pass an HFMoEPlan naming your model's modules)")


def find_module(root: nn.Module, path: str, plan: HFPlan, field: str) -> nn.Module:
    """root's submodule at dotted `path`; ValueError naming the plan field when it is missing."""
    try:
        return root.get_submodule(path)
    except AttributeError:
        raise ValueError(f"plan {plan.name!r}: {field}={path!r} names no submodule of {type(root).__name__}; "
                         "is this the right plan for the model (or pass an HFPlan with its names)?") from None


def attention_shape(config, plan: HFPlan) -> tuple[int, int, int]:
    """(heads, kv_heads, head_dim) from a transformers config."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return heads, kv_heads, head_dim


def check_config(config, plan: HFPlan, tp: int, sequence_parallel: bool, seq_len: int | None = None):
    """ValueError naming the config field that the plan cannot run or that tp does not divide."""
    for field in plan.zero_config_fields:
        if getattr(config, field, 0):
            raise ValueError(f"config.{field}={getattr(config, field)}: dropout under tensor parallelism would draw "
                             f"different masks on the ranks' shards; set config.{field}=0 before parallelize")
    for field, value in plan.refused_config:
        if getattr(config, field, None) == value:
            raise ValueError(f"config.{field}={value!r} is not supported by plan {plan.name!r}")
    layer_types = getattr(config, "layer_types", None) or ()
    if any(t != "full_attention" for t in layer_types):
        raise ValueError(f"config.layer_types={list(layer_types)}: plan {plan.name!r} runs full causal attention "
                         "only (no sliding windows)")
    implementation = getattr(config, "_attn_implementation", None) or "sdpa"
    if implementation not in ("sdpa", "eager"):
        raise ValueError(f"config._attn_implementation={implementation!r}: the parallel attention takes the masks "
                         "of 'sdpa' or 'eager'; load the model with attn_implementation='sdpa'")
    heads, kv_heads, _ = attention_shape(config, plan)
    for field, value in (("num_attention_heads", heads), ("num_key_value_heads", kv_heads),
                         ("vocab_size", config.vocab_size)):
        if value % tp:
            fix = ("resize the embeddings to a multiple, model.resize_token_embeddings(n, pad_to_multiple_of=tp)"
                   if field == "vocab_size" else "choose a tensor-parallel size that divides it")
            raise ValueError(f"config.{field}={value} is not divisible by the tensor-parallel size {tp}: every rank "
                             f"must hold an equal shard; {fix}")
    if sequence_parallel and seq_len is not None and seq_len % tp:
        raise ValueError(f"sequence length {seq_len} is not divisible by tp={tp} (sequence_parallel=True)")
