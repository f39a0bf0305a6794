"""A small GPT-style decoder over bytes: the model of the training job, the parity tests and the
benchmarks. Built from three kinds of pieces (embedding, blocks, head) so that pipeline splitting can
cut it between blocks: GPT.as_sequential() returns the same modules as one nn.Sequential.

Activation recomputation (GPTConfig.recompute) lives inside Block.forward, so that it holds wherever a
Block runs: in GPT.forward, in a pipeline stage cut from as_sequential(), and under ZeRO-3, whose
gather/free hooks sit on the Block itself and so fire once per forward, never again for the
recomputation (see [Note: recompute inside the Block]).

MoEGPT (at the end) is the same model with the MLP of some blocks replaced by models/moe.py's mixture of
experts; GPT itself is unchanged by it.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .moe import Experts, MoEConfig, MoEFeedForward

RECOMPUTE_KINDS = ("none", "selective", "full")
"""What a Block recomputes in backward instead of keeping (Korthikanti et al. 2022's terms): none;
selective, the attention core between qkv and proj (the part whose eager form is s^2 per head);
full, the whole block from its input."""

@dataclasses.dataclass
class GPTConfig:
    vocab_size: int = 256
    """Tokens are bytes by default."""
    seq_len: int = 128
    """Longest context; positions are learned up to this length."""
    n_layer: int = 4
    """Number of transformer blocks."""
    n_head: int = 4
    """Attention heads per block; must divide d_model."""
    d_model: int = 256
    """Width of the residual stream."""
    mlp_ratio: int = 4
    """Hidden width of the MLP as a multiple of d_model."""
    recompute: str = "none"
    """One of RECOMPUTE_KINDS. Changes memory and compute only: losses and gradients are bitwise those of
    'none' (the recomputation repeats the same kernels on the same inputs; the model has no dropout)."""

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "n_layer", "n_head", "d_model", "mlp_ratio"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {v!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"GPTConfig.n_head={self.n_head} must divide d_model={self.d_model}")
        if self.recompute not in RECOMPUTE_KINDS:
            raise ValueError(f"GPTConfig.recompute={self.recompute!r}: use one of {', '.join(RECOMPUTE_KINDS)}")


class Embedding(nn.Module):
    """Token plus learned position embedding: (B, T) int64 -> (B, T, d_model)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        return self.tok(idx) + self.pos(torch.arange(t, device=idx.device))


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of (B, heads, T, head_dim) q, k, v: what 'selective' recomputes."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


# [Note: recompute inside the Block]
# Both recomputations use torch.utils.checkpoint's non-reentrant form around code *inside*
# Block.forward, never around a Block call: module hooks (ZeRO-3's gather before forward and free after
# it, FSDP2's the same) then run once per forward, and the recomputation in backward finds the weights
# that ZeRO-3's backward hook on the block output has already gathered. The non-reentrant form keeps
# the original autograd graph, so gradients still arrive through each parameter's AccumulateGrad and
# the DDP/ZeRO post-accumulate-grad hooks see them as without recomputation. Without grad (validation)
# nothing is checkpointed: there is no backward to recompute for.
class Block(nn.Module):
    """Pre-norm causal self-attention and MLP: (B, T, d) -> (B, T, d). recompute: see RECOMPUTE_KINDS."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.recompute = cfg.recompute
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.out = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute == "full" and torch.is_grad_enabled():
            return checkpoint(self._layer, x, use_reentrant=False)  # keeps only x
        return self._layer(x)

    def _layer(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attend(x)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        """The block's first half, x + attention(ln1(x)): (B, T, d) -> (B, T, d). MoEBlock shares it."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        shape = (b, t, self.n_head, d // self.n_head)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        if self.recompute == "selective" and torch.is_grad_enabled():
            a = checkpoint(attention_core, q, k, v, use_reentrant=False)  # keeps q, k, v, not its own state
        else:
            a = attention_core(q, k, v)
        return x + self.proj(a.transpose(1, 2).reshape(b, t, d))


class Head(nn.Module):
    """Final norm and projection to logits: (B, T, d) -> (B, T, vocab)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln = nn.LayerNorm(cfg.d_model)
        self.lm = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm(self.ln(x))


class GPT(nn.Module):
    """Embedding, n_layer blocks, head. forward(idx (B, T) int64) -> logits (B, T, vocab)."""

    def __init__(self, cfg: GPTConfig | None = None):
        super().__init__()
        self.cfg = cfg or GPTConfig()
        self.embed = Embedding(self.cfg)
        self.blocks = nn.ModuleList(self.make_block(i) for i in range(self.cfg.n_layer))
        self.head = Head(self.cfg)
        self.apply(self._init)

    def make_block(self, index: int) -> nn.Module:
        """Block `index` (from 0); MoEGPT overrides it."""
        return Block(self.cfg)

    def _init(self, m: nn.Module):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        # Residual projections scaled down with depth (GPT-2's initialisation).
        for name in ("proj", "out"):
            if isinstance(m, Block):
                nn.init.normal_(getattr(m, name).weight, std=0.02 / math.sqrt(2 * self.cfg.n_layer))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.dim() != 2 or idx.shape[1] > self.cfg.seq_len:
            raise ValueError(f"idx must be (batch, T) with T <= seq_len={self.cfg.seq_len}, got {tuple(idx.shape)}")
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def as_sequential(self) -> nn.Sequential:
        """The same modules (shared parameters) as nn.Sequential(embed, *blocks, head)."""
        return nn.Sequential(self.embed, *self.blocks, self.head)


class MoEBlock(Block):
    """Block whose MLP is a MoEFeedForward: (B, T, d) -> (B, T, d); the same attention (Block.attend) and
    recompute kinds. After each forward, self.moe.aux_loss holds its load-balancing loss."""

    def __init__(self, cfg: GPTConfig, moe: MoEConfig):
        super().__init__(cfg)
        del self.fc, self.out  # the dense MLP, replaced by the experts
        self.moe = MoEFeedForward(cfg.d_model, moe.hidden or cfg.mlp_ratio * cfg.d_model, moe)

    def _layer(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attend(x)
        return x + self.moe(self.ln2(x))


class MoEGPT(GPT):
    """GPT whose blocks i with moe.is_moe_layer(i) are MoEBlocks. forward(idx (B, T) int64) -> logits
    (B, T, vocab), as GPT; aux_loss() -> the sum of the MoE layers' load-balancing losses of that forward
    (already weighted by moe.aux_loss_coef), to add to the training loss:

        loss = lm_loss(model(x), y) + model.aux_loss()
    """

    def __init__(self, cfg: GPTConfig | None = None, moe: MoEConfig | None = None):
        self.moe_cfg = moe or MoEConfig()  # before GPT.__init__, whose make_block reads it
        super().__init__(cfg)

    def make_block(self, index: int) -> nn.Module:
        return MoEBlock(self.cfg, self.moe_cfg) if self.moe_cfg.is_moe_layer(index) else Block(self.cfg)

    def _init(self, m: nn.Module):
        # apply() visits children first: the experts, then the block that scales its residual projections.
        if isinstance(m, Experts):
            for p in m.parameters():
                nn.init.normal_(p, std=0.02)
        elif isinstance(m, MoEBlock):
            for p in (m.proj.weight, m.moe.experts.w_out):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * self.cfg.n_layer))
        else:
            super()._init(m)

    def moe_layers(self) -> list[MoEFeedForward]:
        """The MoE layers, in block order (the expert-parallel wrapper replaces their expert step)."""
        return [b.moe for b in self.blocks if isinstance(b, MoEBlock)]

    def aux_loss(self) -> torch.Tensor:
        """Sum of the MoE layers' aux_loss from the last forward (a scalar in that forward's graph)."""
        losses = [m.aux_loss for m in self.moe_layers()]
        if not losses or any(a is None for a in losses):
            raise RuntimeError("MoEGPT.aux_loss: call forward first (and build at least one MoE block: "
                               f"moe.every={self.moe_cfg.every} with n_layer={self.cfg.n_layer})")
        return torch.stack(losses).sum()


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy: logits (B, T, V), targets (B, T) int64."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
