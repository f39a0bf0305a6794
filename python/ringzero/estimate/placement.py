"""Where a collective's ranks sit on the cluster's nodes: the group of each kind that spans the most nodes
(so the slowest), for the alpha-beta times of core.estimate. Ranks are pipeline-major, tensor innermost, as
parallel.Mesh lays them out: rank = (stage * dp + dp_index) * tp + tp_index.
"""
from __future__ import annotations

import dataclasses
import functools

from .expert_parallel import expert_groups
from .network import Cluster, GroupShape, group_shape
from .plan import Plan


def worst_group(group: str, plan: Plan, cluster: Cluster) -> GroupShape:
    """The group spanning the most nodes (ranks pipeline-major, tensor innermost:
    rank = (stage * dp + dp_index) * tp + tp_index)."""
    g = cluster.gpus_per_node
    if group in ("dp-host", "dp-cross"):  # ZeRO++'s subgroups: one host's ranks, one rank of every host
        L = plan.ranks_per_host
        # The L cross-host groups of a host (one per local rank) gather and exchange at the same time.
        return GroupShape(L, 1, L) if group == "dp-host" else GroupShape(plan.dp // L, plan.dp // L, 1, siblings=L)
    if plan.world > g and plan.world % g:
        raise ValueError(f"world={plan.world} does not fill whole {g}-GPU nodes; use a multiple of {g} "
                         f"or set --gpus-per-node")
    pp, dp, tp = plan.pp, plan.dp, plan.tp
    rank = lambda s, d, t: (s * dp + d) * tp + t  # noqa: E731
    if group in ("ep", "edp"):
        worst = max((group_shape(r, g) for r in expert_groups(plan, rank)[group]), key=lambda gs: (gs.nodes, -gs.local))
        # Every rank of a node belongs to one group of each kind, and all of them exchange at once: a group
        # crossing nodes shares the node's NICs with the node's other ranks (GroupShape.siblings).
        if worst.nodes > 1 and worst.local:
            worst = dataclasses.replace(worst, siblings=min(g, plan.world) // worst.local)
        return worst
    return _grid_group(group, pp, dp, tp, g)


@functools.lru_cache(maxsize=4096)
def _grid_group(group: str, pp: int, dp: int, tp: int, g: int) -> GroupShape:
    """_worst_group for the mesh's own axes ('dp', 'tp', 'pp'): a function of the sizes alone, cached
    because the layout search (search.py) asks for the same few thousands of times."""
    rank = lambda s, d, t: (s * dp + d) * tp + t  # noqa: E731
    if group == "dp":
        groups = [[rank(s, d, t) for d in range(dp)] for s in range(pp) for t in range(tp)]
    elif group == "tp":
        groups = [[rank(s, d, t) for t in range(tp)] for s in range(pp) for d in range(dp)]
    else:  # neighbouring stages: a point-to-point pair crossing a node boundary is the slow one
        groups = [[rank(s, d, t), rank(s + 1, d, t)] for s in range(pp - 1) for d in range(dp) for t in range(tp)]
        worst = max((group_shape(r, g) for r in groups), key=lambda gs: (gs.nodes, -gs.local))
        # Every rank of a stage sends to the next stage at once: pairs leaving a node share its NICs.
        return dataclasses.replace(worst, siblings=min(g, pp * dp * tp)) if worst.nodes > 1 else worst
    return max((group_shape(r, g) for r in groups), key=lambda gs: (gs.nodes, -gs.local))
