"""Tiny Hugging Face transformers causal language models built from a random config (no download): the
models the parallel plans (parallel/hf/parallelize.py) are tested on, and a quick way to try them.

transformers is an optional dependency: `pip install ringzero[hf]`.
"""
from __future__ import annotations

FAMILIES = ("llama", "gpt2", "qwen2")
"""Model families build_hf_model knows; each has a plan of the same name in parallel/hf/hf_plans.py."""


def require_transformers():
    """The transformers module, or ImportError saying how to install it."""
    try:
        import transformers
    except ImportError as e:
        raise ImportError("the Hugging Face models and plans need transformers: pip install ringzero[hf]") from e
    return transformers


def hf_config(family: str, layers: int = 2, d_model: int = 64, heads: int = 4, kv_heads: int | None = None,
              vocab: int = 256, seq: int = 32, tie_embeddings: bool | None = None):
    """(transformers config, model class) of build_hf_model's model, without building it: what the
    training command checks a layout against before any rank starts. Arguments and ValueErrors as
    build_hf_model's."""
    transformers = require_transformers()
    if family not in FAMILIES:
        raise ValueError(f"family={family!r}: use one of {', '.join(FAMILIES)}")
    if d_model % heads:
        raise ValueError(f"heads={heads} must divide d_model={d_model}")
    common = dict(vocab_size=vocab, hidden_size=d_model, num_hidden_layers=layers, num_attention_heads=heads,
                  max_position_embeddings=seq, use_cache=False)
    if tie_embeddings is not None:
        common["tie_word_embeddings"] = tie_embeddings
    if family == "gpt2":
        if kv_heads not in (None, heads):
            raise ValueError("kv_heads: GPT-2 has no grouped-query attention; leave kv_heads=None")
        config = transformers.GPT2Config(**common, n_inner=4 * d_model, resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        cls = transformers.GPT2LMHeadModel
    else:
        config_cls = transformers.LlamaConfig if family == "llama" else transformers.Qwen2Config
        config = config_cls(**common, num_key_value_heads=kv_heads or heads, intermediate_size=2 * d_model,
                            attention_dropout=0.0, pad_token_id=None)
        if family == "llama":
            config.tie_word_embeddings = bool(tie_embeddings)
        cls = transformers.LlamaForCausalLM if family == "llama" else transformers.Qwen2ForCausalLM
    config._attn_implementation = "sdpa"
    return config, cls


def build_hf_model(family: str, layers: int = 2, d_model: int = 64, heads: int = 4, kv_heads: int | None = None,
                   vocab: int = 256, seq: int = 32, tie_embeddings: bool | None = None, seed: int | None = None):
    """A randomly initialised causal LM of `family` (one of FAMILIES), float32, in train mode.

    layers: decoder layers; d_model: hidden size; heads: attention heads (must divide d_model);
    kv_heads: key/value heads for grouped-query attention (llama, qwen2; None: = heads; gpt2 has none);
    vocab: vocabulary size; seq: the longest sequence (positions); tie_embeddings: share the input
    embedding with the LM head (None: the family's default, True for gpt2, False otherwise).
    Dropout is 0 and the attention is PyTorch's SDPA, so that forward is deterministic; the KV cache is
    off (training). seed: torch.manual_seed(seed) first, so that every rank builds the same weights.
    """
    import torch

    config, cls = hf_config(family, layers, d_model, heads, kv_heads, vocab, seq, tie_embeddings)
    if seed is not None:
        torch.manual_seed(seed)
    model = cls(config).float().train()
    model.loss_type = "ForCausalLM"  # transformers guesses it from the class name, and not for GPT2LMHeadModel
    return model


MOE_FAMILIES = ("mixtral", "qwen2_moe")
"""Mixture-of-experts families build_hf_moe_model knows; each has an expert-parallel plan of the same name
in parallel/hf/hf_plans.py (MOE_PLANS), which parallelize(model, mesh, plan="ep") finds by model_type."""


def build_hf_moe_model(family: str, layers: int = 2, d_model: int = 64, heads: int = 4, kv_heads: int | None = None,
                       experts: int = 4, top_k: int = 2, expert_hidden: int | None = None, vocab: int = 256,
                       seq: int = 32, aux_loss_coef: float = 0.02, seed: int | None = None, **config_fields):
    """A randomly initialised mixture-of-experts causal LM of `family` (one of MOE_FAMILIES), float32, in
    train mode: every decoder layer's MLP a sparse MoE block of `experts` SwiGLU experts, top_k of them per
    token (Mixtral renormalises the top_k weights; Qwen2-MoE keeps the raw probabilities unless
    norm_topk_prob=True, and adds a shared expert behind a sigmoid gate).

    layers, d_model, heads, kv_heads, vocab, seq: as build_hf_model's; expert_hidden: one expert's width
    (None: 2 * d_model; Qwen2-MoE's shared expert gets the same); aux_loss_coef: the weight of the
    load-balancing loss that the model adds to `loss` when called with output_router_logits=True (the
    config's default here, so that training includes it). config_fields: any other field of the family's
    config (norm_topk_prob=True, mlp_only_layers=[0], router_jitter_noise=...). Dropout and jitter are 0,
    the attention is SDPA, the KV cache off. seed: torch.manual_seed(seed) first, so that every rank builds
    the same weights. ValueError for an unknown family or heads not dividing d_model.
    """
    import torch

    transformers = require_transformers()
    if family not in MOE_FAMILIES:
        raise ValueError(f"family={family!r}: use one of {', '.join(MOE_FAMILIES)}")
    if d_model % heads:
        raise ValueError(f"heads={heads} must divide d_model={d_model}")
    hidden = expert_hidden or 2 * d_model
    common = dict(vocab_size=vocab, hidden_size=d_model, num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads or heads, max_position_embeddings=seq, use_cache=False,
                  attention_dropout=0.0, num_experts_per_tok=top_k, router_aux_loss_coef=aux_loss_coef,
                  output_router_logits=True, tie_word_embeddings=False, pad_token_id=None)
    if family == "mixtral":
        config = transformers.MixtralConfig(**common, intermediate_size=hidden, num_local_experts=experts,
                                            router_jitter_noise=0.0, **config_fields)
        cls = transformers.MixtralForCausalLM
    else:
        config = transformers.Qwen2MoeConfig(**common, intermediate_size=hidden, moe_intermediate_size=hidden,
                                             shared_expert_intermediate_size=hidden, num_experts=experts,
                                             **config_fields)
        cls = transformers.Qwen2MoeForCausalLM
    config._attn_implementation = "sdpa"
    if seed is not None:
        torch.manual_seed(seed)
    return cls(config).float().train()
