"""The model side of the estimate: parameter counts of a GPT-style decoder and the bytes of activations
it keeps for the backward pass, per layer, after Korthikanti et al. 2022.

Notation as in the paper: s sequence length, b micro-batch (sequences), h hidden size, a attention heads,
V vocabulary; e is the bytes of one activation element (2 in the paper, which also counts 1-byte dropout
masks). Per-row statistics (layer-norm mean and rstd, attention logsumexp: sizes sb and asb) are left
out, as in the paper.

Tensor parallelism (t ranks, Megatron's scheme; every method takes tp=t and sequence_parallel) splits
the attention heads and the MLP's hidden units: qkv and fc by output columns, proj and out by input
rows; their weights, the column-split biases and the vocabulary (token table, output projection) are
divided by t; layer norms, the row-split layers' biases and the positions stay whole on every rank.
See layer_activation_bytes for what t and sequence parallelism do to the activations.
"""
from __future__ import annotations

import dataclasses

from ..models.gpt import RECOMPUTE_KINDS
from .checks import positive_ints
from .moe import MoE, blocks_params

ACTIVATION_FORMULA = ("Korthikanti et al. 2022, 'Reducing Activation Recomputation in Large Transformer "
                      "Models': 34sbh + 5as^2b bytes per layer with 16-bit activations and dropout")

ATTENTION_KINDS = ("eager", "flash")
MLP_KINDS = ("gelu", "gelu_new", "swiglu")
"""What the MLP keeps per hidden unit, by kind: 'gelu' a fused GeLU (its input and output: 2 widths),
'gelu_new' GPT-2's tanh GeLU written as Python ops (four intermediates and the output: 5), 'swiglu' a gated
MLP, down(silu(gate(x)) * up(x)) (the gate, its silu, up and the product: 4) with three weight matrices."""
NORM_KINDS = ("layer", "rms")
"""'layer': a fused LayerNorm (weight and bias; keeps its input and per-row statistics); 'rms': an RMSNorm
written as Python ops, as transformers' Llama-family models have it (weight only; keeps its input and the
normalised input as well)."""
POSITION_KINDS = ("learned", "rotary")
BIAS_KINDS = ("all", "qkv", "none")
"""Which linear layers have biases: 'all' (GPT, GPT-2), 'qkv' (only q, k and v: Qwen2), 'none' (Llama)."""
MLP_KEPT = {"gelu": 2, "gelu_new": 5, "swiglu": 4}


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
    kv_heads: int | None = None
    """Key/value heads (grouped-query attention); None: n_head."""
    mlp_width: int | None = None
    """The MLP's hidden width (transformers' intermediate_size); None: mlp_ratio * d_model."""
    mlp: str = "gelu"
    """One of MLP_KINDS."""
    norm: str = "layer"
    """One of NORM_KINDS."""
    positions: str = "learned"
    """'learned' (a table of seq_len x h parameters) or 'rotary' (no parameters)."""
    bias: str = "all"
    """One of BIAS_KINDS."""
    head_dim: int | None = None
    """Width of one attention head; None: d_model / n_head. Set where the heads' width differs from the
    hidden size (the DeepSeek-V3 preset: 128 heads x 128)."""
    attention_params: int | None = None
    """Parameters of one block's attention where it is not multi-head attention over the heads above
    (DeepSeek-V3's MLA: its low-rank projections and their norms); None: q, k, v and proj from the heads.
    The activations still follow the heads (an approximation, said in the report)."""
    moe: MoE | None = None
    """Mixture of experts (estimate/moe.py); None: every block has the dense MLP."""

    def __post_init__(self):
        positive_ints("model ", **{k: getattr(self, k) for k in
                                   ("n_layer", "d_model", "n_head", "vocab_size", "seq_len", "mlp_ratio")})
        if self.head_dim is None and self.d_model % self.n_head:
            raise ValueError(f"model n_head={self.n_head} must divide d_model (hidden)={self.d_model}; "
                             f"choose heads among the divisors of {self.d_model}")
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"model attention={self.attention!r}: use one of {ATTENTION_KINDS}")
        for name, kinds in (("mlp", MLP_KINDS), ("norm", NORM_KINDS), ("positions", POSITION_KINDS),
                            ("bias", BIAS_KINDS)):
            if getattr(self, name) not in kinds:
                raise ValueError(f"model {name}={getattr(self, name)!r}: use one of {kinds}")
        for name in ("kv_heads", "mlp_width", "head_dim", "attention_params"):
            if getattr(self, name) is not None:
                positive_ints("model ", **{name: getattr(self, name)})
        if self.n_head % self.kv:
            raise ValueError(f"model kv_heads={self.kv_heads} must divide n_head={self.n_head}")

    @property
    def kv(self) -> int:
        """Key/value heads."""
        return self.kv_heads or self.n_head

    @property
    def kv_dim(self) -> int:
        """Width of the keys (and of the values): kv heads x head size."""
        return self.kv * self.head_size

    @property
    def head_size(self) -> int:
        """Width of one attention head."""
        return self.head_dim or self.d_model // self.n_head

    @property
    def q_dim(self) -> int:
        """Width of the queries (and of the proj input): heads x head size (the hidden size unless head_dim
        says otherwise)."""
        return self.n_head * self.head_size

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of one MLP: gate, up and down (swiglu), else in and out."""
        return 3 if self.mlp == "swiglu" else 2

    @property
    def mlp_kept(self) -> int:
        """Tensors of the MLP's hidden width kept for backward (MLP_KEPT)."""
        return MLP_KEPT[self.mlp]

    @property
    def width(self) -> int:
        """The MLP's hidden width."""
        return self.mlp_width or self.mlp_ratio * self.d_model

    @property
    def norm_params(self) -> int:
        """Parameters of one norm: weight and bias (layer), weight (rms)."""
        return (2 if self.norm == "layer" else 1) * self.d_model

    @classmethod
    def from_hf_config(cls, config, seq_len: int) -> "ModelShape":
        """The shape of a transformers causal LM of `config` (model_type llama, mistral, qwen2 or gpt2) on
        sequences of seq_len tokens, as ringzero.models.hf builds and runs it: PyTorch's SDPA attention
        ('flash': no s x s matrix), the family's norms, MLP, positions and biases, and dropout only where
        the config has a nonzero dropout probability. config: a transformers config, or the dict of its
        config.json (GPT-2's names n_embd, n_layer, n_head too; transformers need not be installed).
        ValueError for another model_type or a missing field."""
        get = _config_reader(config)
        kind = get("model_type")
        if kind not in ("gpt2", "llama", "mistral", "qwen2"):
            raise ValueError(f"model_type={kind!r}: the estimator knows llama, mistral, qwen2 and gpt2 shapes")
        h, heads = get("hidden_size", "n_embd"), get("num_attention_heads", "n_head")
        attn = get("_attn_implementation", default=None)
        common = dict(n_layer=get("num_hidden_layers", "n_layer"), d_model=h, n_head=heads,
                      vocab_size=get("vocab_size"), seq_len=seq_len,
                      tied_embeddings=bool(get("tie_word_embeddings", default=kind == "gpt2")),
                      attention="eager" if attn == "eager" else "flash")
        if kind == "gpt2":
            drops = [get(k, default=0.1) for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")]
            return cls(**common, mlp_width=get("n_inner", default=None) or 4 * h, mlp="gelu_new", dropout=any(drops))
        return cls(**common, kv_heads=get("num_key_value_heads", default=None) or heads,
                   mlp_width=get("intermediate_size"), mlp="swiglu", norm="rms", positions="rotary",
                   bias="qkv" if kind == "qwen2" else "none", dropout=bool(get("attention_dropout", default=0.0)))

    @classmethod
    def from_gpt_config(cls, cfg) -> "ModelShape":
        """The shape of ringzero.models.GPT(cfg): untied head, no dropout, scaled_dot_product_attention."""
        return cls(n_layer=cfg.n_layer, d_model=cfg.d_model, n_head=cfg.n_head, vocab_size=cfg.vocab_size,
                   seq_len=cfg.seq_len, mlp_ratio=cfg.mlp_ratio, tied_embeddings=False, dropout=False,
                   attention="flash")

    def check_tp(self, tp: int) -> int:
        """tp if this model splits over tp tensor-parallel ranks (whole heads and MLP units per rank)."""
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp must be a positive int, got {tp!r}")
        if tp > 1 and self.attention_params is not None:
            raise ValueError(f"tp={tp}: the split of attention_params over tensor-parallel ranks is not modelled")
        if self.n_head % tp or self.kv % tp or self.width % tp:
            raise ValueError(f"tp={tp} must divide the heads ({self.n_head}), the key/value heads ({self.kv}) and "
                             f"the MLP width ({self.width}); choose tp among the divisors of {self.kv}")
        return tp

    # ---- parameters (per tensor-parallel rank) ------------------------------------------------------------
    def vocab_rows(self, tp: int = 1) -> int:
        """Rows of the token table (and untied head) a rank holds: V/t, rounded up (Megatron pads the
        vocabulary to a multiple of t)."""
        return -(-self.vocab_size // tp)

    def embedding_params(self, tp: int = 1) -> int:
        """Token table V*h (vocabulary-parallel: V/t rows per rank) plus learned positions s*h (whole)."""
        return (self.vocab_rows(tp) + (self.seq_len if self.positions == "learned" else 0)) * self.d_model

    def layer_params(self, tp: int = 1) -> int:
        """One block, with k the key/value width and w the MLP width: q and proj (h^2 each), k and v (hk
        each), the MLP (2hw, or 3hw gated), two norms; biases as `bias` says (q, k, v: h + 2k; proj: h;
        the MLP's input layers: w, or 2w gated; its output: h). GPT (k = h, w = rh, all biases, layer
        norms): qkv 3h^2+3h, proj h^2+h, fc rh^2+rh, out rh^2+h, norms 4h. Over t ranks the weight
        matrices and the column-split layers' biases (q, k, v and the MLP's input) are split; the norms
        and the row-split layers' biases (proj, the MLP's output) are not."""
        h, k, w, q = self.d_model, self.kv_dim, self.width, self.q_dim
        ins = self.mlp_matrices
        attention = 2 * h * q + 2 * h * k if self.attention_params is None else self.attention_params
        split = attention + ins * h * w
        whole = 2 * self.norm_params
        if self.bias in ("all", "qkv"):
            split += q + 2 * k
        if self.bias == "all":
            split += (ins - 1) * w
            whole += 2 * h
        return split // self.check_tp(tp) + whole

    def mlp_params(self) -> int:
        """The dense MLP of one block on one rank without tensor parallelism: its matrices, and its biases
        where `bias` is 'all' (what a MoE block replaces)."""
        return self.mlp_matrices * self.d_model * self.width + (
            (self.mlp_matrices - 1) * self.width + self.d_model if self.bias == "all" else 0)

    def head_params(self, tp: int = 1) -> int:
        """Final norm (whole) and, unless tied, the V*h projection (vocabulary-parallel)."""
        return self.norm_params + (0 if self.tied_embeddings else self.vocab_rows(tp) * self.d_model)

    def n_params(self) -> int:
        """Every distinct parameter once (a tied table counts once; every expert of a MoE model)."""
        return self.embedding_params() + sum(blocks_params(self, 0, self.n_layer)) + self.head_params()

    # ---- activations (bytes kept for backward) --------------------------------------------------------
    def layer_activation_bytes(self, micro_batch: int, act_bytes: int, recompute: str = "none", tp: int = 1,
                               sequence_parallel: bool = False) -> int:
        """Bytes one block keeps for its backward on one of tp ranks, for `micro_batch` sequences.

        Paper terms (e = act_bytes, r = mlp_ratio, masks 1 byte), one rank without parallelism:
          attention: e(sbh qkv input + 2sbh Q,K + sbh V + sbh proj input) + as^2b e softmax
                     + as^2b e softmax-dropout output + as^2b mask + sbh mask
          MLP:       e(sbh fc input + rsbh GeLU input + rsbh GeLU output) + sbh mask
          norms:     2e sbh (the inputs of the two layer norms)
        which for e=2, r=4 is 34sbh + 5as^2b. 'selective' recomputes the s^2 terms (34sbh), 'full'
        keeps only the block input (e sbh); flash attention never stores the s^2 terms.

        Over t tensor-parallel ranks (Korthikanti et al. 2022, section 4.2 and Table 2), derived term by
        term: a rank computes a/t heads and rh/t MLP units, so Q, K, V, the proj input, the GeLU input
        and output and the s^2 terms are 1/t each: (4 + 2r)e sbh/t + 5as^2b/t. The tensors before the
        column-split layers and after the row-split ones are whole on every rank: the two norm inputs,
        the qkv and fc inputs (4e sbh) and the two dropout masks (2sbh). With e=2, r=4 that is
        sbh(10 + 24/t + 5as/(ht)). Sequence parallelism splits exactly those whole tensors along the
        sequence (the norms and dropouts run on s/t tokens; the qkv and fc inputs are stored as the
        rank's s/t shard and all-gathered again in backward), so every term is 1/t: sbh/t (34 + 5as/h).
        Selective recomputation removes the s^2 terms from either: sbh(10 + 24/t), or 34sbh/t with
        sequence parallelism. Full recomputation keeps the block input, e sbh (the paper's 2sbh); with
        sequence parallelism that input is the rank's sequence shard, e sbh/t.

        Other shapes, term by term as above (k the key/value width, w the MLP width): Q and the proj input
        are e sbh each and K, V e sbk each; the MLP keeps MLP_KEPT[mlp] tensors of e sbw (2 for the GeLU
        above); an RMSNorm also keeps its normalised input (e sbh per norm, whole like the norm's input).
        Llama with w = 2h, k = h: 18 e sbh per block, as counted with saved-tensor hooks on transformers'
        LlamaDecoderLayer (tests/estimate/test_estimate_hf.py).
        """
        if recompute not in RECOMPUTE_KINDS:
            raise ValueError(f"recompute={recompute!r}: use one of {RECOMPUTE_KINDS}")
        t = self.check_tp(tp)
        shard = t if sequence_parallel else 1  # the divisor of what tensor parallelism leaves whole
        s, b, h, a, e = self.seq_len, micro_batch, self.d_model, self.n_head, act_bytes
        sbh, as2b = s * b * h, a * s * s * b
        if recompute == "full":
            return e * sbh // shard
        rms = 2 * e * sbh if self.norm == "rms" else 0  # the normalised inputs of RMSNorms written in Python
        whole = 4 * e * sbh + rms + (2 * sbh if self.dropout else 0)  # norm inputs, qkv and fc inputs, masks
        split = e * s * b * (2 * self.q_dim + 2 * self.kv_dim + MLP_KEPT[self.mlp] * self.width)  # Q, K, V, proj in, MLP
        if self.attention == "eager" and recompute == "none":
            split += e * as2b  # softmax output
            if self.dropout:
                split += e * as2b + as2b  # dropout output feeding the value matmul, and its mask
        return whole // shard + split // t

    def layer_recompute_peak_bytes(self, micro_batch: int, act_bytes: int, recompute: str, tp: int = 1,
                                   sequence_parallel: bool = False) -> int:
        """Extra bytes live while one block is recomputed in backward: with 'full', the whole block's
        activations (without recomputation) for one micro-batch; with 'selective', its s^2 terms."""
        if recompute == "none":
            return 0
        kept = [self.layer_activation_bytes(micro_batch, act_bytes, k, tp, sequence_parallel)
                for k in ("none", recompute)]
        return kept[0] - kept[1]

    def backward_working_bytes(self, micro_batch: int, act_bytes: int, tp: int = 1,
                               sequence_parallel: bool = False) -> int:
        """Gradients in flight while backward goes through one block, beyond the activations it frees:
        the MLP hidden layer's (sbw for width w = rh, split over tp) and the block's input and output
        gradients (2 sbh, sequence shards with sequence parallelism), e bytes each. Measured with
        ringzero.memory on ringzero's GPT block (tp=1): 5 to 6 sbh elements for r = 4."""
        sb_e = self.seq_len * micro_batch * act_bytes
        return self.width * sb_e // self.check_tp(tp) + 2 * self.d_model * sb_e // (tp if sequence_parallel else 1)

    def embedding_activation_bytes(self, micro_batch: int, tp: int = 1, sequence_parallel: bool = False) -> int:
        """Token ids (int64) the embedding keeps, plus the paper's 1-byte embedding-dropout mask (a
        sequence shard with sequence parallelism)."""
        sb = self.seq_len * micro_batch
        return 8 * sb + (sb * self.d_model // (tp if sequence_parallel else 1) if self.dropout else 0)

    def head_activation_bytes(self, micro_batch: int, act_bytes: int, tp: int = 1,
                              sequence_parallel: bool = False) -> int:
        """Final-norm input and projection input (e sbh each, and an RMSNorm's normalised input; sequence
        shards with sequence parallelism) and the float32 log-softmax of the logits kept by cross-entropy
        (4sbV, as the paper counts it; vocabulary-parallel: 4sbV/t)."""
        sb = self.seq_len * micro_batch
        kept = 3 if self.norm == "rms" else 2
        return (kept * act_bytes * sb * self.d_model // (tp if sequence_parallel else 1)
                + 4 * sb * self.vocab_rows(tp))

    def describe(self) -> str:
        tied = ", tied embeddings" if self.tied_embeddings else ""
        kv = f" ({self.kv} key/value)" if self.kv != self.n_head else ""
        mlp = f"mlp x{self.mlp_ratio}" if self.mlp_width is None else f"mlp {self.mlp_width}"
        mlp += "" if self.mlp == "gelu" else f" {self.mlp}"
        rest = "".join(f", {k} {v}" for k, v, default in (("norm", self.norm, "layer"), ("positions", self.positions,
                       "learned"), ("biases", self.bias, "all")) if v != default)
        rest += f", head size {self.head_dim}" if self.head_dim else ""
        rest += f", attention weights {self.attention_params} per block" if self.attention_params is not None else ""
        rest += f"; {self.moe.describe()}" if self.moe else ""
        return (f"{self.n_layer} layers, hidden {self.d_model}, {self.n_head} heads{kv}, vocab {self.vocab_size}, "
                f"seq {self.seq_len}, {mlp}{tied}, attention {self.attention}, "
                f"dropout {'on' if self.dropout else 'off'}{rest}")


_MISSING = object()


def _config_reader(config):
    """get(*names, default=...) over a transformers config or a config.json dict: the first name present."""
    def get(*names, default=_MISSING):
        for name in names:
            value = config.get(name, _MISSING) if isinstance(config, dict) else getattr(config, name, _MISSING)
            if value is not _MISSING:
                return value
        if default is _MISSING:
            raise ValueError(f"the model config has no {' or '.join(names)}")
        return default
    return get


def split_layers(n_layer: int, stages: int) -> list[int]:
    """Blocks per pipeline stage, contiguous and as even as possible (earlier stages take the extra)."""
    if stages > n_layer:
        raise ValueError(f"pipeline stages={stages} exceed the model's {n_layer} layers; use --pp <= {n_layer}")
    q, rem = divmod(n_layer, stages)
    return [q + (1 if i < rem else 0) for i in range(stages)]
