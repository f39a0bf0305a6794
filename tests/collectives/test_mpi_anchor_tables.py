"""benchmarks/mpi_anchor.py's bookkeeping of where the host ran the cores (issue 24: the large-message
regime was the placement, so every comparison is also made per placement). Pure functions on made-up
runs; reference: medians computed by hand. No MPI, no processes."""
from __future__ import annotations

import importlib.util
import pathlib
import types

import pytest

from ringzero.cli.bench import SPLIT_CACHE_NS

spec = importlib.util.spec_from_file_location(
    "mpi_anchor", pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "mpi_anchor.py")
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
    # On the same placement: rounds 1 (one L3) and 3 (two), 2/1 and 8/2; round 2 compared one with two.
    assert overall.startswith("| all_reduce | 4K | 2.5 [1.0-9.0] | 4.0 [2.0-8.0] | 1.60x | 1.33x | 2.00x | 9.00 |")


def test_same_placement_rounds_leave_out_rounds_across_placements_and_mixed_jobs():
    runs = {
        "ringzero": [run(1e-6, 60, 60), run(1e-6, 60, 60), run(1e-6, 400, 400), run(1e-6, 60, 400), run(1e-6, None, None)],
        "openmpi": [run(1e-6, 60, 70), run(1e-6, 400, 400), run(1e-6, 400, 400), run(1e-6, 60, 400), run(1e-6, None, None)],
        "mpich": [run(1e-6, 60, 60), run(1e-6, 60, 60), run(1e-6, 400, 390), run(1e-6, 60, 400), run(1e-6, None, None)],
    }
    # Round 2: Open MPI on two L3s; round 4: every job mixed; round 5: no probe anywhere (nothing to tell apart).
    assert anchor.same_placement_rounds(runs, list(runs)) == [0, 2, 4]
    assert anchor.same_placement_rounds({lib: rs[:2] for lib, rs in runs.items()}, ["ringzero", "mpich"]) == [0, 1]


def test_driver_adds_rounds_until_enough_ran_on_the_same_placement(monkeypatch, tmp_path):
    # The host's placement, job by job: the first two rounds split their jobs, then every job shares one.
    # Rounds rotate the order (ringzero, openmpi; openmpi, ringzero; ...): a job's placement is taken
    # from the sequence in the order the jobs ran.
    placements = iter([(60, 60), (400, 400), (400, 400), (60, 60)] + [(60, 60)] * 20)
    calls = []

    def fake_job(impl, args, result):
        calls.append(impl)
        return run(1e-6 if impl == "ringzero" else 2e-6, *next(placements))

    monkeypatch.setattr(anchor, "run_job", fake_job)
    out = tmp_path / "a"
    anchor.main(["--rounds", "1", "--same-placement-rounds", "2", "--impls", "openmpi", "--ops", "all_reduce",
                 "--sizes", "4K", "--settle-s", "0", "--out", str(out)])
    # Rounds 1 and 2 compare one L3 with two; rounds 3 and 4 share one: four rounds, eight jobs.
    assert len(calls) == 8
    text = (tmp_path / "a.md").read_text()
    assert "# rounds on the same placement (every job one L3, or every job two): 3, 4 of 4" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| all_reduce | 4K |"))
    assert "| 2.00x | 2.00x | 2.00x |" in row

    # --max-rounds caps the search when the placements never agree.
    placements = iter([(60, 60), (400, 400)] * 20)
    calls.clear()
    anchor.main(["--rounds", "1", "--same-placement-rounds", "2", "--max-rounds", "3", "--impls", "openmpi",
                 "--ops", "all_reduce", "--sizes", "4K", "--settle-s", "0", "--out", str(out)])
    assert len(calls) == 6
    assert "every job two): none of 3" in (tmp_path / "a.md").read_text()
