"""Seeing a schedule: a timeline (simulated or measured) as a Chrome trace and as a PNG.

Open the JSON in chrome://tracing or https://ui.perfetto.dev; each rank is a row ("thread").
"""
from __future__ import annotations

import json

from .plan import Kind
from .simulate import Timeline

COLORS = {Kind.F: "#4c72b0", Kind.B: "#dd8452", Kind.I: "#c44e52", Kind.W: "#55a868"}


def chrome_trace(timeline: Timeline, path: str, us_per_unit: float = 1e6, name: str = "pipeline") -> None:
    """Writes `timeline` (per rank: (action, start, end)) as Chrome trace events; times are multiplied by
    us_per_unit (1e6 for seconds) and shifted so that the first action starts at 0."""
    t0 = min((s for row in timeline for _, s, _ in row), default=0.0)
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": name}}]
    for r, row in enumerate(timeline):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}})
        for a, start, end in row:
            events.append({"name": str(a), "cat": a.kind.value, "ph": "X", "pid": 0, "tid": r,
                           "ts": (start - t0) * us_per_unit, "dur": (end - start) * us_per_unit,
                           "args": {"stage": a.stage, "microbatch": a.microbatch}})
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)


def plot_timelines(panels: list[tuple[str, Timeline, str]], path: str) -> None:
    """Writes a PNG with one panel per (title, timeline, time unit label), ranks as rows, F/B/I/W colored,
    each box labelled with its microbatch (and stage, when a rank holds several)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, figsize=(14, 1.0 + 0.6 * sum(len(t) for _, t, _ in panels)),
                             squeeze=False)
    for ax, (title, timeline, unit) in zip(axes[:, 0], panels):
        t0 = min((s for row in timeline for _, s, _ in row), default=0.0)
        multi = any(len({a.stage for a, _, _ in row}) > 1 for row in timeline)
        for r, row in enumerate(timeline):
            for a, start, end in row:
                ax.broken_barh([(start - t0, end - start)], (r - 0.4, 0.8), facecolors=COLORS[a.kind],
                               edgecolor="white", linewidth=0.5)
                label = f"{a.stage}.{a.microbatch}" if multi else str(a.microbatch)
                ax.text(start - t0 + (end - start) / 2, r, label, ha="center", va="center", fontsize=6, color="white")
        ax.set_yticks(range(len(timeline)), [f"rank {r}" for r in range(len(timeline))])
        ax.invert_yaxis()
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(unit, fontsize=8)
    handles = [matplotlib.patches.Patch(color=c, label=k.value) for k, c in COLORS.items()]
    fig.legend(handles=handles, loc="upper right", ncol=4, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
