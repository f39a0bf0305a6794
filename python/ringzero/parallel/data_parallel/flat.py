"""Flat layouts: parameters laid end to end in one 1-D buffer, padded to a multiple of the world size
so that rank r owns the contiguous shard [r * s, (r + 1) * s).

DDP buckets, ZeRO buckets and ZeRO-3 units are all FlatLayouts, and the checkpoint writes and reads
shards through the same description (`describe()`), which is what makes resharding possible.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn


@dataclasses.dataclass
class Slot:
    """Where one parameter lives in its flat buffer."""

    name: str
    """Name in the wrapped module (module.named_parameters()), the key of the consolidated state_dict."""
    param: nn.Parameter
    shape: torch.Size
    offset: int
    """First element of this parameter in the flat (unpadded) buffer."""
    numel: int


class FlatLayout:
    """Parameters `named_params` (name, Parameter) in the given order, sharded over `world` ranks.

    numel: elements of all parameters; padded_numel: numel rounded up to a multiple of world (at
    least world, so that an empty group still has one element per rank); shard_numel = padded / world.
    """

    def __init__(self, named_params, world: int, rank: int):
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"FlatLayout: rank {rank} must be in [0, world={world})")
        self.slots: list[Slot] = []
        offset = 0
        for name, p in named_params:
            self.slots.append(Slot(name, p, p.shape, offset, p.numel()))
            offset += p.numel()
        self.numel = offset
        self.world, self.rank = world, rank
        self.shard_numel = max(1, -(-offset // world))
        self.padded_numel = self.shard_numel * world
        self.shard_start = rank * self.shard_numel

    @property
    def params(self) -> list[nn.Parameter]:
        return [s.param for s in self.slots]

    def view(self, flat: torch.Tensor, slot: Slot) -> torch.Tensor:
        """slot's parameter-shaped view of a flat buffer (1-D, padded_numel or numel elements)."""
        return flat[slot.offset: slot.offset + slot.numel].view(slot.shape)

    def shard(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's shard of a padded flat buffer (a view)."""
        return flat[self.shard_start: self.shard_start + self.shard_numel]

    def flatten(self, tensors, dtype: torch.dtype) -> torch.Tensor:
        """One padded 1-D buffer (zeros in the padding) holding `tensors` (one per slot) as `dtype`."""
        flat = torch.zeros(self.padded_numel, dtype=dtype, device=tensors[0].device if tensors else "cpu")
        for slot, t in zip(self.slots, tensors):
            flat[slot.offset: slot.offset + slot.numel].copy_(t.reshape(-1))
        return flat

    def describe(self) -> dict:
        """JSON-able description (names, shapes, offsets, shard geometry) for checkpoint manifests."""
        return {
            "params": [{"name": s.name, "shape": list(s.shape), "offset": s.offset} for s in self.slots],
            "numel": self.numel, "world": self.world, "shard_numel": self.shard_numel,
        }


def bucket_params(named_params, cap_bytes: int, dtype_of) -> list[list[tuple[str, nn.Parameter]]]:
    """Splits (name, param) pairs, kept in the given order, into buckets of at most `cap_bytes`
    (counted with the element size of `dtype_of(param)`; a larger parameter gets a bucket of its own)
    and of a single dtype. Deterministic, so every rank builds the same buckets."""
    if cap_bytes <= 0:
        raise ValueError(f"bucket_cap_mb must be positive, got a cap of {cap_bytes} bytes")
    buckets, current, size, current_dtype = [], [], 0, None
    for name, p in named_params:
        dtype = dtype_of(p)
        nbytes = p.numel() * dtype.itemsize
        if current and (size + nbytes > cap_bytes or dtype != current_dtype):
            buckets.append(current)
            current, size = [], 0
        current.append((name, p))
        size += nbytes
        current_dtype = dtype
    if current:
        buckets.append(current)
    return buckets
