"""Helpers the tests share (never imported from another test file): the integer inputs and the gloo
reference of the collective tests, the staging sizes that make small tensors cross many slots, and
the bytes autograd saves for backward (the estimator's activation tests).

Reference: gloo's torch.distributed.all_reduce on the same inputs widened to float64/int64 (exact for
the small integers used here; 8-bit products wrap the same way after narrowing), gloo SUM divided by
the world size for AVG (which gloo lacks).
"""
import torch
import torch.distributed as dist

import ringzero

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.uint8, torch.int32, torch.int64]
OPS = [ringzero.ReduceOp.SUM, ringzero.ReduceOp.AVG, ringzero.ReduceOp.MIN, ringzero.ReduceOp.MAX,
       ringzero.ReduceOp.PRODUCT]
GLOO_OP = {ringzero.ReduceOp.SUM: dist.ReduceOp.SUM, ringzero.ReduceOp.AVG: dist.ReduceOp.SUM,
           ringzero.ReduceOp.MIN: dist.ReduceOp.MIN, ringzero.ReduceOp.MAX: dist.ReduceOp.MAX,
           ringzero.ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT}
SIZES = [0, 1, 13, 1031, 5003]  # 5003 * 8 B is ten times the 4 KiB staging buffer used below


def make(rank, n, dtype, salt=0):
    """Small integers in [-3, 3] without 0 (uint8: [0, 3]) that vary with rank and position."""
    i = torch.arange(n, dtype=torch.int64)
    v = (i * 5 + rank * 3 + salt) % 7 - 3
    if dtype == torch.uint8:
        v = (v + 3) % 4
    else:
        v = torch.where(v == 0, torch.ones_like(v), v)
    return v.to(dtype)


def wide(dtype):
    return torch.float64 if dtype.is_floating_point else torch.int64


def gloo_reference(x, op, world):
    """gloo's all-reduce of x widened to 64 bits, narrowed back (AVG: SUM then divide)."""
    y = x.to(wide(x.dtype), copy=True)
    dist.all_reduce(y, op=GLOO_OP[op])  # default group: gloo
    if op == ringzero.ReduceOp.AVG:
        y = y / world if y.dtype.is_floating_point else torch.div(y, world, rounding_mode="trunc")
    return y.to(x.dtype)


def check_equal(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{tuple(got.shape)} vs {want.dtype}{tuple(want.shape)}"
    if not torch.equal(got, want):
        bad = (got != want).nonzero()[:5].flatten().tolist()
        raise AssertionError(f"{what}: first differing positions {bad}: got {got.flatten()[bad].tolist()} "
                             f"want {want.flatten()[bad].tolist()}")


SMALL_BUFFERS = {"RINGZERO_SHM_BUFFER_BYTES": "4096", "RINGZERO_RING_SLICE_BYTES": "1024", "RINGZERO_TIMEOUT_S": "120"}
"""A 4 KiB shared-memory slot and 1 KiB ring slices: the sizes above cross many of them."""


def saved_bytes(fn, module: torch.nn.Module) -> int:
    """Bytes of distinct storages autograd saves for backward while fn() runs, parameters excluded."""
    skip = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())
