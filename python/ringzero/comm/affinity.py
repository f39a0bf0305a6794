"""Which cpus a rank runs on: each local rank on its own equal share of the cpus its host's ranks may use.

ringzero's launcher binds every rank before it starts (launch._bind). Launchers that bind nothing
(torchrun, torch.multiprocessing.spawn) leave it to the scheduler, which on the 2-core VM sometimes ran
both ranks on one vCPU for a while (every wait of a small collective then cost ~20 us; RESULTS.md, core
binding). HostGroup therefore binds at its first setup, where it has every local rank's affinity from the
host exchange: [Note: binding at setup].
"""
from __future__ import annotations

import os

import torch

# [Note: binding at setup] A rank is bound at the first HostGroup of a group that spans the whole job
# (a subgroup's local ranks are not all of the host's), once per process, when it is safe. The cpus are
# shared out among the job's ranks on this machine (one kernel: the same boot id), not only this host's:
# hosts that are network namespaces or containers of one machine share its cores, and binding each such
# host's ranks apart put every host's local rank 0 on one core (the lab's 2 hosts x 2 ranks on 2 cores at
# 10 Gbit/s: the 64 MiB all-reduce 1.2x slower bound that way than unbound; RESULTS.md, issue 36). Binding happens when:
#   - RINGZERO_BIND_CORES is not 0;
#   - every one of them reports the same affinity mask: nobody bound them (ringzero's launcher,
#     `taskset` per rank or a launcher's NUMA binding give different masks, and are left alone);
#     a mask the whole job inherited (taskset around torchrun) is shared out like the machine's;
#   - the mask has at least one cpu per rank of the job on the machine (otherwise they time-share anyway).
# Every thread of the process is moved (gloo's and OpenMP's already exist), and torch's intra-op
# threads are cut to the share when they exceed it, as the launcher does; none is ever raised.
_bound_to: list[int] | None = None
_decided = False


def core_share(cpus, local_rank: int, local_world: int) -> list[int] | None:
    """The cpus local rank `local_rank` of `local_world` binds to: the local_rank-th of local_world equal,
    contiguous shares of `cpus` (sorted; a remainder is left unused, as Open MPI's binding does); None when
    there are fewer cpus than ranks (then nothing is bound)."""
    cpus = sorted(cpus)
    share = len(cpus) // max(1, local_world)
    if share < 1 or not 0 <= local_rank < local_world:
        return None
    return cpus[local_rank * share:(local_rank + 1) * share]


def bind_process(cpus) -> None:
    """Moves every thread of this process onto `cpus` (threads that exit meanwhile are skipped)."""
    cpus = set(cpus)
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # no procfs: the calling thread, which the others it starts inherit from
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except (ProcessLookupError, PermissionError):
            pass


def bind_at_setup(enabled: bool, whole_job: bool, local_index: int, local_masks: list[set[int]]) -> list[int] | None:
    """Binds this process to its core_share when [Note: binding at setup] says it is safe; returns the
    cpus it is bound to (also on later calls), or None when it left placement alone. `local_index` is
    this rank's index among the job's ranks on this machine, `local_masks` their affinity masks in that
    order."""
    global _bound_to, _decided
    if _decided or not whole_job:
        return _bound_to
    _decided = True
    mine = set(os.sched_getaffinity(0))
    if not enabled or len(local_masks) < 2 or any(m != mine for m in local_masks):
        return None
    share = core_share(mine, local_index, len(local_masks))
    if share is None:
        return None
    bind_process(share)
    if torch.get_num_threads() > len(share):
        torch.set_num_threads(len(share))
    _bound_to = share
    return share


__all__ = ["bind_at_setup", "bind_process", "core_share"]
