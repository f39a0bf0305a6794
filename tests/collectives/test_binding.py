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
from ringzero.cli.launch import core_share

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
from ringzero.cli.launch import launch

def worker(path):
    x = __import__("torch").ones(3)
    ringzero.all_reduce(x)
    comm = ringzero.comm.api.FAST.get(id(None))
    masks = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                masks[tid] = sorted(os.sched_getaffinity(int(tid)))
        except OSError:
            pass
    row = {"rank": dist.get_rank(), "cpus": sorted(os.sched_getaffinity(0)), "spin": comm.shm.spin,
           "thread_cpus": masks,
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
        # every thread, also those started before the launcher bound the rank (numpy's OpenBLAS server,
        # started by `import torch`)
        assert len(row["thread_cpus"]) > 1 and all(m == row["cpus"] for m in row["thread_cpus"].values()), row
        assert row["threads"] == max(1, len(CPUS) // nproc)
    union = set().union(*(set(row["cpus"]) for row in rows))
    for row in rows:
        assert row["local_cpus"] == len(union)
        assert row["spin"] is (nproc <= len(union))  # bound to one cpu each, the ranks still spin


# Under torchrun nobody binds: the first setup of a job-wide group does ([Note: binding at setup] in
# comm/affinity.py). Reference: each thread's Cpus_allowed_list as the kernel reports it.
_TORCHRUN_SCRIPT = r"""
import json, os, sys
import torch, torch.distributed as dist
import ringzero

path, backend, user_mask, ranks_per_host = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rank = int(os.environ["RANK"])
if ranks_per_host:  # hosts of one machine (as network namespaces are): host h holds ranks h*n .. h*n+n-1
    os.environ["RINGZERO_HOST_ID"] = f"host-{rank // ranks_per_host}"
if user_mask:  # the user binds each rank before init: rank r to the r-th comma-separated set
    os.sched_setaffinity(0, {int(c) for c in user_mask.split(";")[rank].split(",")})
dist.init_process_group(backend)
after_init = sorted(os.sched_getaffinity(0))
x = torch.ones(3)
ringzero.all_reduce(x)
threads = {}
for tid in os.listdir("/proc/self/task"):
    try:
        with open(f"/proc/self/task/{tid}/status") as f:
            threads[tid] = next(l.split(":")[1].strip() for l in f if l.startswith("Cpus_allowed_list"))
    except (OSError, StopIteration):
        pass
row = {"after_init": after_init, "cpus": sorted(os.sched_getaffinity(0)), "threads": threads,
       "torch_threads": torch.get_num_threads(), "sum": x.tolist(),
       "spin": ringzero.get_communicator(dist.group.WORLD).shm.spin}
with open(f"{path}.{rank}", "w") as f:
    json.dump(row, f)
ringzero.destroy_communicators()
dist.destroy_process_group()
"""


def _torchrun(tmp_path, nproc, backend, env_extra=None, user_mask="", ranks_per_host=0):
    script = tmp_path / "torchrun_probe.py"
    script.write_text(_TORCHRUN_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "RINGZERO_BIND_CORES"}
    env.update({"OMP_NUM_THREADS": "2", **(env_extra or {})})
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                          str(script), str(tmp_path / "row"), backend, user_mask, str(ranks_per_host)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads((tmp_path / f"row.{r}").read_text()) for r in range(nproc)]


def _cpu_list(text: str) -> list[int]:
    cpus = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus += range(int(lo), int(hi or lo) + 1)
    return cpus


needs_two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="binding two ranks apart needs two cpus")


@needs_two_cpus
@pytest.mark.parametrize("backend", ["gloo", "ringzero"])
def test_torchrun_ranks_are_bound_at_setup_every_thread(tmp_path, backend):
    rows = _torchrun(tmp_path, 2, backend)
    for r, row in enumerate(rows):
        want = core_share(CPUS, r, 2)
        assert row["sum"] == [2.0] * 3
        assert row["cpus"] == want, row
        if backend == "ringzero":  # the backend's own setup, inside init_process_group, binds
            assert row["after_init"] == want, row
        assert all(_cpu_list(c) == want for c in row["threads"].values()), row  # gloo's threads too
        assert row["torch_threads"] == min(2, len(want))  # cut to the share, never raised


@needs_two_cpus
def test_torchrun_binding_opt_out_and_user_masks_are_left_alone(tmp_path):
    rows = _torchrun(tmp_path, 2, "gloo", {"RINGZERO_BIND_CORES": "0"})
    assert [row["cpus"] for row in rows] == [CPUS, CPUS]
    masks = [CPUS, CPUS[1:2]]  # the user bound the ranks differently: not ours to change
    rows = _torchrun(tmp_path, 2, "gloo", user_mask=";".join(",".join(map(str, m)) for m in masks))
    assert [row["cpus"] for row in rows] == masks
    assert all(row["sum"] == [2.0] * 3 for row in rows)


def test_torchrun_more_ranks_than_cpus_are_not_bound(tmp_path):
    nproc = len(CPUS) + 1
    rows = _torchrun(tmp_path, nproc, "gloo")
    assert [row["cpus"] for row in rows] == [CPUS] * nproc


@needs_two_cpus
def test_torchrun_hosts_of_one_machine_share_out_its_cpus(tmp_path):
    # Two hosts of two ranks each on one kernel (RINGZERO_HOST_ID per rank, as namespaced hosts): the four
    # ranks share the machine's cpus out among themselves, so no two hosts' ranks are bound to one core;
    # with fewer cpus than the four, nobody is bound. Reference: core_share over the four ranks.
    rows = _torchrun(tmp_path, 4, "gloo", ranks_per_host=2)
    assert all(row["sum"] == [4.0] * 3 for row in rows)
    want = [core_share(CPUS, r, 4) or CPUS for r in range(4)]
    assert [row["cpus"] for row in rows] == want, rows
    # Their shared-memory waits spin only if all four ranks of the machine can have a cpu each.
    assert [row["spin"] for row in rows] == [len(CPUS) >= 4] * 4, rows
