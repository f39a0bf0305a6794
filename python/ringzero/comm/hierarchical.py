"""The hierarchical all-reduce of the CPU and CUDA transports, written once: reduce-scatter inside the
host, one ring per local rank across hosts, all-gather inside the host. Each transport (transports.py
Hierarchical, cuda.py CudaHierarchical) passes its own three steps (shared memory and gloo; CUDA IPC and
NCCL); the staging is here.

[Note: AVG in the hierarchical all-reduce] the steps reduce with SUM and the caller divides by the world
size: the CPU cross-host ring folds the division into its last step (one rounding, as its flat ring
does); the CUDA path divides after the all-gather (the NCCL driver's AVG would divide by the number of
hosts only).
"""
from __future__ import annotations

import torch


def all_reduce_hierarchical(x: torch.Tensor, local_world: int, reduce_scatter, cross_all_reduce, all_gather):
    """Reduces the flat contiguous `x` in place over every rank of every host.

    x is padded with zeros to local_world equal blocks of c elements (staged, 1D local_world*c) when its
    numel does not divide. reduce_scatter(staged, part): part (1D c) gets block local_rank of staged
    reduced over the host; cross_all_reduce(part): part reduced in place across the hosts (the ring of
    this local rank); all_gather(part, gathered): every local rank's part into gathered (1D
    local_world*c), in local-rank order. Every rank of the group calls it with the same numel.
    """
    L = local_world
    c = -(-x.numel() // L)
    staged = x if x.numel() == L * c else torch.cat([x, x.new_zeros(L * c - x.numel())])
    part = torch.empty(c, dtype=x.dtype, device=x.device)
    reduce_scatter(staged, part)
    cross_all_reduce(part)
    gathered = x if staged is x else torch.empty_like(staged)
    all_gather(part, gathered)
    if gathered is not x:
        x.copy_(gathered[: x.numel()])


__all__ = ["all_reduce_hierarchical"]
