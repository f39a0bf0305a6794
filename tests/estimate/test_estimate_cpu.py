"""The step-time model on CPU ranks (estimate/cpu_kind.py) against `ringzero train` on this machine.

References: the GEMM-rate fit against its closed form (exact); the table's pred columns against the
numbers they are built from; and the main job (the default GPT, 2 ranks, zero1 and zero2, three timed steps
each after the metered ones, about 25 s): its median step time on the ranks' cores (the wall time less the
slowest rank's wait for a core, which other processes on this shared machine cause) against the prediction,
each run's CPU kind calibrated in its own ranks between its steps, within a factor of two. That catches a
broken model or unit; issue 71's bar (within 20%) is a measurement on a quiet machine, not a test: on this
shared machine one round in five puts a row outside it. docs/estimate.md has the measured rounds.
"""
import json

import pytest

from ringzero.estimate.cpu_kind import MIN_HALF_WIDTH, cpu_cluster, fit_gemm_rate, measure_cpu_kind
from ringzero.trainer.report import table

SANITY_FACTOR = 2.0
"""The most the measured step may differ from the prediction, either way, in the test (the bar is 20%)."""


def test_fit_recovers_the_size_correction():
    peak, half = 50e9, 40.0
    rate = lambda n: peak * n / (n + half)  # noqa: E731
    assert fit_gemm_rate((256, rate(256)), (64, rate(64))) == pytest.approx((peak, half), rel=1e-9)
    # A narrow GEMM measured faster than the wide one: no correction, the wide point is the rate at its width.
    got_peak, got_half = fit_gemm_rate((256, 40e9), (64, 45e9))
    assert got_half == MIN_HALF_WIDTH and got_peak * 256 / (256 + got_half) == pytest.approx(40e9)
    with pytest.raises(ValueError, match="must exceed"):
        fit_gemm_rate((64, 1e9), (256, 1e9))


def test_calibration_is_cheap_and_cached():
    kind = measure_cpu_kind(64, 256, 128, 32, 32, 2)
    assert kind.peak_flops_per_s > 1e8 and kind.hbm_bytes_per_s > 1e7 and kind.gemm_fraction == 1.0
    assert measure_cpu_kind(64, 256, 128, 32, 32, 2) is kind


def test_cpu_cluster_links():
    one = cpu_cluster(2)
    assert one.gpus_per_node == 2 and one.intra.bytes_per_s == one.inter.bytes_per_s
    lab = cpu_cluster(2, hosts=2, link_gbps=1.0)
    assert lab.inter.bytes_per_s == pytest.approx(125e6) and lab.nics_per_node == 1
    with pytest.raises(ValueError, match="link's speed"):
        cpu_cluster(2, hosts=2)


def test_table_columns():
    base = {"final_train_loss": 1.0, "final_val_loss": 1.0, "tokens_per_s": 1.0, "peak_mib_per_rank": 1.0,
            "estimate_mib_per_rank": 1.0, "comm_s": 0.1}
    rows = [{**base, "strategy": "ddp", "step_ms": 110.0, "step_ms_on_cores": 120.0, "pred_step_ms": 100.0,
             "pred_note": None, "pred_cpu": {"gemm_flops_per_s": 5e10, "memory_bytes_per_s": 5e9}},
            {**base, "strategy": "pp", "step_ms": 90.0, "pred_step_ms": None, "pred_note": "not predicted: why"}]
    lines = table(rows).splitlines()
    cols = [c.strip() for c in lines[0].split("|")]
    assert cols[cols.index("step ms") + 1:cols.index("step ms") + 4] == ["cores ms", "pred ms", "pred x"]
    ddp, pp = ([c.strip() for c in line.split("|")] for line in lines[1:3])
    assert ddp[cols.index("pred ms")] == "100.0" and ddp[cols.index("pred x")] == "1.20"  # on the cores over pred
    assert pp[cols.index("pred ms")] == "-" and pp[cols.index("pred x")] == "-"
    assert "50.0-50.0 GFLOP/s" in lines[3] and lines[4] == "pred ms of pp: not predicted: why"


def test_main_job_step_time_is_predicted(tmp_path):
    from ringzero.cli import train

    out = tmp_path / "out"
    assert train.main(["--compare", "zero1,zero2", "--nproc", "2", "--steps", "6", "--val-every", "0",
                       "--val-batches", "1", "--no-progress", "--out", str(out)]) == 0
    with open(out / "results.json") as f:
        results = json.load(f)
    for r in results:
        ratio = r["step_ms_on_cores"] / r["pred_step_ms"]
        print(r["strategy"], f"measured on the cores / predicted = {ratio:.2f}")
        assert 1 / SANITY_FACTOR <= ratio <= SANITY_FACTOR, (r["strategy"], r["step_ms_each"], r["pred_step_ms"],
                                                             r["pred_cpu"])
