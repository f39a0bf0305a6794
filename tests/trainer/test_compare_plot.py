"""compare.png's ratio labels stay legible: the figure of `ringzero train --compare` drawn (Agg, no
processes) for the README's nine rows and for twelve, and every ratio label's box, as the renderer lays it
out, kept clear of every other label and of every bar but its own, and inside its panel. Reference: the
renderer's window extents of the labels (ax.texts) and the bars (ax.patches)."""
from __future__ import annotations

import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from ringzero.cli.compare_plot import draw_compare  # noqa: E402

NINE = ["ddp", "torch-ddp", "zero1", "zero2", "zero3", "torch-fsdp2", "pp", "tp", "tp+zero1"]  # the README's
TWELVE = NINE + ["torch-pp", "torch-tp", "3d"]


def _rows(names: list[str]) -> list[dict]:
    """Made-up runs whose bars differ a lot in height, so that a short ringzero bar stands beside tall
    ones (the case where a label crossed its neighbour), and whose estimates stand above some bars."""
    rows = []
    for i, name in enumerate(names):
        tokens = [9000, 21000, 3000, 25000, 5200, 30000, 1500, 27000, 4100, 29000, 2600, 18000][i % 12]
        peak = [40, 160, 35, 150, 20, 170, 60, 45, 140, 155, 30, 165][i % 12]
        rows.append({"strategy": name, "final_train_loss": 3.0, "final_val_loss": 3.1, "tokens_per_s": float(tokens),
                     "step_ms": 1e6 / tokens, "peak_mib_per_rank": float(peak), "estimate_mib_per_rank": peak * 1.1,
                     "comm_s": 0.1, "train_losses": [[s, 5.0 - s / 50] for s in range(0, 100, 10)],
                     "val_losses": [[50, 4.0], [100, 3.1]], "ranks": 2, "steps": 100, "params": 3.3e6})
    return rows


def label_problems(fig) -> list[str]:
    """Every pair of ratio labels whose boxes intersect, every label whose box meets a bar it is not
    attached to (a label belongs to the bars at its annotation's x), and every label not inside its panel."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    problems = []
    for ax in fig.axes[1:3]:
        panel = ax.get_window_extent(renderer)
        labels = [(t, t.get_window_extent(renderer)) for t in ax.texts]
        bars = [(p.get_x() + p.get_width() / 2, p.get_window_extent(renderer)) for p in ax.patches]
        for i, (a, box_a) in enumerate(labels):
            where = f"{ax.get_title()[:20]}: {a.get_text()!r} at bar {a.xy[0]}"
            for b, box_b in labels[i + 1:]:
                if box_a.overlaps(box_b):
                    problems.append(f"{where} overlaps {b.get_text()!r}")
            for x, box in bars:
                if abs(x - a.xy[0]) > 1e-9 and box_a.overlaps(box):
                    problems.append(f"{where} overlaps the bar at {x}")
            inside = (panel.x0 <= box_a.x0 and box_a.x1 <= panel.x1 and panel.y0 <= box_a.y0 and box_a.y1 <= panel.y1)
            if not inside:
                problems.append(f"{where} leaves its panel")
    return problems


@pytest.mark.parametrize("names", [NINE, TWELVE], ids=["9 rows", "12 rows"])
def test_every_ratio_label_is_clear_of_the_others_and_of_foreign_bars(names):
    import matplotlib.pyplot as plt

    fig = draw_compare(_rows(names))
    try:
        labels = [t.get_text() for t in fig.axes[2].texts]
        assert len(labels) == len([n for n in names if not n.startswith(("torch-", "deepspeed-"))]), labels
        assert "1.00x vs torch-ddp" not in labels and any(" vs torch-ddp" in t for t in labels)
        assert label_problems(fig) == []
    finally:
        plt.close(fig)


def test_the_check_finds_overlapping_labels():
    """Two long horizontal labels on neighbouring bars, as the old layout drew them: the check says so."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(6, 3))
    try:
        for ax in axes[1:]:
            ax.bar([0, 1, 2], [2, 2, 3], width=0.7)
            ax.set_ylim(0, 3.3)
            for x, y in ((0, 2), (1, 2)):
                ax.annotate("0.94x vs torch-ddp", (x, y), xytext=(0, 3), textcoords="offset points", ha="center",
                            va="bottom", fontsize=8)
        problems = label_problems(fig)
        assert any("overlaps '0.94x" in p for p in problems), problems
        assert any("overlaps the bar at 2" in p for p in problems), problems
        assert any("leaves its panel" in p for p in problems), problems
    finally:
        plt.close(fig)
