"""comm/topology.py and comm/host_group.py: the layout derived from the ranks' host identities (reference:
layouts written out by hand), and the store rendezvous every setup step goes through (reference: the
values each rank published; a rank that never arrives must give CommTimeout naming it, as the CUDA
path's IPC-handle and NCCL-id exchanges rely on)."""
from __future__ import annotations

import time

import pytest
import torch.distributed as dist

import ringzero
from harness import run_ranks
from ringzero.comm.host_group import HostGroup, StoreRendezvous, group_store
from ringzero.comm.topology import Topology, host_id


def test_one_host():
    t = Topology.from_host_ids(1, ["a", "a", "a"])
    assert (t.single_host, t.hierarchical, t.local_ranks, t.local_rank, t.local_world) == (True, False, [0, 1, 2], 1, 3)
    assert t.cross_rings == [] and t.cross_ring == []


def test_hosts_of_equal_size_are_hierarchical():
    t = Topology.from_host_ids(3, ["a", "b", "a", "b"])  # hosts in order of their lowest rank
    assert t.hosts == {"a": [0, 2], "b": [1, 3]}
    assert (t.host, t.local_ranks, t.local_rank, t.hierarchical) == ("b", [1, 3], 1, True)
    assert t.cross_rings == [[0, 1], [2, 3]] and t.cross_ring == [2, 3]


@pytest.mark.parametrize("ids", [["a", "a", "b"], ["a", "b", "c"]])
def test_uneven_or_one_rank_hosts_take_the_flat_ring(ids):
    t = Topology.from_host_ids(0, ids)
    assert not t.single_host and not t.hierarchical and t.cross_ring == []


def test_host_id_is_forced_or_real():
    assert host_id("node7") == "node7"
    assert host_id("") == host_id() and ":" in host_id()


def rendezvous_body(rank, world):
    store = group_store(dist.group.WORLD, 1000)  # a generation no communicator uses
    rdv = StoreRendezvous(store, rank, 30.0, "test exchange")
    got = rdv.all_gather_object("both", {"rank": rank, "blob": bytes([rank, 0, 255])}, [0, 1])
    assert got == [{"rank": 0, "blob": b"\x00\x00\xff"}, {"rank": 1, "blob": b"\x01\x00\xff"}]
    # Rank 1 never joins the next exchange: rank 0 gives up after the timeout, naming it.
    if rank == 1:
        time.sleep(3)
        return None
    short = StoreRendezvous(store, rank, 1.0, "ringzero: setting up the CUDA path")
    start = time.monotonic()
    with pytest.raises(ringzero.CommTimeout) as info:
        short.all_gather_object("cuda/ipc", "handle", [0, 1])
    msg = str(info.value)
    assert "setting up the CUDA path on group rank 0: group ranks [1] did not arrive within 1.0 s" in msg, msg
    assert "step 'cuda/ipc'" in msg, msg
    return time.monotonic() - start


def test_store_rendezvous_names_a_rank_that_never_arrives():
    results = run_ranks(2, rendezvous_body)
    assert 0.9 < results[0] < 3, results


def host_group_body(rank, world):
    g = HostGroup(dist.group.WORLD, generation=1001, first_op="all_reduce")
    t = g.topology
    return g.config.host_id, t.hosts, t.local_ranks, t.hierarchical, g.timeout_s


def test_host_group_reads_config_and_topology_once():
    results = run_ranks(4, host_group_body, env={"RINGZERO_HOST_IDS": "x,y,x,y", "RINGZERO_TIMEOUT_S": "7"})
    for rank, (forced, hosts, local, hierarchical, timeout_s) in enumerate(results):
        assert forced == "xy"[rank % 2] and hosts == {"x": [0, 2], "y": [1, 3]}
        assert local == ([0, 2] if rank % 2 == 0 else [1, 3]) and hierarchical and timeout_s == 7.0


def test_host_group_takes_any_forced_host_id_where_the_boot_id_is_unknown(monkeypatch):
    # One rank, a RINGZERO_HOST_ID with the exchange's separator in it, and no boot id (then each host
    # counts as its own machine): the identity must come back whole. Reference: the id as given.
    from ringzero.comm import host_group
    from ringzero.comm.config import from_env

    monkeypatch.setenv("RINGZERO_HOST_ID", "rack|7")
    monkeypatch.setattr(host_group, "boot_id", lambda: "")
    monkeypatch.setattr(host_group, "bind_at_setup", lambda *args: None)  # this process stays as it is
    g = HostGroup.from_store(dist.HashStore(), 0, 1, from_env(), 5.0, "test")
    assert g.topology.hosts == {"rack|7": [0]} and g.local_cpus >= 1


def host_cpus_body(rank, world):
    from ringzero.comm.communicator import get_communicator
    whole = get_communicator(dist.group.WORLD).host_group.local_cpus
    subgroups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = subgroups[rank // 2]
    ringzero.barrier(group=mine)
    return whole, get_communicator(mine).host_group.local_cpus


def test_subgroups_of_hosts_on_one_machine_share_its_cores_as_the_job_does():
    """Two hosts (RINGZERO_HOST_IDS) of one machine, 2 ranks each: the cores each host's ranks may count on are
    those of the whole job's share, also in a subgroup holding just one host's ranks (which sees only its own
    ranks of the machine): else both hosts' subgroups spin on the same cores (the host lab's ZeRO++ steps).
    Reference: the machine's cpus (this process's affinity, unbound) x 2 / 4."""
    import os

    cpus = len(os.sched_getaffinity(0))
    results = run_ranks(4, host_cpus_body, env={"RINGZERO_HOST_IDS": "a,a,b,b", "RINGZERO_BIND_CORES": "0"})
    for whole, sub in results:
        assert whole == sub == max(0, cpus * 2 // 4), (whole, sub, cpus)
