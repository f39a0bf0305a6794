"""The vocabulary split over a tensor-parallel group: the token embedding (each rank holds a block of
rows) and the cross-entropy over logits whose vocabulary dimension is split the same way, computed
without ever gathering the full logits (a (tokens, vocab) tensor, the largest activation of a GPT).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ... import comm
from ...comm.types import ReduceOp
from .tensor import (check_divides, group_rank, group_size, reduce_from_tensor_region,
                     reduce_scatter_to_sequence_shards, shard_rows)


def vocab_range(vocab_size: int, group) -> tuple[int, int]:
    """[start, end) of the vocabulary block this rank of `group` owns (tp must divide vocab_size)."""
    per = vocab_size // group_size(group)
    start = group_rank(group) * per
    return start, start + per


class VocabParallelEmbedding(nn.Module):
    """nn.Embedding(num_embeddings, embedding_dim) with its rows split over `group`: rank r holds rows
    vocab_range(num_embeddings). forward: idx (...) int64, the same on every rank of the group; each rank
    looks up the tokens it owns (zeros for the others) and the partial results are summed over the
    group: output (..., embedding_dim), replicated; with sequence_parallel the sum is reduce-scattered
    along seq_dim (tp must divide that size) and this rank gets its sequence shard.

    Token ids outside [0, num_embeddings) are not detected (they embed as zeros). Requires
    num_embeddings % tp == 0. Initialisation: normal(0, 1) like nn.Embedding, drawn for the full table
    and sliced (seed all ranks alike); load_full_ copies the slice of an existing table.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, group=None, sequence_parallel: bool = False,
                 seq_dim: int = 1):
        super().__init__()
        check_divides(num_embeddings, group_size(group), "num_embeddings", "VocabParallelEmbedding")
        self.group, self.tp = group, group_size(group)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.sequence_parallel, self.seq_dim = bool(sequence_parallel), seq_dim
        self.start, self.end = vocab_range(num_embeddings, group)
        self.weight = nn.Parameter(torch.empty(self.end - self.start, embedding_dim))
        self.load_full_(nn.Embedding(num_embeddings, embedding_dim).weight)

    @torch.no_grad()
    def load_full_(self, weight: torch.Tensor):
        """Copies this rank's rows of a full table (num_embeddings, embedding_dim)."""
        self.weight.copy_(shard_rows(weight, self.tp, group_rank(self.group)))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        foreign = (idx < self.start) | (idx >= self.end)
        partial = F.embedding((idx - self.start).masked_fill(foreign, 0), self.weight)
        partial = partial.masked_fill(foreign.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return reduce_scatter_to_sequence_shards(partial, self.group, self.seq_dim)
        return reduce_from_tensor_region(partial, self.group)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, rows [{self.start}, {self.end}), tp={self.tp}, "
                f"sequence_parallel={self.sequence_parallel}")


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, targets: torch.Tensor, group=None,
                                 reduction: str = "mean") -> torch.Tensor:
    """Mean cross-entropy over all tokens, as models.lm_loss (F.cross_entropy) gives on the full logits;
    reduction="none": the loss of every token instead, shaped like `targets` (a caller that ignores some
    tokens masks them and takes its own mean: parallel/hf/hf_layers.py).

    local_logits: (..., V / tp), this rank's block vocab_range(V) of the vocabulary (a vocab-parallel
    head's output); targets: (...) int64 in [0, V), the same on every rank. Every rank of `group` must
    call it; every rank gets the same scalar (float32, or float64 for float64 logits), and backward
    gives each rank the gradient of its own block only.

    Two all-reduces of one or two values per token, never of the logits: the global max (MAX; subtracted
    so that exp cannot overflow, and detached: the loss does not depend on it), then the sum of
    exponentials with the target's logit (SUM: only the rank owning the target contributes, the others
    zero).
    """
    if reduction not in ("mean", "none"):
        raise ValueError(f"vocab_parallel_cross_entropy: reduction={reduction!r}; use 'mean' or 'none'")
    if targets.shape != local_logits.shape[:-1]:
        raise ValueError(f"vocab_parallel_cross_entropy: targets has shape {tuple(targets.shape)} but must be "
                         f"local_logits.shape[:-1] = {tuple(local_logits.shape[:-1])}")
    logits = local_logits.reshape(-1, local_logits.shape[-1])
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()  # 16-bit logits: softmax in float32, as lm_loss does
    targets_shape, targets = targets.shape, targets.reshape(-1)
    per = logits.shape[-1]
    start = group_rank(group) * per

    with torch.no_grad():
        global_max = logits.max(dim=-1).values
        if group_size(group) > 1:
            comm.all_reduce(global_max, op=ReduceOp.MAX, group=group)
    shifted = logits - global_max.unsqueeze(-1)
    foreign = (targets < start) | (targets >= start + per)
    local_target = (targets - start).masked_fill(foreign, 0)
    picked = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(foreign, 0.0)
    # One all-reduce for both sums: (tokens, 2) = [sum of exp | target logit] per token.
    sum_exp, target_logit = reduce_from_tensor_region(torch.stack([shifted.exp().sum(dim=-1), picked], -1),
                                                      group).unbind(-1)
    per_token = sum_exp.log() - target_logit
    return per_token.mean() if reduction == "mean" else per_token.view(targets_shape)
