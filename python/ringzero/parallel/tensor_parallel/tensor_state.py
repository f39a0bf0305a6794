"""Which parameters of a tensor-parallel module are shards, and of what: read by the gradient clip
(shards count once over the group, replicated parameters once per replica) and by checkpoint.py (which
gathers shards into the full tensor and cuts them again for another tensor-parallel size).

Works on any module built from tensor.py's and vocab.py's layers (a TensorParallelGPT, or a pipeline
stage cut from one), by module type, so the names are those of the module it is given.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..data_parallel.clip import clip_grad_norm_
from .tensor import ColumnParallelLinear, RowParallelLinear, group_rank, group_size, shard_rows
from .vocab import VocabParallelEmbedding

_SHARDED_LAYERS = (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding)


def shard_specs(module: nn.Module) -> dict[str, tuple[int, int]]:
    """{parameter name: (dim, chunks)} for every parameter that the tensor-parallel group splits: rank
    t of tp holds shard_of(full, dim, chunks, tp, t) (chunks: a count of equal blocks, or their sizes
    along dim). The others are replicated whole on every rank."""
    specs = {}
    for m_name, m in module.named_modules():
        prefix = f"{m_name}." if m_name else ""
        if isinstance(m, ColumnParallelLinear):
            specs[prefix + "weight"] = (0, m.chunks)
            if m.bias is not None:
                specs[prefix + "bias"] = (0, m.chunks)
        elif isinstance(m, RowParallelLinear):
            specs[prefix + "weight"] = (1, 1)
        elif isinstance(m, VocabParallelEmbedding):
            specs[prefix + "weight"] = (0, 1)
    return specs


def fused_sources(module: nn.Module) -> dict[str, dict]:
    """{parameter name: {"parts", "sizes", "transposed"}} for every parameter of `module` that stands for
    other modules' parameters in the model it was made from: parallelize's fused q|k|v and gate|up, and
    its renamed output projections. "parts" are the names the unfused model has for them (same module
    path), "sizes" the rows of the full parameter each part takes (None: one part, all of it), and
    "transposed" whether the parts are stored (in, out) (GPT-2's Conv1D) where ours is (out, in). Read by
    checkpoint.py, so that a checkpoint of either form loads into the other."""
    out = {}
    for m_name, m in module.named_modules():
        prefix = f"{m_name}." if m_name else ""
        for local, entry in getattr(m, "sources", {}).items():
            out[prefix + local] = {"parts": [prefix + p for p in entry["parts"]], "sizes": entry["sizes"],
                                   "transposed": entry["transposed"]}
    return out


def join_parts(parts: list[torch.Tensor], transposed: bool) -> torch.Tensor:
    """The fused full parameter made of `parts` (fused_sources' order)."""
    return torch.cat([p.t() if transposed else p for p in parts])


def part_of(full: torch.Tensor, sizes, index: int, transposed: bool) -> torch.Tensor:
    """Part `index` of the fused full parameter, as the unfused model holds it (join_parts' inverse)."""
    piece = full if sizes is None else full.split(list(sizes))[index]
    return piece.t() if transposed else piece


def replicated_parameter_names(module: nn.Module) -> list[str]:
    """Names of the parameters of `module` that every rank of its tensor-parallel group holds whole
    (layer norms, the position embedding, the row-parallel biases)."""
    split = shard_specs(module)
    return [n for n, _ in module.named_parameters() if n not in split]


def tensor_parallel_group(module: nn.Module):
    """(group, tp size, rank in it) of the first tensor-parallel layer in `module`; (None, 1, 0) when it
    has none (a plain model)."""
    for m in module.modules():
        if isinstance(m, _SHARDED_LAYERS):
            return m.group, group_size(m.group), group_rank(m.group)
    return None, 1, 0


def shard_of(full: torch.Tensor, dim: int, chunks: int, tp: int, index: int) -> torch.Tensor:
    """Shard `index` of `tp` of `full` along `dim`, each of `chunks` blocks split on its own (the rule
    of ColumnParallelLinear's chunks): what tensor rank `index` holds."""
    return shard_rows(full.transpose(0, dim), tp, index, chunks).transpose(0, dim)


def unshard(shards: list[torch.Tensor], dim: int, chunks) -> torch.Tensor:
    """The full tensor whose shard_of(., dim, chunks, len(shards), t) is shards[t] (chunks: a count of
    equal blocks, or the blocks' sizes)."""
    if isinstance(chunks, (tuple, list)):
        local = [c // len(shards) for c in chunks]
        pieces = [s.split(local, dim) for s in shards]
        return torch.cat([p[c] for c in range(len(chunks)) for p in pieces], dim)
    pieces = [s.chunk(chunks, dim) for s in shards]
    return torch.cat([p[c] for c in range(chunks) for p in pieces], dim)


def clip_tensor_parallel_grad_norm_(model: nn.Module, max_norm: float, tp: int, group=None,
                                    replicas: int = 1, shared=()) -> torch.Tensor:
    """Scales the gradients of `model` (a tensor-parallel module, or a ZeroDataParallel over one, whose
    flat master shards mix shards and replicated parameters) so that the 2-norm of the full model's
    gradient is at most max_norm; returns the norm before clipping (float32 0-dim CPU tensor, the same
    on every rank of `group`).

    `group` (None: the world) must span every rank holding a part of the model: tensor-parallel shards
    count once, replicated parameters once among the `tp` ranks holding each, and everything is divided
    by `replicas` when every gradient is held by that many data-parallel replicas (DDP; 1 under ZeRO,
    whose master shards are disjoint). `shared`: parameters (under ZeRO, master shards) whose gradient a
    second pipeline stage holds too (an embedding tied to the head): counted half on each. Every rank of
    `group` calls it."""
    from ..data_parallel.zero import ZeroDataParallel

    split, whole, split_shared, whole_shared = [], [], [], []

    def add(name_is_replicated: bool, grad, is_shared: bool):
        if is_shared:
            (whole_shared if name_is_replicated else split_shared).append(grad)
        else:
            (whole if name_is_replicated else split).append(grad)

    shared = {id(p) for p in shared}
    if isinstance(model, ZeroDataParallel):
        replicated = set(replicated_parameter_names(model.module))
        for g in model.groups:
            grad, start = g.master.grad, g.layout.shard_start
            if grad is None:
                continue
            for slot in g.layout.slots:  # this rank's part of each parameter in the flat shard
                a = max(slot.offset, start)
                b = min(slot.offset + slot.numel, start + g.layout.shard_numel)
                if a < b:
                    add(slot.name in replicated, grad[a - start:b - start], id(g.master) in shared)
    else:
        replicated = set(replicated_parameter_names(model))
        for n, p in model.named_parameters():
            add(n in replicated, p.grad, id(p) in shared)
    return clip_grad_norm_(split, max_norm, group=group, replicas=replicas, replicated=whole,
                           replicated_copies=tp, copies=[(split_shared, 2), (whole_shared, 2 * tp)])
