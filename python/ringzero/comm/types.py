"""The enums and dtype table of the Python layer, built from the one table in C++ (csrc/core/types.h,
exported by ringzero._C): no integer here is kept in step by hand (tests/house/test_structure.py checks)."""
from __future__ import annotations

import enum

import torch
import torch.distributed as dist

from .. import _C


def _from_cpp(name: str, table: dict, doc: str) -> type[enum.IntEnum]:
    """An IntEnum named `name` whose members are the upper-cased names of `table` (name -> C++ value)."""
    cls = enum.IntEnum(name, {key.upper(): value for key, value in table.items()}, module=__name__)
    cls.__doc__ = doc
    return cls


ReduceOp = _from_cpp("ReduceOp", _C.REDUCE_OPS,
                     "Reduction operators, mirroring torch.distributed.ReduceOp (SUM, AVG, MIN, MAX, PRODUCT).")
_C.set_reduce_op_type(ReduceOp)  # the api's fast path (_C.shm_direct) takes exactly these as `op`
AllReduceAlgo = _from_cpp("AllReduceAlgo", _C.ALL_REDUCE_ALGOS,
                          "All-reduce schedules (AUTO, ONESHOT, TWOSHOT, RING), chosen by RINGZERO_ALLREDUCE_ALGO.")
CollectiveKind = _from_cpp("CollectiveKind", _C.COLLECTIVE_KINDS,
                           "What a rank called, as carried in collective fingerprints (BARRIER, ALL_REDUCE, ...).")

# In the order of the C++ DType values (the fingerprint carries the index).
SUPPORTED_DTYPES = tuple(getattr(torch, name) for name in _C.DTYPES)

_TORCH_OPS = {getattr(dist.ReduceOp, op.name): op for op in ReduceOp}  # same member names as torch's


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
