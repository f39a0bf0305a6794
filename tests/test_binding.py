"""Core binding by ringzero's launcher (launch.core_share, RINGZERO_BIND_CORES) and the spin decision it
must not break (issue 24: unbound, the guest scheduler sometimes ran both ranks on one vCPU, and every
wait of a small collective then cost ~20 us). References: the affinity sets the OS reports in each rank,
and the rule "waits spin iff the host's ranks together may run on at least as many cpus as there are
ranks" (ShmComm.set_host_cpus), checked against the union computed here from those sets."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ringzero import _C
from ringzero.launch import core_share

CPUS = sorted(os.sched_getaffinity(0))


@pytest.mark.parametrize("cpus, world, want", [
    ([0, 1], 2, [[0], [1]]),
    ([0, 1, 2, 3, 4, 5, 6], 3, [[0, 1], [2, 3], [4, 5]]),    # a remainder (cpu 6) stays unused
    ([5, 3, 9, 7], 2, [[3, 5], [7, 9]]),                       # sorted, contiguous in that order
    ([0, 1], 3, [None, None, None]),                           # fewer cpus than ranks: nothing bound
    ([4], 1, [[4]]),
    (list(range(8)), 8, [[c] for c in range(8)]),
])
def test_core_share_splits_the_allowed_cpus_evenly(cpus, world, want):
    got = [core_share(cpus, r, world) for r in range(world)]
    assert got == want
    bound = [set(g) for g in got if g is not None]
    assert all(not (a & b) for i, a in enumerate(bound) for b in bound[i + 1:])  # disjoint


def test_core_share_rejects_a_rank_outside_the_world():
    assert core_share([0, 1, 2, 3], 4, 4) is None and core_share([0, 1, 2, 3], -1, 4) is None


@pytest.mark.parametrize("ranks, cpus, spins", [(2, 1, False), (2, 2, True), (3, 2, False), (3, 8, True)])
def test_waits_spin_only_when_every_rank_can_have_a_cpu(ranks, cpus, spins):
    c = _C.ShmComm("", 0, ranks, 1 << 16, 10.0, list(range(ranks)))
    try:
        c.set_host_cpus(cpus)
        assert c.spin is spins
        c.set_spin(True)  # a caller cannot turn spinning on where the cpus do not allow it
        assert c.spin is spins
    finally:
        c.unlink()


_SCRIPT = r"""
import json, os, sys
import torch.distributed as dist
import ringzero
from ringzero.launch import launch

def worker(path):
    x = __import__("torch").ones(3)
    ringzero.all_reduce(x)
    comm = ringzero.comm.api.FAST.get(id(None))
    row = {"rank": dist.get_rank(), "cpus": sorted(os.sched_getaffinity(0)), "spin": comm.shm.spin,
           "local_cpus": comm.host_group.local_cpus, "threads": __import__("torch").get_num_threads(),
           "sum": x.tolist()}
    with open(f"{path}.{dist.get_rank()}", "w") as f:
        json.dump(row, f)

if __name__ == "__main__":
    launch(worker, int(sys.argv[2]), sys.argv[1])
"""


def _launch(tmp_path, nproc, env_extra):
    script = tmp_path / "bind_probe.py"
    script.write_text(_SCRIPT)
    env = {**os.environ, **env_extra}
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "row"), str(nproc)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads((tmp_path / f"row.{r}").read_text()) for r in range(nproc)]


@pytest.mark.parametrize("nproc", [2, 3])
@pytest.mark.parametrize("bind", ["1", "0"])
def test_launcher_binds_ranks_to_disjoint_cpus_and_keeps_spinning(tmp_path, nproc, bind):
    rows = _launch(tmp_path, nproc, {"RINGZERO_BIND_CORES": bind})
    want_bound = bind == "1" and len(CPUS) >= nproc
    for r, row in enumerate(rows):
        assert row["sum"] == [float(nproc)] * 3  # ones summed over the ranks
        assert row["cpus"] == (core_share(CPUS, r, nproc) if want_bound else CPUS), row
        assert row["threads"] == max(1, len(CPUS) // nproc)
    union = set().union(*(set(row["cpus"]) for row in rows))
    for row in rows:
        assert row["local_cpus"] == len(union)
        assert row["spin"] is (nproc <= len(union))  # bound to one cpu each, the ranks still spin
