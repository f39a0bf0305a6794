"""Megatron-style tensor parallelism on ringzero's collectives: the four conjugate region operators and
the two sharded linear layers built on them.

A tensor-parallel (TP) region is a stretch of compute where each rank of the TP group holds a slice of
the hidden dimension (some attention heads, some MLP columns). It is entered through a column-parallel
linear and left through a row-parallel one:

    operator                            forward                        backward
    copy_to_tensor_region       (f)     identity                       all-reduce SUM
    reduce_from_tensor_region   (g)     all-reduce SUM                 identity
    gather_from_sequence_shards         all-gather along `dim`         reduce-scatter along `dim`
    reduce_scatter_to_sequence_shards   reduce-scatter along `dim`     all-gather along `dim`
    split_to_sequence_shards            keep this rank's block         all-gather along `dim`
    gather_sequence_shards_replicated   all-gather along `dim`         keep this rank's block

The middle two replace f and g under sequence parallelism, where the activations between TP regions are
sharded along the sequence (each rank holds T / tp positions): all-gather + reduce-scatter move the
same bytes as the one all-reduce they replace, and layer norms and residuals run on 1/tp of the tokens.
The last two enter and leave a sequence-parallel stretch from and to a replicated activation (the
Hugging Face plans keep the embedding and the final norm replicated: parallel/hf/hf_layers.py).
Every operator is collective over its group: all ranks of `group` must call it with equal shapes. With
a group of one rank every operator is the identity.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ... import comm


def group_size(group) -> int:
    """Ranks in `group` (None: the default group)."""
    return dist.get_world_size(group)


def group_rank(group) -> int:
    """This rank's index in `group` (None: the default group)."""
    return dist.get_rank(group)


def check_divides(value: int, parts: int, arg: str, who: str, parts_are: str = "the tensor-parallel size"):
    """ValueError naming `arg` unless `parts` divides `value`."""
    if value % parts:
        raise ValueError(f"{who}: {arg}={value} must be divisible by {parts} ({parts_are}) so that every rank "
                         "holds an equal shard")


# ---- the collectives, along any dimension -------------------------------------------------------
# ringzero's all-gather and reduce-scatter work on the leading dimension of contiguous memory (rank r's
# block is the r-th contiguous block), so a gather along `dim` moves `dim` to the front first.
# A tensor on the meta device (a pipeline stage inferring its output shape) gets the result's shape
# and no communication: the other ranks are not inferring at the same moment.

def _identity(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    return x.view_as(x)


def _all_reduce_sum(x: torch.Tensor, group, dim: int = 0) -> torch.Tensor:
    out = x.contiguous().clone()  # the all-reduce works in place; never in the caller's tensor
    if not out.is_meta:
        comm.all_reduce(out, group=group)
    return out


def _all_gather(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    front = x.movedim(dim, 0).contiguous()
    out = front.new_empty((group_size(group) * front.shape[0], *front.shape[1:]))
    if not out.is_meta:
        comm.all_gather_into_tensor(out, front, group=group)
    return out.movedim(0, dim)


def _reduce_scatter(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    world = group_size(group)
    if x.shape[dim] % world:
        raise ValueError(f"reduce_scatter_to_sequence_shards: dimension {dim} has size {x.shape[dim]}, which the "
                         f"group size {world} must divide (the sequence length must be a multiple of tp)")
    front = x.movedim(dim, 0).contiguous()
    out = front.new_empty((front.shape[0] // world, *front.shape[1:]))
    if not out.is_meta:
        comm.reduce_scatter_tensor(out, front, group=group)
    return out.movedim(0, dim)


def _own_block(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    world = group_size(group)
    if x.shape[dim] % world:
        raise ValueError(f"split_to_sequence_shards: dimension {dim} has size {x.shape[dim]}, which the group "
                         f"size {world} must divide (the sequence length must be a multiple of tp)")
    return x.chunk(world, dim)[group_rank(group)].contiguous()


class _Conjugate(torch.autograd.Function):
    """forward_op(x, group, dim) forward, backward_op(grad, group, dim) backward: each region operator
    is one row of the table in the module docstring."""

    @staticmethod
    def forward(ctx, x, group, dim, forward_op, backward_op):
        ctx.group, ctx.dim, ctx.backward_op = group, dim, backward_op
        return forward_op(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return ctx.backward_op(grad, ctx.group, ctx.dim), None, None, None, None


def copy_to_tensor_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """f: `x` (replicated on every rank of `group`) unchanged; its gradient is summed over the group,
    because each rank's region produced only its shard's share of it. Also used on a replicated
    parameter whose every rank saw a different part of the input (sequence-parallel layer norms)."""
    return x if group_size(group) == 1 else _Conjugate.apply(x, group, 0, _identity, _all_reduce_sum)


def reduce_from_tensor_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """g: the sum over `group` of every rank's partial `x` (any shape, equal on all ranks); the result is
    replicated, so its gradient passes through unchanged."""
    return x if group_size(group) == 1 else _Conjugate.apply(x, group, 0, _all_reduce_sum, _identity)


def gather_from_sequence_shards(x: torch.Tensor, group=None, dim: int = 1) -> torch.Tensor:
    """Every rank's sequence shard `x` (size s along `dim`) concatenated in group-rank order (size
    tp * s along `dim`); the gradient is reduce-scattered back to the shards."""
    return x if group_size(group) == 1 else _Conjugate.apply(x, group, dim, _all_gather, _reduce_scatter)


def reduce_scatter_to_sequence_shards(x: torch.Tensor, group=None, dim: int = 1) -> torch.Tensor:
    """The sum over `group` of every rank's partial `x` (size tp * s along `dim`; tp must divide it),
    of which this rank keeps block group_rank (size s); the gradient is all-gathered."""
    return x if group_size(group) == 1 else _Conjugate.apply(x, group, dim, _reduce_scatter, _all_gather)


def split_to_sequence_shards(x: torch.Tensor, group=None, dim: int = 1) -> torch.Tensor:
    """Block group_rank of `x` (replicated on the group; tp must divide its size along `dim`), no
    communication; the gradient is all-gathered, so it is whole and equal on every rank again."""
    return x if group_size(group) == 1 else _Conjugate.apply(x, group, dim, _own_block, _all_gather)


def gather_sequence_shards_replicated(x: torch.Tensor, group=None, dim: int = 1) -> torch.Tensor:
    """Every rank's sequence shard `x` concatenated in group-rank order, like gather_from_sequence_shards,
    for a consumer whose gradient is replicated (equal on every rank, e.g. a replicated layer norm feeding
    a ColumnParallelLinear): backward keeps this rank's block of it instead of reduce-scattering."""
    return x if group_size(group) == 1 else _Conjugate.apply(x, group, dim, _all_gather, _own_block)


class _SequenceGatheredLinear(torch.autograd.Function):
    """F.linear(all-gather(x), weight, bias) for a sequence shard `x` that keeps only the shard for
    backward and all-gathers it again there (Korthikanti et al. 2022, section 4.2.2): stored, the
    gathered input would be tp times the shard, and sequence parallelism would not divide the inputs of
    the qkv and fc layers by tp (ringzero.estimate counts them divided). One more all-gather per layer
    in backward is the price."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, dim):
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.dim, ctx.has_bias = group, dim, bias is not None
        return F.linear(_all_gather(x, group, dim), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        full = _all_gather(x, ctx.group, ctx.dim).to(grad.dtype)  # (..., in): the input, gathered again
        grad_input = _reduce_scatter(grad.matmul(weight.to(grad.dtype)), ctx.group, ctx.dim).to(x.dtype)
        flat_grad = grad.reshape(-1, grad.shape[-1])  # (N, out / tp)
        grad_weight = flat_grad.t().matmul(full.reshape(-1, full.shape[-1])).to(weight.dtype)
        grad_bias = flat_grad.sum(0).to(weight.dtype) if ctx.has_bias else None
        return grad_input, grad_weight, grad_bias, None, None


def shard_rows(full: torch.Tensor, parts: int, index: int, chunks=1) -> torch.Tensor:
    """Shard `index` of `parts` of `full` along dim 0. With chunks > 1 dim 0 is `chunks` equal blocks
    laid end to end (the [q | k | v] of a fused projection), each split on its own: shard i is the i-th
    slice of every block, concatenated. chunks may also be the blocks' sizes (a tuple or list: [q | k | v]
    with grouped-query attention, q larger than k and v). A view when there is one block."""
    if isinstance(chunks, (tuple, list)):
        return torch.cat([block.chunk(parts)[index] for block in full.split(list(chunks))])
    blocks = full.reshape(chunks, parts, full.shape[0] // (chunks * parts), *full.shape[1:])
    return blocks[:, index].reshape(-1, *full.shape[1:]) if chunks > 1 else blocks[0, index]


def check_chunks(out_features: int, chunks, tp: int, who: str):
    """ValueError unless `chunks` (a count of equal blocks, or the blocks' sizes) cuts out_features into
    blocks that tp divides."""
    if isinstance(chunks, (tuple, list)):
        if sum(chunks) != out_features or any(c % tp for c in chunks):
            raise ValueError(f"{who}: chunks={tuple(chunks)} must add up to out_features={out_features} and each be "
                             f"divisible by the tensor-parallel size {tp}")
        return
    check_divides(out_features, chunks * tp, "out_features", who,
                  f"chunks={chunks} times the tensor-parallel size {tp}")


class ColumnParallelLinear(nn.Module):
    """y = x A^T + b with A's output features split over `group`: rank r holds rows of A (and entries of
    b) shard_rows(A, tp, r, chunks) and returns only its (..., out_features / tp) slice of y: the
    entrance of a TP region. forward: x (..., in_features), replicated on the group; with
    sequence_parallel, x is this rank's sequence shard (size s along seq_dim) and is all-gathered first
    (the output then has tp * s positions; backward gathers it again rather than keeping the gathered
    copy: _SequenceGatheredLinear).

    chunks: out_features is that many blocks end to end (3 for a fused [q | k | v]), each sharded alone,
    so that every rank holds whole heads of each. Requires out_features % (chunks * tp) == 0. Blocks of
    different sizes are given by their sizes (a tuple), each divisible by tp.
    Initialisation: a full nn.Linear drawn from the current RNG, sliced; all ranks of the group must be
    seeded alike. load_full_ copies the slice of existing full weights. All ranks of `group` construct
    and call it.
    """

    def __init__(self, in_features: int, out_features: int, group=None, bias: bool = True, chunks=1,
                 sequence_parallel: bool = False, seq_dim: int = 1):
        super().__init__()
        self.group, self.tp, self.rank = group, group_size(group), group_rank(group)
        chunks = tuple(chunks) if isinstance(chunks, (tuple, list)) else chunks
        check_chunks(out_features, chunks, self.tp, "ColumnParallelLinear")
        self.in_features, self.out_features, self.chunks = in_features, out_features, chunks
        self.sequence_parallel, self.seq_dim = bool(sequence_parallel), seq_dim
        local = out_features // self.tp
        self.weight = nn.Parameter(torch.empty(local, in_features))
        self.bias = nn.Parameter(torch.empty(local)) if bias else None
        full = nn.Linear(in_features, out_features, bias=bias)
        self.load_full_(full.weight, full.bias)

    @torch.no_grad()
    def load_full_(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        """Copies this rank's slice of a full weight (out_features, in_features) and bias (out_features)."""
        self.weight.copy_(shard_rows(weight, self.tp, self.rank, self.chunks))
        if self.bias is not None:
            self.bias.copy_(shard_rows(bias, self.tp, self.rank, self.chunks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel and self.tp > 1:
            return _SequenceGatheredLinear.apply(x, self.weight, self.bias, self.group, self.seq_dim)
        return F.linear(copy_to_tensor_region(x, self.group), self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} (local "
                f"{self.weight.shape[0]}), tp={self.tp}, chunks={self.chunks}, sequence_parallel={self.sequence_parallel}")


class RowParallelLinear(nn.Module):
    """y = x A^T + b with A's input features split over `group`: rank r holds columns
    [r * in / tp, (r + 1) * in / tp) of A and takes the matching (..., in_features / tp) slice of x (the
    output of a ColumnParallelLinear); the partial products are summed over the group: the exit of a TP
    region. Output (..., out_features), replicated; with sequence_parallel the sum is reduce-scattered
    along seq_dim instead (tp must divide that size) and this rank gets its sequence shard.

    b is replicated and added after the sum. Under sequence parallelism every rank adds it to a
    different shard, so its gradient is summed over the group in backward (copy_to_tensor_region).
    Requires in_features % tp == 0. Initialisation and load_full_ as in ColumnParallelLinear.
    """

    def __init__(self, in_features: int, out_features: int, group=None, bias: bool = True,
                 sequence_parallel: bool = False, seq_dim: int = 1):
        super().__init__()
        self.group, self.tp, self.rank = group, group_size(group), group_rank(group)
        check_divides(in_features, self.tp, "in_features", "RowParallelLinear")
        self.in_features, self.out_features = in_features, out_features
        self.sequence_parallel, self.seq_dim = bool(sequence_parallel), seq_dim
        self.weight = nn.Parameter(torch.empty(out_features, in_features // self.tp))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        full = nn.Linear(in_features, out_features, bias=bias)
        self.load_full_(full.weight, full.bias)

    @torch.no_grad()
    def load_full_(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        """Copies this rank's columns of a full weight (out_features, in_features) and the whole bias."""
        self.weight.copy_(shard_rows(weight.t(), self.tp, self.rank).t())
        if self.bias is not None:
            self.bias.copy_(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if not self.sequence_parallel:
            y = reduce_from_tensor_region(y, self.group)
            return y if self.bias is None else y + self.bias
        y = reduce_scatter_to_sequence_shards(y, self.group, self.seq_dim)
        return y if self.bias is None else y + copy_to_tensor_region(self.bias, self.group)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} (local {self.weight.shape[1]}), out_features={self.out_features}, "
                f"tp={self.tp}, sequence_parallel={self.sequence_parallel}")
