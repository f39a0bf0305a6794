"""The one place that makes process groups: named parallel axes ("pp", "dp", "tp") over the world, and
the expert axes ("ep", "edp") that split the data-parallel axis for mixture-of-experts models.

Ranks are laid out pipeline-major and tensor-innermost, as Megatron does:
rank = (pp_index * dp_size + dp_index) * tp_size + tp_index, so the tensor-parallel ranks of one
replica are neighbours (they communicate in every layer: keep them on one host, ideally one node),
then the data-parallel replicas of one stage.

Expert parallelism (ep > 1) splits each data-parallel line of dp ranks into dp / ep groups of ep
neighbours: dp_index = edp_index * ep + ep_index. The ranks of one "ep" group hold different experts
and exchange tokens by all-to-all in every MoE layer (neighbours: one host where possible); the ranks of
one "edp" group hold the same experts, whose gradients they average. Every rank of "dp" still sees its
own data and averages the non-expert gradients over all of "dp" (as DeepSpeed-MoE and Megatron lay
them out: expert parallelism costs no extra ranks).
"""
from __future__ import annotations

import datetime
import itertools

import torch.distributed as dist

AXES = ("pp", "dp", "tp")
"""Outermost first: the order of the coordinates in the rank formula."""
EXPERT_AXES = ("ep", "edp")
"""Inside "dp": ep, the ranks whose experts differ (innermost); edp, the ranks holding the same experts."""


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class Mesh:
    """A (pp x dp x tp) grid over all ranks of the default group.

    Every rank must build the Mesh with the same sizes (it creates groups collectively).
    `dp=None` takes the rest of the world (world / (pp * tp)). An axis that spans the whole world uses
    the default group. `ep` (expert parallelism, a divisor of dp) adds the axes "ep" and "edp" (see the
    module docstring); they have groups only when ep > 1 (with ep = 1, "edp" is "dp" and asking for the
    "ep" group is a ValueError: there is nothing to exchange).
    """

    def __init__(self, pp: int = 1, dp: int | None = None, tp: int = 1, ep: int = 1):
        if not dist.is_initialized():
            raise ValueError("Mesh needs torch.distributed.init_process_group(...) to have been called first")
        world, rank = dist.get_world_size(), dist.get_rank()
        _positive("pp", pp)
        _positive("tp", tp)
        if dp is None:
            if world % (pp * tp):
                what = f"pp={pp}" if tp == 1 else f"pp * tp = {pp} * {tp} = {pp * tp}"
                raise ValueError(f"{what} does not divide the world size {world}; choose among the divisors of {world}")
            dp = world // (pp * tp)
        _positive("dp", dp)
        _positive("ep", ep)
        if pp * dp * tp != world:
            raise ValueError(f"pp * dp * tp = {pp} * {dp} * {tp} = {pp * dp * tp} must equal the world size {world}")
        if dp % ep:
            raise ValueError(f"ep={ep} must divide dp={dp} (expert parallelism splits the data-parallel ranks; "
                             f"rank {rank} of {world})")
        self.sizes = {"pp": pp, "dp": dp, "tp": tp}
        self.coords = {"pp": rank // (dp * tp), "dp": rank // tp % dp, "tp": rank % tp}
        self._groups = {}
        self._ranks = {}
        # All ranks create all groups in the same order (new_group is collective over the world).
        for axis in AXES:
            for ranks in self._lines(axis):
                group = dist.group.WORLD if len(ranks) == world else dist.new_group(ranks)
                if rank in ranks:
                    self._groups[axis] = group
                    self._ranks[axis] = ranks
        self._expert_axes(ep)

    def _expert_axes(self, ep: int):
        """Sizes, coordinates and groups of "ep" and "edp" (collective when ep > 1, after the other axes)."""
        dp, d, rank, world = self.sizes["dp"], self.coords["dp"], dist.get_rank(), dist.get_world_size()
        self.sizes.update(ep=ep, edp=dp // ep)
        self.coords.update(ep=d % ep, edp=d // ep)
        if ep == 1:
            self._groups["edp"], self._ranks["edp"] = self._groups["dp"], self._ranks["dp"]
            return
        for axis in EXPERT_AXES:
            for line in self._lines("dp"):
                # line: one data-parallel line in dp order; its ep groups are blocks of ep neighbours,
                # its edp groups the ranks at the same place in every block.
                parts = ([line[i:i + ep] for i in range(0, dp, ep)] if axis == "ep"
                         else [line[i::ep] for i in range(ep)])
                for ranks in parts:
                    group = dist.group.WORLD if len(ranks) == world else dist.new_group(ranks)
                    if rank in ranks:
                        self._groups[axis] = group
                        self._ranks[axis] = ranks

    def rank_of(self, pp: int, dp: int, tp: int) -> int:
        """The global rank at these coordinates."""
        return (pp * self.sizes["dp"] + dp) * self.sizes["tp"] + tp

    def _lines(self, axis: str) -> list[list[int]]:
        """Every group along `axis`: the ranks whose other coordinates are fixed, in `axis` order."""
        others = [a for a in AXES if a != axis]
        lines = []
        for fixed in itertools.product(*(range(self.sizes[a]) for a in others)):
            coords = dict(zip(others, fixed))
            lines.append([self.rank_of(**{**coords, axis: i}) for i in range(self.sizes[axis])])
        return lines

    def _axis(self, axis: str) -> str:
        if axis not in AXES + EXPERT_AXES:
            raise ValueError(f"unknown mesh axis {axis!r}; use one of {AXES + EXPERT_AXES}")
        return axis

    def _owned(self, axis: str) -> str:
        if self._axis(axis) not in self._groups:  # "ep" with ep = 1
            raise ValueError("this Mesh was built with ep=1: it has no expert-parallel group (build Mesh(..., ep=P))")
        return axis

    def group(self, axis: str):
        """The process group of this rank along `axis`."""
        return self._groups[self._owned(axis)]

    def size(self, axis: str) -> int:
        return self.sizes[self._axis(axis)]

    def index(self, axis: str) -> int:
        """This rank's coordinate along `axis` (e.g. its pipeline stage for "pp")."""
        return self.coords[self._axis(axis)]

    def ranks(self, axis: str) -> list[int]:
        """Global ranks of this rank's group along `axis`, in coordinate order."""
        return list(self._ranks[self._owned(axis)])

    def __repr__(self):
        base = {a: self.coords[a] for a in AXES}
        ep = f", ep={self.sizes['ep']}" if self.sizes["ep"] > 1 else ""
        return f"Mesh(pp={self.sizes['pp']}, dp={self.sizes['dp']}, tp={self.sizes['tp']}{ep}, coords={base})"


def subgroups(partitions: list[list[list[int]]], timeout_s: float | None = None) -> list:
    """For each partition (lists of global ranks that split some ranks into disjoint groups), the group of
    this rank's part (None where it is in none), made with dist.new_group on every rank in the same order:
    every rank of the job calls it with the same partitions. timeout_s: the groups' timeout (None: the
    default group's). ZeRO++'s host and cross-host groups come from here (data_parallel/zeropp.py)."""
    rank = dist.get_rank()
    kwargs = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
    mine = []
    for parts in partitions:
        found = None
        for ranks in parts:
            group = dist.new_group(sorted(ranks), **kwargs)
            if rank in ranks:
                found = group
        mine.append(found)
    return mine

