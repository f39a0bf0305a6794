"""Global gradient-norm clipping over gradients spread across ranks (ZeRO shards, pipeline stages,
tensor-parallel shards)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ... import comm
from ...comm.types import ReduceOp


def _sum_of_squares(grads) -> torch.Tensor:
    """Float64 CPU scalar (shape (1,)); accumulates without a float64 copy of any gradient, one host copy."""
    sq = torch.zeros(1, dtype=torch.float64)
    if grads:
        local = torch.zeros((), dtype=torch.float64, device=grads[0].device)
        for g in grads:
            local += torch.linalg.vector_norm(g, dtype=torch.float64).square()
        sq += local.cpu()
    return sq


def clip_grad_norm_(grads, max_norm: float, group=None, replicas: int = 1, replicated=(),
                    replicated_copies: int | None = None, copies=()) -> torch.Tensor:
    """Scales `grads` (this rank's gradient tensors, any device) so that the global 2-norm is at most
    max_norm; returns the norm before clipping (float32 0-dim CPU tensor, the same on every rank).

    The global squared norm is the sum over the ranks of `group` (None: the default group) of each
    rank's sum of squares, accumulated in float64 and reduced with one all-reduce of a float64 CPU
    scalar, divided by `replicas` when every gradient is held by that many ranks of the group
    (a pipeline stage replicated over its data-parallel ranks); shards count once (replicas=1).
    `replicated`: further gradients held equal by `replicated_copies` ranks of the group (None: every
    rank; a tensor-parallel model's layer norms, on each rank of its tensor group), counted once and
    scaled too. `copies`: more such classes, as (gradients, how many ranks of the group hold each).
    Every rank of the group must call it."""
    grads = [g for g in grads if g is not None]
    classes = [([g for g in replicated if g is not None], replicated_copies or dist.get_world_size(group))]
    classes += [([g for g in gs if g is not None], n) for gs, n in copies]
    sq = _sum_of_squares(grads)
    for gs, n in classes:
        if gs:
            sq += _sum_of_squares(gs) / n
    replicated = [g for gs, _ in classes for g in gs]
    comm.all_reduce(sq, op=ReduceOp.SUM, group=group)
    if replicas != 1:
        sq /= replicas
    total = sq.sqrt().float()[0]
    coef = float(max_norm) / (float(total) + 1e-6)
    if coef < 1.0:
        for g in grads + replicated:
            g.mul_(coef)
    return total
