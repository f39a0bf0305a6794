"""One HostGroup per ProcessGroup: the validated configuration, the topology (which group ranks share a
host) and the rendezvous through the group's store, built once and taken by the Communicator and its
CUDA path, so that neither parses the environment nor meets the other ranks on its own.

Every rendezvous step goes through the store with a deadline: a rank that never arrives makes the
others raise ringzero.CommTimeout naming it (group ranks), never a hang or a transport's own error.
"""
from __future__ import annotations

import datetime
import os
import pickle

import torch.distributed as dist

from .affinity import bind_at_setup
from .config import DEFAULT_TIMEOUT_S, Config, from_env
from .errors import CommError, CommTimeout
from .topology import Topology, boot_id, host_id


_JOB_MACHINE: tuple[int, int] | None = None
"""(ranks of the job on this machine, cpus they may run on), from the last whole-job group set up."""


class StoreRendezvous:
    """Keyed exchanges among the ranks of one group through `store` (already prefixed for this use),
    each wait bounded by `timeout_s`. `label` opens every timeout message (e.g. "ringzero all_reduce:
    setting up the communicator ..."). Keys must be unique per exchange: every rank publishes
    `<key>/<its rank>` once."""

    def __init__(self, store, rank: int, timeout_s: float, label: str):
        self.store = store
        self.rank = rank
        self.timeout_s = timeout_s
        self.label = label

    def relabelled(self, label: str) -> "StoreRendezvous":
        """The same store and deadline, with another label (e.g. for the CUDA path's setup)."""
        return StoreRendezvous(self.store, self.rank, self.timeout_s, label)

    def publish(self, key: str, value: str | bytes):
        """Sets `key` (readers wait for it with wait())."""
        self.store.set(key, value)

    def wait(self, keys: list[str], ranks: list[int], step: str) -> list[bytes]:
        """The values of `keys`, published by `ranks` (keys[i] by ranks[i]), once all are set; CommTimeout
        naming the ranks whose keys are still missing after timeout_s."""
        try:
            self.store.wait(keys, datetime.timedelta(seconds=self.timeout_s))
        except Exception as e:  # the store raises DistStoreError on timeout
            missing = sorted({r for k, r in zip(keys, ranks) if not self.store.check([k])})
            raise CommTimeout(
                f"{self.label} on group rank {self.rank}: group ranks {missing} did not arrive within "
                f"{self.timeout_s} s (step '{step}'). Every rank of the group must call the same collectives; "
                "raise RINGZERO_TIMEOUT_S if a rank is legitimately slow to start."
            ) from e
        return [self.store.get(k) for k in keys]

    def exchange(self, key: str, value: str | bytes, ranks: list[int]) -> list[bytes]:
        """Publishes value under `<key>/<my rank>` and returns the values of `ranks`, in that order."""
        self.publish(f"{key}/{self.rank}", value)
        return self.wait([f"{key}/{r}" for r in ranks], ranks, key)

    def all_gather_object(self, key: str, obj, ranks: list[int]) -> list:
        """exchange() of any picklable object (what dist.all_gather_object gives, bounded by the timeout
        and naming a missing rank). Every rank of `ranks` must call it with the same key."""
        return [pickle.loads(v) for v in self.exchange(key, pickle.dumps(obj), ranks)]


class HostGroup:
    """Config, topology and store rendezvous of one ProcessGroup (every rank of it builds one, at the
    same call: building exchanges host identities through the store).

    `generation` separates successive HostGroups of one group (a Communicator rebuilt after
    destroy_communicators); `first_op` names the call that triggered the setup in error messages.
    """

    def __init__(self, group, generation: int = 0, first_op: str = "collective", config: Config | None = None):
        config = from_env() if config is None else config  # validated before anything is exchanged
        self.group = group
        self.global_ranks = dist.get_process_group_ranks(group)
        self._meet(config, group_store(group, generation), dist.get_rank(group), dist.get_world_size(group),
                   config.timeout_or(DEFAULT_TIMEOUT_S),
                   f"ringzero {first_op}: setting up the communicator (the first ringzero call on this group)")

    @classmethod
    def from_store(cls, store, rank: int, world: int, config: Config, timeout_s: float, label: str) -> "HostGroup":
        """The HostGroup of a group known only by its store, rank and size (the c10d backend's creator:
        torch has not made the ProcessGroup object yet). `store` must be prefixed for this use; `label`
        opens every timeout message. group and global_ranks are None."""
        self = cls.__new__(cls)
        self.group = self.global_ranks = None
        self._meet(config, store, rank, world, timeout_s, label)
        return self

    def _meet(self, config: Config, store, rank: int, world: int, timeout_s: float, label: str):
        """Exchanges the host identities of the group's ranks: every rank calls it at the same point."""
        self.config = config
        self.rank, self.world, self.timeout_s = rank, world, timeout_s
        self.rendezvous = StoreRendezvous(store, rank, timeout_s, label)
        cpus = ",".join(map(str, sorted(os.sched_getaffinity(0))))
        host = host_id(config.host_id)
        machine_id = boot_id() or host.encode().hex()  # unknown kernel: each host its own
        me = f"{host}|{machine_id}|{os.getpid()}|{cpus}"
        infos = [v.decode().rsplit("|", 3) for v in self.rendezvous.exchange("host", me, list(range(world)))]
        self.topology = Topology.from_host_ids(rank, [host for host, _, _, _ in infos])
        mask = lambda r: {int(c) for c in infos[r][3].split(",") if c}  # noqa: E731
        cpus_of = lambda ranks: len(set().union(*(mask(r) for r in ranks)))  # noqa: E731
        # The group's ranks on this machine (one kernel): more than this host's where hosts are network
        # namespaces or containers of one machine, which then share its cores.
        machine = [r for r in range(world) if infos[r][1] == infos[rank][1]]
        local = self.topology.local_ranks
        # The cpus this host's ranks may run on, together (their share of them where other hosts' ranks of
        # the group run on the same ones): whether each can have a core of its own (ShmComm.set_host_cpus)
        # does not show in one rank's affinity once a launcher has bound them.
        # A group spanning the job holds all of this machine's ranks; none is set up while the default
        # group is still being made (the c10d backend's own setup), which spans the job too. The cores
        # are shared out among the job's ranks on the machine ([Note: binding at setup]).
        whole_job = not dist.is_initialized() or world == dist.get_world_size()
        global _JOB_MACHINE
        if whole_job:
            _JOB_MACHINE = (len(machine), cpus_of(machine))
        # A subgroup sees only its own ranks of the machine; the job's (from its whole-job group, where one
        # was set up first) say how many share its cores: two lab hosts' subgroups of one machine must not
        # both spin on its cores.
        on_machine, machine_cpus = (_JOB_MACHINE if not whole_job and _JOB_MACHINE and _JOB_MACHINE[0] >= len(machine)
                                    else (len(machine), cpus_of(machine)))
        self.local_cpus = min(cpus_of(local), machine_cpus * len(local) // on_machine)
        self.bound_cpus = bind_at_setup(config.bind_cores, whole_job, machine.index(rank), [mask(r) for r in machine])

    def share_segment(self, key: str, create, open_):
        """A shared-memory object of this host's ranks (topology.local_ranks): the first of them calls
        create() (an object with .name and .unlink()) and publishes its name; the others open_(name); once
        all have it mapped the creator unlinks it (a killed process then leaks nothing) and says so. An
        error on any rank of the host is raised on every rank of the host (CommError); a rank that never
        arrives gives CommTimeout naming it. Every local rank must call it with the same key."""
        topo, rdv = self.topology, self.rendezvous
        key = f"{key}/{topo.host}"
        leader, peers = topo.local_ranks[0], topo.local_ranks[1:]
        if self.rank == leader:
            try:
                obj = create()
                rdv.publish(key, "ok|" + obj.name)
            except Exception as e:
                rdv.publish(key, f"error|rank {self.rank}: {e}")
                raise
            try:
                statuses = [v.decode() for v in rdv.wait([f"{key}/opened/{r}" for r in peers], peers, "open")]
            finally:
                obj.unlink()
            errors = "; ".join(s for s in statuses if s != "ok")
            rdv.publish(f"{key}/ready", errors or "ok")
        else:
            status, _, payload = rdv.wait([key], [leader], "create")[0].decode().partition("|")
            if status != "ok":
                raise CommError(f"ringzero could not set up shared memory: {payload}")
            try:
                obj = open_(payload)
                rdv.publish(f"{key}/opened/{self.rank}", "ok")
            except Exception as e:
                rdv.publish(f"{key}/opened/{self.rank}", f"rank {self.rank}: {e}")
                raise
            errors = rdv.wait([f"{key}/ready"], [leader], "ready")[0].decode()
        if errors and errors != "ok":
            raise CommError(f"ringzero could not set up shared memory: {errors}")
        return obj


def group_store(group, generation: int):
    """The group's own store, under a prefix unique to this generation of ringzero's state for it."""
    from torch.distributed import distributed_c10d as c10d

    getter = getattr(c10d, "_get_process_group_store", None)
    store = getter(group) if getter else c10d._world.pg_map[group][1]
    return dist.PrefixStore(f"ringzero/{generation}/", store)


__all__ = ["HostGroup", "StoreRendezvous", "group_store"]
