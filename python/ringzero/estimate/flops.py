"""Floating-point operations of a GPT-style decoder (a ModelShape), and the bytes its memory-bound kernels
move: what the step-time model (step_time.py) turns into seconds.

Counts follow Narayanan et al. 2021 (Megatron-LM, section 5.1): a multiply-add is 2 FLOPs; a block's
forward does 2 x tokens x (its weight matrices' elements) in its GEMMs plus 4 x tokens x s x q_dim in the
attention's two batched products (QK^T and softmax x V, the whole s x s square as the paper counts it,
although a causal kernel may skip half of it); the vocabulary projection 2 x tokens x h x V; the backward
twice the forward. For GPT (q_dim = h, k = h, w = 4h) this is the paper's
96 B s l h^2 (1 + s/(6h) + V/(16 l h)) with full recomputation, and 72 B s l h^2 (1 + s/(6h) + V/(12 l h))
without: tests/estimate/test_estimate_step_time.py checks both against the formula.
"""
from __future__ import annotations

BACKWARD_PER_FORWARD = 2
"""The backward computes the input's and the weights' gradients: two GEMMs for each forward one."""

NORM_AND_ADD_PASSES = 5
"""Elements of h per token a block moves through HBM outside its GEMMs, without dropout: two layer norms
(read x, write y) and the two residual additions fused with the bias (read the output and the residual,
write the sum): 2 + 2 + 3 + 3 = 10 accesses of each element, i.e. 5 reads-and-writes of h."""
DROPOUT_PASSES = 0.5
"""With dropout (fused into the bias-residual kernels): a 1-byte mask written for each of the two sums, half
an access of a 16-bit element each: 0.5 more reads-and-writes of h."""
ACTIVATION_PASSES = {"gelu": 1.0, "gelu_new": 2.5, "swiglu": 1.5}
"""Reads-and-writes of the MLP's hidden width per token in its activation: fused bias-GeLU reads and writes
w (1), GPT-2's tanh GeLU in Python ops (5 tensors: 2.5), SwiGLU reads gate and up and writes w (1.5)."""
SOFTMAX_PASSES = 1.0
"""Eager attention: the fused scale-mask-softmax reads and writes the a x s scores of each token."""
ATTENTION_DROPOUT_PASSES = 1.25
"""Eager attention with dropout: the dropout on the probabilities reads and writes them and a 1-byte mask."""
LOGIT_PASSES = 3
"""The float32 logits of the head: written by the GEMM, read and written by the softmax cross-entropy,
read by its backward: 3 reads-and-writes of V/t float32 per token (at 4 bytes, whatever the model's dtype)."""


def mlp_width_active(shape, block: int = 0) -> int:
    """Hidden width a token passes through in block `block`'s MLP: the dense width, or for a MoE block
    top-k routed experts plus the shared ones (uniform routing: every rank computes as many copies as
    it sends)."""
    moe = shape.moe
    if moe is None or not moe.is_moe(block):
        return shape.width
    return (moe.top_k + moe.shared_experts) * moe.expert_width


def block_gemm_flops(shape, tokens: int, tp: int = 1, block: int = 0) -> float:
    """Forward FLOPs of one block's weight GEMMs on one of tp ranks: q, k, v, proj and the MLP's matrices."""
    h, q, k = shape.d_model, shape.q_dim, shape.kv_dim
    weights = h * (q + 2 * k) + q * h + shape.mlp_matrices * h * mlp_width_active(shape, block)
    return 2.0 * tokens * weights / tp


def blocks_gemm_flops(shape, tokens: int, tp: int, start: int, stop: int) -> float:
    """block_gemm_flops summed over blocks start .. stop - 1 (a dense model's blocks are all alike)."""
    if shape.moe is None:
        return (stop - start) * block_gemm_flops(shape, tokens, tp)
    return sum(block_gemm_flops(shape, tokens, tp, i) for i in range(start, stop))


def attention_core_flops(shape, tokens: int, tp: int = 1) -> float:
    """Forward FLOPs of the attention's QK^T and probabilities x V on one of tp ranks (the whole s x s)."""
    return 4.0 * tokens * shape.seq_len * shape.q_dim / tp


def head_flops(shape, tokens: int, tp: int = 1) -> float:
    """Forward FLOPs of the vocabulary projection on one of tp ranks (tied or not: a GEMM all the same)."""
    return 2.0 * tokens * shape.d_model * shape.vocab_size / tp


def forward_passes(recompute: str) -> tuple[float, float]:
    """(forwards of the blocks' GEMMs, forwards of the attention core) per step for a recompute kind:
    full recomputation runs a block's forward again before its backward, selective only the attention's
    s^2 part (Korthikanti et al. 2022)."""
    return {"none": (1.0, 1.0), "selective": (1.0, 2.0), "full": (2.0, 2.0)}[recompute]


def model_flops(shape, tokens: int, recompute: str = "none") -> float:
    """FLOPs of one training step over `tokens` tokens for the whole model (all ranks together):
    forward (with the recomputation's extra forwards) and backward of every block and of the head."""
    gemm_fwd, attn_fwd = forward_passes(recompute)
    blocks = blocks_gemm_flops(shape, tokens, 1, 0, shape.n_layer)
    attention = shape.n_layer * attention_core_flops(shape, tokens)
    per_pass = BACKWARD_PER_FORWARD
    return (blocks * (gemm_fwd + per_pass) + attention * (attn_fwd + per_pass)
            + head_flops(shape, tokens) * (1 + per_pass))


def block_elementwise_bytes(shape, tokens: int, act_bytes: int, tp: int = 1, sequence_parallel: bool = False,
                            block: int = 0) -> float:
    """Bytes one block's forward moves through HBM in its memory-bound kernels on one of tp ranks: norms,
    residual additions, dropout, the MLP's activation and, with eager attention, the softmax over the s x s
    scores. Without sequence parallelism the norms and residuals run on all h of every token on every
    tensor-parallel rank (Megatron 2021); with it on h / tp."""
    h_rank = shape.d_model / (tp if sequence_parallel else 1)
    hidden = (NORM_AND_ADD_PASSES + (DROPOUT_PASSES if shape.dropout else 0)) * h_rank
    hidden += ACTIVATION_PASSES[shape.mlp] * mlp_width_active(shape, block) / tp
    if shape.attention == "eager":
        scores = shape.n_head / tp * shape.seq_len
        hidden += (SOFTMAX_PASSES + (ATTENTION_DROPOUT_PASSES if shape.dropout else 0)) * scores
    return 2.0 * tokens * act_bytes * hidden  # a pass reads and writes: 2 accesses of each element


def head_elementwise_bytes(shape, tokens: int, tp: int = 1) -> float:
    """Bytes the head's float32 logits move through HBM on one of tp ranks (forward and backward)."""
    return 2.0 * LOGIT_PASSES * tokens * 4 * shape.vocab_size / tp
