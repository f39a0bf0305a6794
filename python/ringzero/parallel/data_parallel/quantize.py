"""Block quantization for ZeRO++-style communication (zeropp.py): a float tensor cut into blocks of
`block` values, each block stored as signed integers of `bits` bits (8 or 4) and one float32 scale.

Symmetric, round to nearest: scale = max |x| of the block / L (L = 127 for 8 bits, 7 for 4 bits),
q = round(x / scale) in [-L, L], x' = q * scale. Per element |x - x'| <= scale / 2 (plus float32 rounding
of the product), so the error bound of a block is max |x| / (2 L): 1/254 of the block's largest magnitude
in 8 bits, 1/14 in 4 bits. A block of zeros has scale 0 and comes back as zeros. A non-finite value makes
its whole block NaN (its scale is not finite), so a NaN or inf gradient still shows after the round trip.

Packed layout of n values (one row; `rows` of them side by side in a 2-D buffer): ceil(n / block) blocks,
first their integers (8 bits: one int8 per value; 4 bits: two values per byte, q + 8 in the low nibble for
the even position and in the high nibble for the odd one), zero-padded to whole blocks, then the blocks'
scales as float32. packed_bytes() gives the row size; every row of one call has the same n. A row is a whole
number of 4-byte words (block is a multiple of 8), so packed rows can travel as int32 (words()).
"""
from __future__ import annotations

import torch

from ... import _C

LEVELS = {8: 127, 4: 7}


def _check(bits: int, block: int):
    if bits not in LEVELS:
        raise ValueError(f"quantize: bits must be 8 or 4, got {bits!r}")
    if block < 2 or block % 8:
        raise ValueError(f"quantize: block must be a positive multiple of 8, got {block!r}")


def num_blocks(numel: int, block: int) -> int:
    return -(-numel // block)


def packed_bytes(numel: int, bits: int, block: int) -> int:
    """Bytes of one packed row of `numel` values."""
    _check(bits, block)
    nblk = num_blocks(numel, block)
    return nblk * block * bits // 8 + 4 * nblk


def quantize(x: torch.Tensor, bits: int, block: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: (rows, n) or (n,) floating CPU or CUDA tensor; returns (or fills) the packed uint8 rows on its device,
    (rows, packed_bytes) or (packed_bytes,). The loops: csrc/core/quantize_kernels.inc (SIMD, chosen for the
    running CPU); csrc/cuda/quantize.cu on the tensor's current stream (the same bytes)."""
    _check(bits, block)
    rows = x.shape[0] if x.dim() == 2 else 1
    row = packed_bytes(x.shape[-1], bits, block)
    if out is None:
        out = torch.empty(*((rows,) if x.dim() == 2 else ()), row, dtype=torch.uint8, device=x.device)
    _C.quantize_blocks(x.float().contiguous(), out, bits, block)
    return out


def dequantize(packed: torch.Tensor, numel: int, bits: int, block: int, out: torch.Tensor | None = None,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The inverse of quantize(): packed (rows, packed_bytes) or (packed_bytes,) uint8 into (rows, numel)
    or (numel,) values of `dtype` (or of out's dtype, into out, which must be contiguous)."""
    _check(bits, block)
    rows = packed.shape[0] if packed.dim() == 2 else 1
    if packed.numel() != rows * packed_bytes(numel, bits, block):
        raise ValueError(f"dequantize: a packed row of {numel} values holds {packed_bytes(numel, bits, block)} bytes, "
                         f"got {packed.numel() // max(rows, 1)}")
    shape = (rows, numel) if packed.dim() == 2 else (numel,)
    target = out.view(shape) if out is not None else None
    if target is not None and target.dtype == torch.float32:
        _C.dequantize_blocks(packed, target, bits, block)
        return out
    values = torch.empty(shape, dtype=torch.float32, device=packed.device)
    _C.dequantize_blocks(packed, values, bits, block)
    if target is None:
        return values if dtype == torch.float32 else values.to(dtype)
    target.copy_(values)
    return out


def words(packed: torch.Tensor) -> torch.Tensor:
    """packed (uint8, contiguous, a whole number of 4-byte words: every packed row is) as int32 words, the
    form the packed rows travel in: the same bytes, in a dtype every collective carries (the CUDA collectives
    carry no uint8)."""
    return packed.view(-1).view(torch.int32)


def error_bound(x: torch.Tensor, bits: int, block: int) -> torch.Tensor:
    """Per-element bound on |x - dequantize(quantize(x))| (without float32 rounding): max |x| of the
    element's block / (2 L), computed in float64 (x: 1-D)."""
    _check(bits, block)
    n = x.numel()
    nblk = num_blocks(n, block)
    xb = torch.nn.functional.pad(x.double().abs(), (0, nblk * block - n)).view(nblk, block)
    return (xb.amax(dim=1, keepdim=True) / (2 * LEVELS[bits])).expand(nblk, block).reshape(-1)[:n]
