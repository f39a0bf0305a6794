"""The GPT of models/gpt.py sharded over a tensor-parallel group (Megatron-LM's layout), optionally with
sequence parallelism: tensor_parallel_gpt(model, group) gives a TensorParallelGPT holding this rank's
shards of `model`'s weights, so that it computes the same loss and its gradients are the matching
slices of the full model's.

    embed.tok   vocab-parallel rows            qkv  column-parallel, by heads within each of q, k, v
    embed.pos   replicated                     proj row-parallel
    ln1/ln2/ln  replicated                     fc   column-parallel, out row-parallel
    head.lm     column-parallel on the vocabulary: local logits, loss by vocab_parallel_cross_entropy

Without sequence parallelism the residual stream (B, T, d) is replicated between TP regions. With it,
each rank holds (B, T / tp, d): positions [r T / tp, (r + 1) T / tp). Layer norms, residual adds and the
position embedding then see a different shard on every rank, so their replicated parameters' gradients
are summed over the group, in backward: [Note: sequence-parallel gradients] below.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...models.gpt import GPT, GPTConfig
from ..data_parallel.clip import clip_grad_norm_
from .tensor import (ColumnParallelLinear, RowParallelLinear, check_divides, copy_to_tensor_region, group_rank,
                     group_size)
from .tensor_state import replicated_parameter_names
from .vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy

# [Note: sequence-parallel gradients]
# A replicated parameter applied to a sequence shard (layer norms, the row-parallel biases, the position
# embedding) gets on each rank the gradient of that rank's positions only; the true gradient is their sum.
# Megatron all-reduces these gradients after backward. Here the parameter enters the forward through
# copy_to_tensor_region (identity forward, all-reduce backward), so the sum is taken inside autograd,
# before any gradient hook: DDP and ZeRO over a data-parallel group see the summed gradient and need no
# extra call. The cost is one small all-reduce per such parameter per backward instead of one bucket.


class SequenceParallelLayerNorm(nn.LayerNorm):
    """nn.LayerNorm(normalized_shape) applied to this rank's sequence shard; weight and bias are
    replicated and their gradients summed over `group` ([Note: sequence-parallel gradients])."""

    def __init__(self, normalized_shape: int, group=None):
        super().__init__(normalized_shape)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, copy_to_tensor_region(self.weight, self.group),
                            copy_to_tensor_region(self.bias, self.group), self.eps)


def _layer_norm(d: int, group, sequence_parallel: bool) -> nn.LayerNorm:
    return SequenceParallelLayerNorm(d, group) if sequence_parallel else nn.LayerNorm(d)


class TensorParallelEmbedding(nn.Module):
    """Vocab-parallel token embedding plus replicated positions: (B, T) int64 -> (B, T, d), or this rank's
    (B, T / tp, d) with sequence parallelism."""

    def __init__(self, cfg: GPTConfig, group, sequence_parallel: bool):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.tok = VocabParallelEmbedding(cfg.vocab_size, cfg.d_model, group, sequence_parallel)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)
        if not self.sequence_parallel:
            return x + self.pos(torch.arange(idx.shape[1], device=idx.device))
        s = x.shape[1]
        positions = torch.arange(group_rank(self.group) * s, (group_rank(self.group) + 1) * s, device=idx.device)
        return x + F.embedding(positions, copy_to_tensor_region(self.pos.weight, self.group))


class TensorParallelBlock(nn.Module):
    """models.Block with n_head / tp heads and d_model * mlp_ratio / tp MLP columns on this rank:
    (B, T, d) -> (B, T, d), or (B, T / tp, d) -> (B, T / tp, d) with sequence parallelism."""

    def __init__(self, cfg: GPTConfig, group, sequence_parallel: bool):
        super().__init__()
        d, sp = cfg.d_model, sequence_parallel
        self.local_heads = cfg.n_head // group_size(group)
        self.local_width = d // group_size(group)
        self.ln1 = _layer_norm(d, group, sp)
        self.qkv = ColumnParallelLinear(d, 3 * d, group, chunks=3, sequence_parallel=sp)
        self.proj = RowParallelLinear(d, d, group, sequence_parallel=sp)
        self.ln2 = _layer_norm(d, group, sp)
        self.fc = ColumnParallelLinear(d, cfg.mlp_ratio * d, group, sequence_parallel=sp)
        self.out = RowParallelLinear(cfg.mlp_ratio * d, d, group, sequence_parallel=sp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(self.ln1(x))  # (B, T, 3 d / tp): [this rank's q heads | k heads | v heads]
        b, t, w = qkv.shape[0], qkv.shape[1], self.local_width
        shape = (b, t, self.local_heads, w // self.local_heads)
        q, k, v = (z.reshape(shape).transpose(1, 2) for z in qkv.split(w, dim=2))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, w))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TensorParallelHead(nn.Module):
    """Final norm and the vocab-parallel projection: (B, T, d) (or its sequence shard) -> this rank's
    logits (B, T, vocab / tp) over the whole sequence."""

    def __init__(self, cfg: GPTConfig, group, sequence_parallel: bool):
        super().__init__()
        self.ln = _layer_norm(cfg.d_model, group, sequence_parallel)
        self.lm = ColumnParallelLinear(cfg.d_model, cfg.vocab_size, group, bias=False,
                                       sequence_parallel=sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm(self.ln(x))


def check_tensor_parallel_config(cfg: GPTConfig, tp: int, sequence_parallel: bool):
    """ValueError naming the GPTConfig field that tp does not divide (n_head, d_model * mlp_ratio,
    vocab_size, and seq_len with sequence parallelism)."""
    who = f"tensor parallelism over {tp} ranks"
    check_divides(cfg.n_head, tp, "n_head", who)
    check_divides(cfg.d_model * cfg.mlp_ratio, tp, "d_model * mlp_ratio", who)
    check_divides(cfg.vocab_size, tp, "vocab_size", who)
    if sequence_parallel:
        check_divides(cfg.seq_len, tp, "seq_len", who + " with sequence_parallel=True")


class TensorParallelGPT(nn.Module):
    """models.GPT sharded over `group` (see the module docstring); same submodule names as GPT.

    forward(idx (B, T) int64, the same on every rank of the group; with sequence parallelism tp must
    divide T) -> this rank's logits (B, T, vocab / tp); loss(idx, targets) -> the mean next-token
    cross-entropy, the same as lm_loss on the full logits. All ranks of `group` construct it and call
    forward and backward together. Build it with tensor_parallel_gpt(model, group) for the weights of an
    existing GPT; constructed directly, its weights are initialised afresh (not GPT's initialisation).
    """

    def __init__(self, cfg: GPTConfig, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.cfg, self.group, self.tp = cfg, group, group_size(group)
        self.sequence_parallel = bool(sequence_parallel)
        check_tensor_parallel_config(cfg, self.tp, self.sequence_parallel)
        self.embed = TensorParallelEmbedding(cfg, group, self.sequence_parallel)
        self.blocks = nn.ModuleList(TensorParallelBlock(cfg, group, self.sequence_parallel)
                                    for _ in range(cfg.n_layer))
        self.head = TensorParallelHead(cfg, group, self.sequence_parallel)

    @torch.no_grad()
    def load_full_(self, model: GPT):
        """Copies this rank's shards of `model`'s weights (a GPT of the same config)."""
        full = dict(model.named_modules())
        for name, m in self.named_modules():
            if isinstance(m, (ColumnParallelLinear, RowParallelLinear)):
                m.load_full_(full[name].weight, full[name].bias)
            elif isinstance(m, VocabParallelEmbedding):
                m.load_full_(full[name].weight)
            elif isinstance(m, (nn.LayerNorm, nn.Embedding)):
                m.load_state_dict(full[name].state_dict())

    def replicated_parameter_names(self) -> list[str]:
        """Names of the parameters every rank of the group holds whole, with equal gradients after
        backward (layer norms, the position embedding, the row-parallel biases); the others are shards."""
        return replicated_parameter_names(self)

    def sequence_parallel_parameters(self) -> list[str]:
        """Names of the replicated parameters whose gradients backward sums over the group: all of them
        with sequence parallelism, none without ([Note: sequence-parallel gradients])."""
        return self.replicated_parameter_names() if self.sequence_parallel else []

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Scales the gradients so that the 2-norm of the full model's gradient is at most max_norm (shards
        summed over the group, replicated parameters counted once); returns the norm before clipping
        (float32 0-dim CPU tensor, the same on every rank). Every rank of the group calls it. Under DDP
        over a data-parallel group the replicas' gradients are equal, so this is the global norm too."""
        whole = set(self.replicated_parameter_names())
        named = list(self.named_parameters())
        return clip_grad_norm_([p.grad for n, p in named if n not in whole], max_norm, group=self.group,
                               replicated=[p.grad for n, p in named if n in whole])

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.dim() != 2 or idx.shape[1] > self.cfg.seq_len:
            raise ValueError(f"idx must be (batch, T) with T <= seq_len={self.cfg.seq_len}, got {tuple(idx.shape)}")
        if self.sequence_parallel and idx.shape[1] % self.tp:
            raise ValueError(f"idx has T={idx.shape[1]} positions; with sequence_parallel=True the tensor-parallel "
                             f"size {self.tp} must divide T")
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def as_sequential(self) -> nn.Sequential:
        """The same modules (shared parameters) as nn.Sequential(embed, *blocks, head), for pipeline
        stages: each stage's output is the residual stream (or its sequence shard), the last one this
        rank's logits."""
        return nn.Sequential(self.embed, *self.blocks, self.head)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy over all B * T tokens (targets (B, T) int64), like lm_loss."""
        return vocab_parallel_cross_entropy(self(idx), targets, self.group)


def tensor_parallel_gpt(model: GPT, group=None, sequence_parallel: bool = False) -> TensorParallelGPT:
    """A new TensorParallelGPT over `group` (None: the default group) holding this rank's shards of
    `model`'s weights, on its device and in its dtype; `model` is left unchanged. Every rank of `group` must call it with equal models.
    Raises ValueError when the group size does not divide cfg.n_head, cfg.d_model * cfg.mlp_ratio,
    cfg.vocab_size, or (sequence_parallel=True) cfg.seq_len."""
    if not isinstance(model, GPT):
        raise TypeError(f"tensor_parallel_gpt: model must be a ringzero.models.GPT, got {type(model).__name__}")
    check_tensor_parallel_config(model.cfg, group_size(group), sequence_parallel)
    like = next(model.parameters())
    tp_model = TensorParallelGPT(model.cfg, group, sequence_parallel).to(like.device, like.dtype)
    tp_model.load_full_(model)
    return tp_model
