"""Published model shapes the estimator knows by name (`ringzero estimate --model NAME`), each from its paper
or model card, named beside it. Only shapes whose numbers were read from those sources belong here."""
from __future__ import annotations

from .model import ModelShape
from .moe import MoE

DEFAULT_SEQ_LEN = 4096
"""Tokens per sample when --seq is not given: our choice (DeepSeek-V3's pre-training length; Mixtral's
context is longer), not part of either published shape."""


def mla_params(d_model: int, heads: int, q_rank: int, kv_rank: int, nope_dim: int, rope_dim: int,
               v_dim: int) -> int:
    """Parameters of one multi-head latent attention block (DeepSeek-V2/V3): the query's down projection,
    its norm and up projection (to heads x (nope + rope) dims); the keys' and values' joint down projection
    with the shared rotary key, its norm and the up projection to keys and values; the output projection."""
    query = d_model * q_rank + q_rank + q_rank * heads * (nope_dim + rope_dim)
    key_value = d_model * (kv_rank + rope_dim) + kv_rank + kv_rank * heads * (nope_dim + v_dim)
    return query + key_value + heads * v_dim * d_model


def mixtral_8x7b(seq_len: int = DEFAULT_SEQ_LEN) -> ModelShape:
    """Mixtral 8x7B (Jiang et al. 2024, 'Mixtral of Experts', Table 1): 32 blocks, hidden 4096, 32 heads of
    128 with 8 key/value heads, SwiGLU experts of 14336 (8, top-2) in every block, vocabulary 32000, RMSNorm,
    rotary positions, no biases, untied head. Published: 46.7B parameters, 12.9B active."""
    return ModelShape(n_layer=32, d_model=4096, n_head=32, kv_heads=8, vocab_size=32000, seq_len=seq_len,
                      mlp_width=14336, mlp="swiglu", norm="rms", positions="rotary", bias="none",
                      tied_embeddings=False, dropout=False, attention="flash",
                      moe=MoE(experts=8, top_k=2, expert_width=14336))


def deepseek_v3(seq_len: int = DEFAULT_SEQ_LEN) -> ModelShape:
    """DeepSeek-V3 (DeepSeek-AI 2024, 'DeepSeek-V3 Technical Report', section 4.2): 61 blocks, hidden 7168,
    the first 3 with a dense SwiGLU MLP of 18432, the others 256 routed experts (top-8) and 1 shared expert of
    2048, vocabulary 129280 (the model card's config), untied head. Its attention is MLA (128 heads of 128,
    query rank 1536, key/value rank 512, rotary dims 64): counted with its own weights (mla_params), its
    activations approximated as multi-head attention of 128 heads x 128. The multi-token prediction module
    (14B) is left out, as the published 671B total leaves it out. Published: 671B parameters, 37B active."""
    return ModelShape(n_layer=61, d_model=7168, n_head=128, head_dim=128, vocab_size=129280, seq_len=seq_len,
                      mlp_width=18432, mlp="swiglu", norm="rms", positions="rotary", bias="none",
                      tied_embeddings=False, dropout=False, attention="flash",
                      attention_params=mla_params(7168, 128, q_rank=1536, kv_rank=512, nope_dim=128, rope_dim=64,
                                                  v_dim=128),
                      moe=MoE(experts=256, top_k=8, expert_width=2048, first_dense=3, shared_experts=1))


KNOWN_MODELS = {"mixtral-8x7b": mixtral_8x7b, "deepseek-v3": deepseek_v3}
"""--model NAME: the shape for a sequence length."""


def known_model(name: str, seq_len: int | None = None) -> ModelShape:
    """The named shape on sequences of seq_len tokens (None: DEFAULT_SEQ_LEN); ValueError naming the known
    names for anything else."""
    key = str(name).lower()
    if key not in KNOWN_MODELS:
        raise ValueError(f"--model {name!r}: use one of {', '.join(KNOWN_MODELS)}")
    return KNOWN_MODELS[key](DEFAULT_SEQ_LEN if seq_len is None else seq_len)
