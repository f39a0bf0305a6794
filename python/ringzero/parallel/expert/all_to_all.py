"""The all-to-all of expert parallelism: uneven blocks along dim 0 (all-to-all-v), differentiable.

Rank i sends the j-th block of its input (input_split_sizes[j] rows) to rank j and receives rank j's
block for it as the j-th block of its output (output_split_sizes[j] rows). Backward is the same
exchange with the split sizes swapped: the gradient of each received row goes back to the rank that
sent it. Every rank of the group must call each function here in the same order (they are collective).
Cost: the rows a rank sends to the others, sum of input_split_sizes[j] over j != rank, times the bytes
of a row, leave it once (and as many arrive); the block for itself is copied locally.

`exchange` (every function here takes it; None: ringzero.all_to_all_single) is the collective that moves the
bytes, any function with torch.distributed.all_to_all_single's signature: the one hook for running the same
expert parallelism over another all-to-all (`ringzero train`'s torch-ep row passes torch's own, and both
rows pass a timed wrapper).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ... import comm


def _all_to_all_single(output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int] | None,
                       input_split_sizes: list[int] | None, group, exchange=None) -> None:
    """The one call of the collective in this package (torch.distributed's signature, split sizes along
    dim 0; None: equal blocks): `exchange`, by default ringzero's."""
    (exchange or comm.all_to_all_single)(output, input, output_split_sizes, input_split_sizes, group=group)


def check_split_sizes(sizes, arg: str, rows: int | None, group, who: str) -> list[int]:
    """`sizes` as a list of ints, or ValueError naming `arg`, this rank and the sizes unless it holds one
    non-negative int per rank of `group` summing to `rows` (the rows of the tensor it splits; None: any)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    try:
        sizes = [int(s) for s in sizes]
    except (TypeError, ValueError):
        raise ValueError(f"{who}: {arg} must be a list of {world} ints, got {sizes!r} (rank {rank} of {world})") from None
    if len(sizes) != world or any(s < 0 for s in sizes) or (rows is not None and sum(sizes) != rows):
        rows_part = "" if rows is None else f" summing to the {rows} rows of its tensor"
        raise ValueError(f"{who}: {arg}={sizes} must hold {world} non-negative sizes (one per rank of the group)"
                         f"{rows_part} (rank {rank} of {world})")
    return sizes


class _AllToAllV(torch.autograd.Function):
    """forward: all-to-all-v of x with (output, input) split sizes; backward: the reverse all-to-all-v."""

    @staticmethod
    def forward(ctx, x, output_split_sizes, input_split_sizes, group, exchange):
        ctx.splits, ctx.group, ctx.exchange = (output_split_sizes, input_split_sizes), group, exchange
        return _exchange(x, output_split_sizes, input_split_sizes, group, exchange)

    @staticmethod
    def backward(ctx, grad):
        output_split_sizes, input_split_sizes = ctx.splits
        return _exchange(grad, input_split_sizes, output_split_sizes, ctx.group, ctx.exchange), None, None, None, None


def _exchange(x: torch.Tensor, output_split_sizes: list[int], input_split_sizes: list[int], group,
              exchange=None) -> torch.Tensor:
    out = x.new_empty((sum(output_split_sizes), *x.shape[1:]))
    _all_to_all_single(out, x.contiguous(), output_split_sizes, input_split_sizes, group, exchange)
    return out


def all_to_all_v(x: torch.Tensor, output_split_sizes, input_split_sizes, group=None, exchange=None) -> torch.Tensor:
    """Differentiable all-to-all-v of x [rows, ...] over `group` (None: the default group): returns
    [sum(output_split_sizes), ...]. The sizes must agree across ranks (what rank i sends to j is what j
    expects from i); each rank checks its own (ValueError naming the argument, the rank and the sizes).
    Every rank of the group must call it; its backward is the reverse exchange, on every rank too.
    exchange: the collective (see the module docstring; None: ringzero.all_to_all_single)."""
    who = "all_to_all_v"
    input_split_sizes = check_split_sizes(input_split_sizes, "input_split_sizes", x.shape[0], group, who)
    output_split_sizes = check_split_sizes(output_split_sizes, "output_split_sizes", None, group, who)
    return _AllToAllV.apply(x, output_split_sizes, input_split_sizes, group, exchange)


def exchange_counts(counts: torch.Tensor, group=None, exchange=None) -> torch.Tensor:
    """counts [P * L] int64 (how many rows this rank sends to each of the L experts of each of the P
    ranks) -> [P, L]: row i, how many rows rank i sends to each of this rank's L experts. One equal-block
    all-to-all of P * L integers through `exchange` (None: ringzero's); every rank of the group calls it."""
    world = dist.get_world_size(group)
    received = torch.empty_like(counts)
    _all_to_all_single(received, counts.contiguous(), None, None, group, exchange)
    return received.view(world, -1)
