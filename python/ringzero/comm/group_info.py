"""What a caller above the comm layer may know of a group's placement: which of its ranks share a host,
their global ranks and the group's timeout, as the group's Communicator sees them (RINGZERO_HOST_ID
included). Layers above build their own subgroups from it (ZeRO++'s host and cross-host groups) without
reaching into a Communicator.
"""
from __future__ import annotations

import dataclasses

from .api import _comm
from .topology import Topology


@dataclasses.dataclass(frozen=True)
class GroupInfo:
    """The placement of one group, seen from this rank."""

    topology: Topology
    """This rank's group rank, the group's size and its hosts (host id -> group ranks, ascending; hosts in
    order of their lowest rank)."""
    global_ranks: list[int]
    """global_ranks[r]: the global rank of group rank r."""
    timeout_s: float
    """The group's RINGZERO_TIMEOUT_S: how long its collectives wait before raising CommTimeout."""


def group_info(group=None) -> GroupInfo:
    """The placement of `group` (None: the default group). Collective the first time a group is used by
    ringzero (its ranks exchange their host identities): every rank of the group calls it, in the same
    order among the group's collectives. ValueError on a rank outside the group."""
    c = _comm(group, "group_info")
    if c is None:
        raise ValueError("ringzero.group_info: this rank is not a member of `group`")
    return GroupInfo(c.host_group.topology, list(c.global_ranks), c.timeout_s)


__all__ = ["GroupInfo", "group_info"]
