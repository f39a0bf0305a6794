"""Which parameters of an expert-parallel model are slices of stacked experts, and of which global experts:
read by checkpoint.py, which saves each slice once with its global expert range and, on load, cuts the
slice a model of any other ep degree holds out of the saved ones ([Note: expert-parallel checkpoints]).

[Note: expert-parallel checkpoints]
Rank j of an ep group of P ranks holds experts [j E/P, (j + 1) E/P) of every MoE layer under the name the
one-process model gives the whole stacked tensor [E, ...] (expert first). A save writes each distinct slice
once (the lowest rank of the saving group that holds it: with edp > 1 several ranks hold the same experts)
as its own group of the manifest, marked "experts": {"first", "count", "total"}, so no rank ever gathers
a whole expert tensor. A load reads the rows its model holds, [first, first + count) of the whole tensor,
from whichever saved slices overlap them: any ep degree that divides E, ep = 1 (a plain MoEGPT holding all
E) included, and a plain model's checkpoint (its experts saved whole) loads into an expert-parallel model
the same way. Optimizer state of an expert parameter is its shape and follows the same cut.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn

from .expert_data_parallel import expert_holders


class ExpertRange(NamedTuple):
    """The experts [first, first + count) of `total` that one stacked expert tensor holds (rows of dim 0)."""

    first: int
    count: int
    total: int

    @property
    def ep(self) -> int:
        """The ep degree of the model holding this slice (1: every expert)."""
        return self.total // self.count


def expert_ranges(module: nn.Module) -> dict[str, ExpertRange]:
    """{name in module.named_parameters(): its ExpertRange} for every expert parameter of module's
    expert-parallel layers (expert_holders: ExpertParallelMoE, or a module marked holds_expert_shard with
    first_expert, local_count and num_experts); empty for a model without any (every expert whole)."""
    names = {id(p): n for n, p in module.named_parameters()}
    return {names[id(p)]: ExpertRange(m.first_expert, m.local_count, m.num_experts)
            for m, params in expert_holders(module) for p in params if id(p) in names}


def model_names(holder: nn.Module, model: nn.Module) -> dict[str, str]:
    """{name in `holder`: name in `model`} for the parameters they share: ExpertDataParallel's wrapper
    holds the replicated parameters under names of its own, checkpoints record the model's."""
    in_model = {id(p): n for n, p in model.named_parameters()}
    return {n: in_model[id(p)] for n, p in holder.named_parameters()}


def expert_writers(ranges_by_rank: list[dict[str, ExpertRange]]) -> dict[str, list[tuple[ExpertRange, int]]]:
    """{name: [(slice, rank that writes it)] in expert order} from every rank's expert_ranges (in group rank
    order): each distinct slice once, written by the lowest rank holding it. ValueError unless the slices of
    each parameter tile all of its experts (a saving group that lacks some ep rank)."""
    out = {}
    for name in ranges_by_rank[0]:
        seen = {}
        for rank, ranges in enumerate(ranges_by_rank):
            if name not in ranges:
                raise ValueError(f"checkpoint.save: rank {rank} of the group holds no expert parameter {name!r}")
            seen.setdefault(ranges[name], rank)
        pieces = sorted(seen.items())
        end, total = 0, pieces[0][0].total
        for r, _ in pieces:
            if r.first != end or r.total != total:
                raise ValueError(f"checkpoint.save: the group's ranks hold experts {[tuple(r) for r, _ in pieces]} "
                                 f"(first, count, total) of {name!r}, not each of its {total} experts once; save "
                                 "from a group that holds every expert (ExpertDataParallel's dp group)")
            end = r.first + r.count
        if end != total:
            raise ValueError(f"checkpoint.save: the group's ranks hold experts [0, {end}) of {name!r}'s {total}; save "
                             "from a group that holds every expert (ExpertDataParallel's dp group)")
        out[name] = pieces
    return out


def saved_slices(module: nn.Module, group) -> tuple[dict[str, ExpertRange], dict[str, list[tuple[ExpertRange, int]]]]:
    """(this rank's expert_ranges(module), expert_writers over every rank of `group`): which rank writes each
    slice. Collective over `group` (None: one process) when module has experts: one small object all-gather."""
    mine = expert_ranges(module)
    world = dist.get_world_size(group) if group is not None else 1
    if not mine or world == 1:
        return mine, expert_writers([mine]) if mine else {}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine, group=group)
    return mine, expert_writers(everyone)


def piece_layout(layout: dict, r: ExpertRange) -> dict:
    """The manifest layout (FlatLayout.describe() of one expert parameter) of slice `r` of it."""
    param = layout["params"][0]
    shape = [r.count, *param["shape"][1:]]
    numel = 1
    for d in shape:
        numel *= d
    return {**layout, "params": [{**param, "shape": shape}], "numel": numel, "shard_numel": numel}


def check_expert_count(name: str, saved_total: int, want: ExpertRange, where) -> None:
    """ValueError naming both counts unless a checkpoint holding saved_total experts of `name` can give the
    slice `want` (the same number of experts, which the model's ep degree divides)."""
    if saved_total % want.ep:
        raise ValueError(f"{where}: parameter {name!r} has {saved_total} experts in the checkpoint, which the "
                         f"model's ep={want.ep} does not divide; the model has {want.total} experts")
    if saved_total != want.total:
        raise ValueError(f"{where}: parameter {name!r} has {saved_total} experts in the checkpoint but "
                         f"{want.total} in the model")


def join_rows(saved: list[tuple[ExpertRange, Callable[[], torch.Tensor]]], want: ExpertRange) -> torch.Tensor:
    """Rows [want.first, want.first + want.count) of the whole stacked tensor, from the saved slices
    (range, function reading that slice [count, ...]) that overlap them; the others are not read."""
    parts = []
    for r, read in saved:
        lo, hi = max(want.first, r.first), min(want.first + want.count, r.first + r.count)
        if lo < hi:
            parts.append(read()[lo - r.first: hi - r.first])
    return parts[0] if len(parts) == 1 else torch.cat(parts)
