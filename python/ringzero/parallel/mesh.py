"""The one place that makes process groups: named parallel axes ("pp", "dp") over the world.

Ranks are laid out pipeline-major, as Megatron does: rank = pp_index * dp_size + dp_index, so the
data-parallel replicas of one stage are neighbours (and usually share a host).
"""
from __future__ import annotations

import torch.distributed as dist

AXES = ("pp", "dp")


class Mesh:
    """A (pp x dp) grid over all ranks of the default group.

    Every rank must build the Mesh with the same sizes (it creates groups collectively).
    `dp=None` takes the rest of the world. An axis that spans the whole world uses the default group.
    """

    def __init__(self, pp: int = 1, dp: int | None = None):
        if not dist.is_initialized():
            raise ValueError("Mesh needs torch.distributed.init_process_group(...) to have been called first")
        world, rank = dist.get_world_size(), dist.get_rank()
        if not isinstance(pp, int) or pp < 1:
            raise ValueError(f"pp must be a positive int, got {pp!r}")
        if dp is None:
            if world % pp:
                raise ValueError(f"pp={pp} does not divide the world size {world}; choose pp among the divisors of {world}")
            dp = world // pp
        if not isinstance(dp, int) or dp < 1:
            raise ValueError(f"dp must be a positive int, got {dp!r}")
        if pp * dp != world:
            raise ValueError(f"pp * dp = {pp} * {dp} = {pp * dp} must equal the world size {world}")
        self.sizes = {"pp": pp, "dp": dp}
        self.coords = {"pp": rank // dp, "dp": rank % dp}
        self._groups = {}
        self._ranks = {}
        # All ranks create all groups in the same order (new_group is collective over the world).
        layouts = {
            "dp": [[s * dp + d for d in range(dp)] for s in range(pp)],
            "pp": [[s * dp + d for s in range(pp)] for d in range(dp)],
        }
        for axis in AXES:
            for ranks in layouts[axis]:
                group = dist.group.WORLD if len(ranks) == world else dist.new_group(ranks)
                if rank in ranks:
                    self._groups[axis] = group
                    self._ranks[axis] = ranks

    def _axis(self, axis: str) -> str:
        if axis not in AXES:
            raise ValueError(f"unknown mesh axis {axis!r}; use one of {AXES}")
        return axis

    def group(self, axis: str):
        """The process group of this rank along `axis`."""
        return self._groups[self._axis(axis)]

    def size(self, axis: str) -> int:
        return self.sizes[self._axis(axis)]

    def index(self, axis: str) -> int:
        """This rank's coordinate along `axis` (e.g. its pipeline stage for "pp")."""
        return self.coords[self._axis(axis)]

    def ranks(self, axis: str) -> list[int]:
        """Global ranks of this rank's group along `axis`, in coordinate order."""
        return list(self._ranks[self._axis(axis)])

    def __repr__(self):
        return f"Mesh(pp={self.sizes['pp']}, dp={self.sizes['dp']}, coords={self.coords})"
