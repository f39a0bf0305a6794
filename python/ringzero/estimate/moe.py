"""Mixture-of-experts on the model side of the estimate: which blocks route their MLP to experts, how a
block's parameters split into experts (sharded over the ep ranks) and the rest (replicated: attention,
norms, router, shared experts), and the activations a MoE block keeps for its routed tokens.

Uniform routing is assumed throughout: every expert receives tokens * top_k / E copies, so each rank of an
ep group computes as many copies as it sends away, and nothing is dropped (dropless, as ringzero's
MoEFeedForward runs by default; a capacity factor would drop nothing under uniform routing either).
"""
from __future__ import annotations

import dataclasses

from .checks import positive_ints

ROUTER_STATE_BYTES = 4
"""The router's softmax over E logits is kept in float32 (ringzero's MoEFeedForward; Mixtral's code too)."""


@dataclasses.dataclass(frozen=True)
class MoE:
    """The mixture-of-experts part of a ModelShape (ModelShape.moe); the experts are MLPs of the model's
    `mlp` kind without biases, as ringzero.models.MoEConfig builds them."""

    experts: int
    """Routed experts E in each MoE block."""
    top_k: int
    """Experts each token is sent to (Mixtral 2, DeepSeek-V3 8); at most `experts`."""
    expert_width: int
    """Hidden width of one expert MLP (Mixtral 14336, DeepSeek-V3 2048)."""
    every: int = 1
    """Block i (from 0) is a MoE block when i >= first_dense and (i + 1) % every == 0: 1 every block, 2 every
    other (ringzero.models.MoEConfig.every's rule)."""
    first_dense: int = 0
    """Leading blocks that keep the dense MLP (DeepSeek-V3: 3)."""
    shared_experts: int = 0
    """Experts every token passes through beside its routed ones (DeepSeek-V3: 1), each expert_width wide;
    replicated and data parallel like attention, not sharded over ep."""

    def __post_init__(self):
        positive_ints("moe ", experts=self.experts, top_k=self.top_k, expert_width=self.expert_width,
                      every=self.every)
        for name in ("first_dense", "shared_experts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"moe {name} must be an int >= 0, got {v!r}")
        if self.top_k > self.experts:
            raise ValueError(f"moe top_k ({self.top_k}) exceeds the experts ({self.experts})")

    def is_moe(self, block: int) -> bool:
        """Whether block `block` (0-based) routes its MLP to experts."""
        return block >= self.first_dense and (block + 1) % self.every == 0

    def count(self, start: int, stop: int) -> int:
        """MoE blocks among blocks start .. stop - 1 (a pipeline stage's)."""
        return sum(self.is_moe(i) for i in range(start, stop))

    def check_layout(self, ep: int, tp: int, zeropp: str) -> None:
        """ValueError, one line naming the rule, unless the E experts split evenly over `ep` ranks and the
        layout is one this model covers (tp == 1; no ZeRO++)."""
        if self.experts % ep:
            raise ValueError(f"experts ({self.experts}) not divisible by ep ({ep})")
        if tp > 1:
            raise ValueError(f"tp={tp} with a mixture-of-experts model is not modelled (expert tensor parallelism): "
                             "use tp=1")
        if zeropp:
            raise ValueError(f"zeropp={zeropp!r} with a mixture-of-experts model is not modelled")

    def describe(self) -> str:
        which = "every block" if self.every == 1 else f"every {self.every}th block"
        which += f" after the first {self.first_dense}" if self.first_dense else ""
        shared = f" + {self.shared_experts} shared" if self.shared_experts else ""
        return f"MoE {self.experts} experts{shared} of {self.expert_width}, top-{self.top_k}, {which}"


def expert_params(shape) -> int:
    """Parameters of one expert of `shape` (a ModelShape with moe): its MLP's matrices, no biases."""
    return shape.mlp_matrices * shape.d_model * shape.moe.expert_width


def moe_block_params(shape, ep: int = 1) -> tuple[int, int]:
    """(replicated, experts on one of ep ranks) of one MoE block: the dense block without its MLP, plus the
    router (E x h) and the shared experts; and E / ep experts."""
    moe = shape.moe
    replicated = (shape.layer_params() - shape.mlp_params() + moe.experts * shape.d_model
                  + moe.shared_experts * expert_params(shape))
    return replicated, moe.experts // ep * expert_params(shape)


def blocks_params(shape, start: int, stop: int, ep: int = 1, tp: int = 1) -> tuple[int, int]:
    """(replicated, experts per rank) of blocks start .. stop - 1 on one rank; a dense shape has no experts."""
    n = stop - start
    if shape.moe is None:
        return n * shape.layer_params(tp), 0
    k = shape.moe.count(start, stop)
    replicated, experts = moe_block_params(shape, ep)
    return (n - k) * shape.layer_params(tp) + k * replicated, k * experts


def active_params(shape) -> int:
    """Parameters one token passes through: every replicated parameter and top_k experts per MoE block
    (the 'active' count of the Mixtral and DeepSeek-V3 papers)."""
    replicated, _ = blocks_params(shape, 0, shape.n_layer)
    routed = shape.moe.count(0, shape.n_layer) * shape.moe.top_k * expert_params(shape) if shape.moe else 0
    return shape.embedding_params() + replicated + routed + shape.head_params()


def routed_activation_bytes(shape, micro_batch: int, act_bytes: int, recompute: str) -> int:
    """What a MoE block keeps for backward beyond the dense block's activations with its MLP terms removed,
    for `micro_batch` sequences (sb tokens) on one rank, under uniform routing:
      the router's float32 probabilities                  4 sbE
      the routed copies the rank's experts compute         e sbk h   (their input, k = top_k)
      each expert MLP's kept tensors                       MLP_KEPT e sbk w_e
      the expert outputs, kept for the combine's weights   e sbk h
      the shared experts                                   e sb (h + MLP_KEPT w_e) each
    The block's MLP input (the router's and dispatch's input) stays in the dense terms. 'full' recomputation
    keeps only the block input, so nothing is added; 'selective' drops only attention's s^2 terms."""
    if recompute == "full":
        return 0
    moe, sb, e = shape.moe, shape.seq_len * micro_batch, act_bytes
    copies = sb * moe.top_k
    per_copy = e * (2 * shape.d_model + shape.mlp_kept * moe.expert_width)
    shared = moe.shared_experts * e * sb * (shape.d_model + shape.mlp_kept * moe.expert_width)
    dense_mlp = e * sb * shape.mlp_kept * shape.width
    return ROUTER_STATE_BYTES * sb * moe.experts + copies * per_copy + shared - dense_mlp


def routed_working_bytes(shape, micro_batch: int, act_bytes: int) -> int:
    """Gradients in flight through one MoE block's experts: the routed copies' hidden layer (sbk w_e) and
    the shared experts', in place of the dense MLP's sbw (ModelShape.backward_working_bytes)."""
    moe, sb = shape.moe, shape.seq_len * micro_batch
    return act_bytes * sb * moe.expert_width * (moe.top_k + moe.shared_experts)
