"""`ringzero bench` output read back by benchmarks/plot_collectives.py: a real run at 3 ranks, its bus
bandwidth recomputed from the printed times must equal the printed busbw, and the PNG is written."""
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _plot_module():
    spec = importlib.util.spec_from_file_location("plot_collectives", os.path.join(ROOT, "benchmarks", "plot_collectives.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_table_plots_with_the_printed_bandwidth(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "ringzero", "bench", "--nproc", "3", "--max-bytes", "4K",
                          "--factor", "4", "--budget-s", "0.01"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    table = tmp_path / "bench.txt"
    table.write_text(out.stdout)
    plot = _plot_module()
    label, rows = plot.read_table(str(table))
    assert label == "3 ranks"
    assert sorted(rows) == ["all_gather", "all_reduce", "reduce_scatter"]
    printed = {}
    op = None
    for line in out.stdout.splitlines():
        if line.startswith("## "):
            op = line[3:]
        elif op and "|" in line and not line.lstrip().startswith("size"):
            cols = [c.split() for c in line.split("|")]
            printed.setdefault(op, []).append((float(cols[1][2]), float(cols[2][2])))
    for op, pts in rows.items():
        sizes = [8, 32, 128, 512, 2048]
        if op != "all_reduce":   # whole buffer of 3 equal float32 shards of at least one element
            sizes = [3 * 4 * max(1, s // 4 // 3) for s in sizes]
        assert [s for s, _, _ in pts] == sizes
        for (_, ours, gloo), (ours_p, gloo_p) in zip(pts, printed[op]):
            assert ours == pytest.approx(ours_p, abs=0.006)
            assert gloo == pytest.approx(gloo_p, abs=0.006)
    png = tmp_path / "bench.png"
    plot.main([str(table), "--out", str(png)])
    assert png.stat().st_size > 10_000


def test_plot_rejects_a_file_that_is_not_bench_output(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("nothing here\n")
    with pytest.raises(SystemExit, match="no `ringzero bench` output"):
        _plot_module().read_table(str(bad))
