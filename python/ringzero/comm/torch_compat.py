"""The one place where ringzero's Python meets a difference between torch releases (2.10 through 2.15).

Features are detected (hasattr), never read off version strings. Each name below is resolved when it
is called, so that a function replaced after import (ringzero.patch) is the one that runs.
"""
from __future__ import annotations

import torch.distributed as dist

# torch 2.13 renamed the tensor forms of reduce-scatter and all-gather to *_single and deprecated the
# old names (they warn there); before 2.13 only the old names exist. The new name wherever torch has it.
REDUCE_SCATTER_SINGLE = "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"
ALL_GATHER_SINGLE = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"


def reduce_scatter_single(output, input, *args, **kwargs):
    """torch.distributed's reduce-scatter of one flat tensor, under this torch's name for it."""
    return getattr(dist, REDUCE_SCATTER_SINGLE)(output, input, *args, **kwargs)


def all_gather_single(output_tensor, input_tensor, *args, **kwargs):
    """torch.distributed's all-gather into one flat tensor, under this torch's name for it."""
    return getattr(dist, ALL_GATHER_SINGLE)(output_tensor, input_tensor, *args, **kwargs)
