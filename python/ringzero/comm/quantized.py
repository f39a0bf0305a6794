"""Collectives on block-quantized rows, beside the plain ones of api.py: the packed layout is that of
_C.quantize_blocks (n values of `bits` bits in blocks of `block`, then one float32 scale per block; described
in parallel/data_parallel/quantize.py). ZeRO++'s weight gather (qw) takes its in-host step here.
"""
from __future__ import annotations

import torch

from .api import _comm
from .registered import is_registered


def all_gather_dequantize(output: torch.Tensor, input: torch.Tensor, numel: int, bits: int, block: int,
                          order: torch.Tensor | None = None, group=None) -> bool:
    """Every rank's packed rows, dequantized straight into `output` with no staging copy of the packed bytes.

    input: (rows, row_bytes) uint8, contiguous, CPU, registered with `group` (ringzero.empty, comm.flat_zeros),
      each row `numel` values in quantize_blocks' layout; every rank passes the same rows and numel.
    output: float32, contiguous, CPU, world * rows * numel values: row j of group rank q lands in output row
      order[q * rows + j] (order: int64, a permutation of 0 .. world * rows - 1; None: q * rows + j).
    Returns True when done. Returns False, having done nothing, where the fused form cannot run: the group's
    ranks do not all share this host's memory, output is not float32, or input is not registered; the caller
    then gathers the packed rows (all_gather_single) and dequantizes them. The conditions hold alike on every
    rank when all pass tensors of the same kind. Every rank of the group calls it, in the same order as its
    other collectives; blocking (the bytes are read from the peers' memory; csrc/core/shm_window.cpp)."""
    c = _comm(group, "all_gather_dequantize")
    if c is None:
        return False
    shm = c.shm
    if shm is None or c.local_world != c.world or output.dtype != torch.float32 or not input.is_cpu or \
            not is_registered(input):
        return False
    if order is None:
        order = torch.arange(c.world * input.shape[0], dtype=torch.long)
    done = []
    c.run(lambda: done.append(shm.all_gather_dequantize(input, output, numel, bits, block, order)), False, output,
          "all_gather", input)
    return bool(done and done[0])


__all__ = ["all_gather_dequantize"]
