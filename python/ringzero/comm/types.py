"""ReduceOp and dtype tables shared by the Python layer (values match csrc/core/types.h)."""
from __future__ import annotations

import enum

import torch
import torch.distributed as dist


class ReduceOp(enum.IntEnum):
    """Reduction operators, mirroring torch.distributed.ReduceOp (values match the C++ enum)."""

    SUM = 0
    AVG = 1
    MIN = 2
    MAX = 3
    PRODUCT = 4


SUPPORTED_DTYPES = (
    torch.float32, torch.float64, torch.bfloat16, torch.float16,
    torch.int8, torch.uint8, torch.int32, torch.int64,
)

_TORCH_OPS = {
    dist.ReduceOp.SUM: ReduceOp.SUM,
    dist.ReduceOp.AVG: ReduceOp.AVG,
    dist.ReduceOp.MIN: ReduceOp.MIN,
    dist.ReduceOp.MAX: ReduceOp.MAX,
    dist.ReduceOp.PRODUCT: ReduceOp.PRODUCT,
}


def to_reduce_op(op, arg: str = "op") -> ReduceOp:
    """Accepts ringzero.ReduceOp, torch.distributed.ReduceOp or a name such as "sum"."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        try:
            return ReduceOp[op.upper()]
        except KeyError:
            pass
    else:
        try:
            if op in _TORCH_OPS:
                return _TORCH_OPS[op]
        except TypeError:
            pass
    raise ValueError(
        f"{arg}={op!r} is not supported by ringzero; use ReduceOp.SUM, AVG, MIN, MAX or PRODUCT "
        "(bitwise and PREMUL_SUM ops are not implemented)"
    )
