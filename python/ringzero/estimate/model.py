"""The model side of the estimate: parameter counts of a GPT-style decoder and the bytes of activations
it keeps for the backward pass, per layer, after Korthikanti et al. 2022.

Notation as in the paper: s sequence length, b micro-batch (sequences), h hidden size, a attention heads,
V vocabulary; e is the bytes of one activation element (2 in the paper, which also counts 1-byte dropout
masks). Per-row statistics (layer-norm mean and rstd, attention logsumexp: sizes sb and asb) are left
out, as in the paper.
"""
from __future__ import annotations

import dataclasses

from ..models.gpt import RECOMPUTE_KINDS
from .checks import positive_ints

ACTIVATION_FORMULA = ("Korthikanti et al. 2022, 'Reducing Activation Recomputation in Large Transformer "
                      "Models': 34sbh + 5as^2b bytes per layer with 16-bit activations and dropout")

ATTENTION_KINDS = ("eager", "flash")


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A GPT-style decoder: embedding (tokens, learned positions), n_layer pre-norm blocks, final norm
    and a vocabulary projection. Matches ringzero.models.GPT exactly when built by from_gpt_config."""

    n_layer: int
    """Transformer blocks."""
    d_model: int
    """Hidden size h."""
    n_head: int
    """Attention heads a; must divide d_model."""
    vocab_size: int
    """Vocabulary V (256 for ringzero's byte-level model)."""
    seq_len: int
    """Sequence length s: tokens per sample, also the number of learned positions."""
    mlp_ratio: int = 4
    """MLP hidden width as a multiple of h (the paper's formula assumes 4)."""
    tied_embeddings: bool = False
    """True when the output projection reuses the token embedding (GPT-2); ringzero's GPT does not."""
    dropout: bool = True
    """Whether the model applies dropout (the paper counts 1-byte masks); ringzero's GPT has none."""
    attention: str = "eager"
    """'eager' stores the s x s softmax (the paper); 'flash' (fused kernels such as torch's
    scaled_dot_product_attention) stores only its output, never an s x s matrix."""

    def __post_init__(self):
        positive_ints("model ", **{k: getattr(self, k) for k in
                                   ("n_layer", "d_model", "n_head", "vocab_size", "seq_len", "mlp_ratio")})
        if self.d_model % self.n_head:
            raise ValueError(f"model n_head={self.n_head} must divide d_model (hidden)={self.d_model}; "
                             f"choose heads among the divisors of {self.d_model}")
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"model attention={self.attention!r}: use one of {ATTENTION_KINDS}")

    @classmethod
    def from_gpt_config(cls, cfg) -> "ModelShape":
        """The shape of ringzero.models.GPT(cfg): untied head, no dropout, scaled_dot_product_attention."""
        return cls(n_layer=cfg.n_layer, d_model=cfg.d_model, n_head=cfg.n_head, vocab_size=cfg.vocab_size,
                   seq_len=cfg.seq_len, mlp_ratio=cfg.mlp_ratio, tied_embeddings=False, dropout=False,
                   attention="flash")

    # ---- parameters -------------------------------------------------------------------------------------
    def embedding_params(self) -> int:
        """Token table V*h plus learned positions s*h."""
        return (self.vocab_size + self.seq_len) * self.d_model

    def layer_params(self) -> int:
        """One block: qkv (3h^2+3h), proj (h^2+h), fc (rh^2+rh), out (rh^2+h), two norms (4h)."""
        h, r = self.d_model, self.mlp_ratio
        return (4 + 2 * r) * h * h + (9 + r) * h

    def head_params(self) -> int:
        """Final norm (2h) and, unless tied, the V*h projection."""
        return 2 * self.d_model + (0 if self.tied_embeddings else self.vocab_size * self.d_model)

    def n_params(self) -> int:
        """Every distinct parameter once (a tied table counts once)."""
        return self.embedding_params() + self.n_layer * self.layer_params() + self.head_params()

    # ---- activations (bytes kept for backward) --------------------------------------------------------
    def layer_activation_bytes(self, micro_batch: int, act_bytes: int, recompute: str = "none") -> int:
        """Bytes one block keeps for its backward, for `micro_batch` sequences of seq_len tokens.

        Paper terms (e = act_bytes, r = mlp_ratio, masks 1 byte):
          attention: e(sbh qkv input + 2sbh Q,K + sbh V + sbh proj input) + as^2b e softmax
                     + as^2b e softmax-dropout output + as^2b mask + sbh mask
          MLP:       e(sbh fc input + rsbh GeLU input + rsbh GeLU output) + sbh mask
          norms:     2e sbh
        which for e=2, r=4 is 34sbh + 5as^2b. 'selective' recomputes the s^2 terms (34sbh), 'full'
        keeps only the block input (e sbh); flash attention never stores the s^2 terms.
        """
        if recompute not in RECOMPUTE_KINDS:
            raise ValueError(f"recompute={recompute!r}: use one of {RECOMPUTE_KINDS}")
        s, b, h, a, r, e = self.seq_len, micro_batch, self.d_model, self.n_head, self.mlp_ratio, act_bytes
        sbh, as2b = s * b * h, a * s * s * b
        if recompute == "full":
            return e * sbh
        total = e * (8 + 2 * r) * sbh
        if self.dropout:
            total += 2 * sbh  # residual masks after attention and after the MLP
        if self.attention == "eager" and recompute == "none":
            total += e * as2b  # softmax output
            if self.dropout:
                total += e * as2b + as2b  # dropout output feeding the value matmul, and its mask
        return total

    def layer_recompute_peak_bytes(self, micro_batch: int, act_bytes: int, recompute: str) -> int:
        """Extra bytes live while one block is recomputed in backward: with 'full', the whole block's
        activations (without recomputation) for one micro-batch; with 'selective', its s^2 terms."""
        if recompute == "none":
            return 0
        whole = self.layer_activation_bytes(micro_batch, act_bytes, "none")
        return whole - self.layer_activation_bytes(micro_batch, act_bytes, recompute)

    def backward_working_bytes(self, micro_batch: int, act_bytes: int) -> int:
        """Gradients in flight while backward goes through one block, beyond the activations it frees:
        the MLP hidden layer's (r sbh) and the block's input and output gradients (2 sbh), e bytes each.
        Measured with ringzero.memory on ringzero's GPT block: 5 to 6 sbh elements for r = 4."""
        return (self.mlp_ratio + 2) * self.seq_len * micro_batch * self.d_model * act_bytes

    def embedding_activation_bytes(self, micro_batch: int) -> int:
        """Token ids (int64) the embedding keeps, plus the paper's 1-byte embedding-dropout mask."""
        sb = self.seq_len * micro_batch
        return 8 * sb + (sb * self.d_model if self.dropout else 0)

    def head_activation_bytes(self, micro_batch: int, act_bytes: int) -> int:
        """Final-norm input and projection input (e sbh each) and the float32 log-softmax of the
        logits kept by cross-entropy (4sbV, as the paper counts it)."""
        sb = self.seq_len * micro_batch
        return 2 * act_bytes * sb * self.d_model + 4 * sb * self.vocab_size

    def describe(self) -> str:
        tied = ", tied embeddings" if self.tied_embeddings else ""
        return (f"{self.n_layer} layers, hidden {self.d_model}, {self.n_head} heads, vocab {self.vocab_size}, "
                f"seq {self.seq_len}, mlp x{self.mlp_ratio}{tied}, attention {self.attention}, "
                f"dropout {'on' if self.dropout else 'off'}")


def split_layers(n_layer: int, stages: int) -> list[int]:
    """Blocks per pipeline stage, contiguous and as even as possible (earlier stages take the extra)."""
    if stages > n_layer:
        raise ValueError(f"pipeline stages={stages} exceed the model's {n_layer} layers; use --pp <= {n_layer}")
    q, rem = divmod(n_layer, stages)
    return [q + (1 if i < rem else 0) for i in range(stages)]
