"""Cutting a model into pipeline stages: contiguous runs of blocks, balanced by parameters or by count."""
from __future__ import annotations

from typing import Sequence

import torch.nn as nn


def _blocks(model) -> list[nn.Module]:
    if isinstance(model, nn.Sequential):
        return list(model)
    if isinstance(model, (list, tuple, nn.ModuleList)) and all(isinstance(b, nn.Module) for b in model):
        return list(model)
    raise TypeError(f"split needs an nn.Sequential or a list of nn.Module blocks, got {type(model).__name__}; "
                    "for ringzero.models.GPT pass model.as_sequential()")


def _balanced_sizes(weights: list[int], num_stages: int) -> list[int]:
    """Contiguous partition of `weights` into num_stages non-empty parts minimising the largest part's sum.

    Exact dynamic programme, O(n^2 * stages): n is the number of blocks (tens), so it is instant.
    """
    n = len(weights)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    # best[k][i]: the smallest largest-part over the first i blocks cut into k parts; cut[k][i] its last cut.
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0
    for k in range(1, num_stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    sizes, i = [], n
    for k in range(num_stages, 0, -1):
        sizes.append(i - cut[k][i])
        i = cut[k][i]
    return sizes[::-1]


def split(model, num_stages: int, by: str | Sequence[int] = "params") -> list[nn.Sequential]:
    """Cuts `model` (an nn.Sequential or a list of blocks: embedding first, head last) into `num_stages`
    contiguous stages, each an nn.Sequential sharing the model's modules (no copies).

    by="params": balance parameter counts (the largest stage is as small as possible);
    by="layers": balance block counts (the first stages take the remainder);
    by=[sizes]: explicit block counts per stage, summing to the number of blocks.
    Every stage gets at least one block: an empty stage is a ValueError.
    """
    blocks = _blocks(model)
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"num_stages must be a positive int, got {num_stages!r}")
    if num_stages > len(blocks):
        raise ValueError(f"cannot split {len(blocks)} blocks into {num_stages} non-empty stages; "
                         f"use num_stages <= {len(blocks)} or a model with more blocks")
    if isinstance(by, str):
        if by == "params":
            sizes = _balanced_sizes([sum(p.numel() for p in b.parameters()) for b in blocks], num_stages)
        elif by == "layers":
            base, extra = divmod(len(blocks), num_stages)
            sizes = [base + (1 if s < extra else 0) for s in range(num_stages)]
        else:
            raise ValueError(f"by={by!r}: use 'params', 'layers' or a list of block counts per stage")
    else:
        sizes = list(by)
        if len(sizes) != num_stages or any(isinstance(s, bool) or not isinstance(s, int) for s in sizes):
            raise ValueError(f"by={sizes!r} must list {num_stages} ints, one block count per stage")
        if any(s < 1 for s in sizes):
            raise ValueError(f"by={sizes!r} leaves stage {[s < 1 for s in sizes].index(True)} empty; "
                             "every stage needs at least one block")
        if sum(sizes) != len(blocks):
            raise ValueError(f"by={sizes!r} sums to {sum(sizes)} but the model has {len(blocks)} blocks")
    stages, start = [], 0
    for size in sizes:
        stages.append(nn.Sequential(*blocks[start:start + size]))
        start += size
    return stages
