"""Which ranks of a group share a host: the host identity of this process and the layout every rank
derives from the identities of all (the same on every rank, since they all see the same list).

The CPU Communicator (shared memory in a host, rings across hosts) and the CUDA path (CUDA IPC in a
node, NCCL rings across nodes) take the same Topology, so they agree on local and cross-host rings.
"""
from __future__ import annotations

import dataclasses
import os
import socket


def boot_id() -> str:
    """The running kernel's boot id ('' where it cannot be read): the same for every process of one machine,
    across network, UTS and mount namespaces and containers, and whatever RINGZERO_HOST_ID says."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def host_id(forced: str = "") -> str:
    """This process's host identity: `forced` (RINGZERO_HOST_ID, through Config.host_id) if not empty, else
    `<hostname>:<boot id>:<device of /dev/shm>` ([Note: host identity])."""
    if forced:
        return forced
    boot = boot_id()
    try:
        shm_device = f"{os.stat(SHM_DIR).st_dev:x}"
    except OSError:
        shm_device = ""
    return f"{socket.gethostname()}:{boot}:{shm_device}"


# [Note: host identity] two ranks may share memory only if they run on one kernel (boot id) AND see the
# same /dev/shm file system (its device number): shm_open names live there, so ranks in containers or
# namespaces with separate /dev/shm mounts cannot meet in one segment even when the kernel and the
# hostname are the same (network namespaces share the boot id; a UTS namespace may repeat a hostname).
# The hostname stays in the id so that it reads well in messages; a differing one only ever splits hosts
# (never merges two that cannot share memory). tests/lab/test_hostlab.py checks the rule on namespaced hosts.
SHM_DIR = "/dev/shm"


@dataclasses.dataclass(frozen=True)
class Topology:
    """The hosts of a group of `world` ranks, seen from group rank `rank`."""

    rank: int
    world: int
    hosts: dict[str, list[int]]
    """host id -> its group ranks, ascending; hosts in order of their lowest rank."""

    @classmethod
    def from_host_ids(cls, rank: int, host_ids: list[str]) -> "Topology":
        """host_ids[r]: the identity of group rank r (every rank passes the same list)."""
        hosts: dict[str, list[int]] = {}
        for r, h in enumerate(host_ids):
            hosts.setdefault(h, []).append(r)
        return cls(rank, len(host_ids), hosts)

    @property
    def host(self) -> str:
        return next(h for h, ranks in self.hosts.items() if self.rank in ranks)

    @property
    def local_ranks(self) -> list[int]:
        """The group ranks on this rank's host (shared memory, CUDA IPC)."""
        return self.hosts[self.host]

    @property
    def local_rank(self) -> int:
        return self.local_ranks.index(self.rank)

    @property
    def local_world(self) -> int:
        return len(self.local_ranks)

    @property
    def single_host(self) -> bool:
        return len(self.hosts) == 1

    @property
    def hierarchical(self) -> bool:
        """Several hosts, each with the same number (> 1) of ranks: reduce-scatter in the host, one ring
        per local rank across hosts, all-gather in the host."""
        sizes = {len(v) for v in self.hosts.values()}
        return not self.single_host and len(sizes) == 1 and self.local_world > 1

    @property
    def cross_rings(self) -> list[list[int]]:
        """When hierarchical: ring i joins local rank i of every host (group ranks, in host order)."""
        if not self.hierarchical:
            return []
        return [[ranks[i] for ranks in self.hosts.values()] for i in range(self.local_world)]

    @property
    def cross_ring(self) -> list[int]:
        """The cross-host ring this rank belongs to (empty unless hierarchical)."""
        rings = self.cross_rings
        return rings[self.local_rank] if rings else []


__all__ = ["Topology", "host_id"]
