"""benchmarks/mpi_anchor.py's bookkeeping of where the host ran the cores (issue 24: the large-message
regime was the placement, so every comparison is also made per placement). Pure functions on made-up
runs; reference: medians computed by hand. No MPI, no processes."""
from __future__ import annotations

import importlib.util
import pathlib
import types

import pytest

from ringzero.bench import SPLIT_CACHE_NS

spec = importlib.util.spec_from_file_location(
    "mpi_anchor", pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "mpi_anchor.py")
anchor = importlib.util.module_from_spec(spec)
spec.loader.exec_module(anchor)


def run(seconds: float, before, after) -> dict:
    return {"version": "x", "seconds": {"all_reduce 4096": seconds}, "round_trip_ns": [before, after]}


@pytest.mark.parametrize("before, after, where", [
    (60.0, 70.0, "one"), (400.0, 390.0, "split"), (60.0, 400.0, "mixed"), (400.0, 60.0, "mixed"),
    (SPLIT_CACHE_NS, SPLIT_CACHE_NS, "one"), (None, None, "n/a"),
])
def test_placement_of_a_job(before, after, where):
    assert anchor.placement(run(1e-6, before, after)) == where
    assert anchor.placement({"seconds": {}}) == "n/a"  # results from before the probe existed


def test_placement_table_takes_medians_per_placement_and_leaves_mixed_jobs_out():
    runs = {
        "ringzero": [run(1e-6, 60, 60), run(3e-6, 60, 70), run(2e-6, 400, 400), run(9e-6, 60, 400)],
        "openmpi": [run(2e-6, 60, 60), run(4e-6, 400, 400), run(8e-6, 400, 400)],
    }
    args = types.SimpleNamespace(ops=["all_reduce"], sizes=[4096])
    lines = anchor.placement_table(runs, args).splitlines()
    assert lines[2] == "| jobs | | 2 / 1 | 1 / 2 | |"
    # ringzero: one L3 median(1, 3) = 2 us, two L3s 2 us; Open MPI: 2 us and median(4, 8) = 6 us.
    assert lines[3] == "| all_reduce | 4K | 2.0 / 2.0 | 2.0 / 6.0 | 1.00x / 3.00x |"
    # The overall table still takes every job, mixed ones included.
    overall = anchor.table(runs, args).splitlines()[2]
    # Lowest round: Open MPI / ringzero per round, 2/1, 4/3, 8/2 (ringzero's 4th round has no partner).
    assert overall.startswith("| all_reduce | 4K | 2.5 [1.0-9.0] | 4.0 [2.0-8.0] | 1.60x | 1.33x | 9.00 |")
