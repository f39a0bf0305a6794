"""The core-placement probe (_C.core_round_trip_ns, ringzero.cli.bench.core_placement) and the staging-slot
size chosen from what it showed (issue 24: on the 2-core VM the host moved the two vCPUs between one L3
and two, and 1 MiB slots ran the large collectives 2x slower on two). Reference for the probe: the
affinity set the OS reports, and a pinned single-cpu child that must say "one cpu". No timing asserts
beyond "a round trip takes some time and less than a second"."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ringzero import _C
from ringzero.cli.bench import SPLIT_CACHE_NS, core_placement
from ringzero.comm.config import Config

CPUS = sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two cpus in this process's affinity set")
def test_round_trip_is_measured_between_two_allowed_cpus():
    ns = _C.core_round_trip_ns(CPUS[0], CPUS[1], round_trips=2000)
    assert 1.0 < ns < 1e9
    text = core_placement()
    assert text.startswith(f"{float(text.split()[0]):.0f} ns round trip cpus {CPUS[0]}-{CPUS[1]} (")
    assert text.endswith("(separate L3s)" if float(text.split()[0]) > SPLIT_CACHE_NS else "(one L3)")


@pytest.mark.parametrize("a, b, says", [
    (0, 0, "cpu_a and cpu_b must differ"),
    (-1, 0, "cpu -1 is not one this process may run on"),
    (0, 100000, "cpu 100000 is not one this process may run on"),
])
def test_bad_cpus_name_the_argument(a, b, says):
    if len(CPUS) < 2 and a != b:
        pytest.skip("needs two cpus")
    with pytest.raises(ValueError, match=says):
        _C.core_round_trip_ns(a, b)


def test_a_cpu_outside_the_affinity_set_is_refused_and_one_cpu_says_so():
    # A child pinned to one cpu: its other cpus are no longer allowed, and the placement is "one cpu".
    code = ("import os, ringzero\nfrom ringzero import _C\nfrom ringzero.cli.bench import core_placement\n"
            f"os.sched_setaffinity(0, {{{CPUS[0]}}})\nprint(core_placement())\n"
            "try:\n    _C.core_round_trip_ns(%d, %d)\nexcept ValueError as e:\n    print('refused', e)\n"
            % (CPUS[0], CPUS[-1] if len(CPUS) > 1 else CPUS[0] + 1))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "one cpu"
    assert lines[1].startswith("refused cpu ") and "is not one this process may run on" in lines[1]


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two cpus in this process's affinity set")
def test_round_trips_must_be_positive():
    with pytest.raises(ValueError, match="round_trips must be at least 1"):
        _C.core_round_trip_ns(CPUS[0], CPUS[1], round_trips=0)


def test_default_slot_fits_a_one_mib_l2_with_both_parities_and_a_peer_slice():
    # The measured choice (Config.shm_buffer_bytes docstring): 2 own slots + the slice read from a peer
    # within 1 MiB; the one-shot all-reduce (up to 64 KiB) still fits one slot.
    slot = Config().shm_buffer_bytes
    assert slot == 256 << 10
    assert 3 * slot <= 1 << 20 and slot >= 64 << 10


@pytest.mark.parametrize("min_bytes, bandwidth, round_trip_ns, world, want_s", [
    (8, float("inf"), 80.0, 2, 40e-9),          # a tiny message: one cache line one way bounds it
    (8 << 20, 8e9, 80.0, 2, (8 << 20) / 8e9),   # a large one: the bytes at the streaming bandwidth
    (8, 1e9, None, 2, 8e-9),                    # ranks on one cpu: no cache-line bound
    (8, float("inf"), 80.0, 1, 0.0),            # one rank talks to nobody
])
def test_bench_floor_is_the_larger_bound(min_bytes, bandwidth, round_trip_ns, world, want_s):
    from ringzero.cli.bench import floor_s

    assert floor_s(min_bytes, bandwidth, round_trip_ns, world) == pytest.approx(want_s, abs=0)


def test_bench_stream_probe_leaves_out_its_dispatch_cost():
    # One rank (a world of one, gloo): an 8-byte probe is all torch dispatch, so it must not bound the
    # bytes (the floor% of 105-119 at 8-512 bytes came from counting it as bandwidth); a 4 MiB probe
    # measures a real, finite bandwidth.
    code = ("import torch.distributed as dist\nfrom ringzero.cli.bench import stream_bandwidth\n"
            "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:0', rank=0, world_size=1)\n"
            "print(stream_bandwidth(4, 0.02), stream_bandwidth(4 << 20, 0.05))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    tiny, large = (float(v) for v in out.stdout.split())
    assert tiny == float("inf")  # 1 element: nothing beyond the one-element op it is measured against
    assert 1e8 < large < float("inf")
