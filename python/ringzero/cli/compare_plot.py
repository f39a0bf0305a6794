"""compare.png of `ringzero train --compare`: loss curves, peak memory per rank (measured and estimated)
and tokens/s of the compared runs, each ringzero bar labelled with its ratio to its stock row. The ratio
labels are placed by measuring them: horizontal when every label fits its bar's slot, else upright, and
the bar panels' y range grown until every label fits inside its panel, so that no label crosses another
label or a bar it does not belong to at any number of rows (tests/trainer/test_compare_plot.py draws 9 and 12)."""
from __future__ import annotations

import math

from ..trainer.layout import BASELINES
from ..trainer.report import _MARKERS, _ratio_label, bar_order, ratios

DPI = 110
LABEL_FONT_PT = 8
LABEL_GAP_PT = 3  # between a bar's top (or its estimate mark) and its label
SLOT_FILL = 0.9  # a horizontal label may take this share of the distance between bar centres
HEADROOM = 0.04  # share of a panel's height kept free above the highest label


def _fit_labels(fig, ax, labels: list, anchors: list[float], top: float):
    """Turns `labels` (annotations at data heights `anchors`) upright when one is wider than its slot,
    then sets the panel's y range so that the highest label ends HEADROOM below the panel's top. The
    labels' sizes are in points, the bars' heights in data units: the range is solved from the panel's
    height in pixels, which the caller's tight_layout fixes first."""
    renderer = fig.canvas.get_renderer()
    box = ax.get_window_extent(renderer)
    pitch = box.width / max(1, len(ax.get_xticks()))
    if any(t.get_window_extent(renderer).width > SLOT_FILL * pitch for t in labels):
        for t in labels:
            t.set_rotation(90)
    gap = LABEL_GAP_PT * fig.dpi / 72
    limit = top * 1.05
    for t, anchor in zip(labels, anchors):
        room = box.height * (1 - HEADROOM) - gap - t.get_window_extent(renderer).height
        if room > 0 and anchor > 0:
            limit = max(limit, anchor * box.height / room)
    ax.set_ylim(0, limit)


def draw_compare(results: list[dict]):
    """The comparison figure (matplotlib, Agg), before saving: axes 0 the losses, 1 peak memory per rank,
    2 tokens/s; each ringzero bar's ratio label is an annotation (ax.texts) at its bar's x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    rel = ratios(results)
    by = {r["strategy"]: r for r in results}
    order = bar_order(results)
    palette = plt.get_cmap("tab10").colors
    colour, next_colour = {}, 0
    for name in order:  # a stock row takes the colour of the first ringzero row compared with it
        if name not in colour:
            colour[name] = palette[next_colour % len(palette)]
            next_colour += 1
        if name in rel:
            colour.setdefault(rel[name]["ref"], colour[name])
    stock = {n: n in BASELINES for n in order}
    marker = {n: _MARKERS[i % len(_MARKERS)] for i, n in enumerate(order)}

    fig, (ax_loss, ax_mem, ax_tok) = plt.subplots(1, 3, figsize=(16, 5.2))
    val_steps = sorted({s for r in results for s, _ in r["val_losses"]})
    gap = min([b - a for a, b in zip(val_steps, val_steps[1:])] + [max(1, val_steps[-1] if val_steps else 1)])
    offset = 0.5 * gap / max(1, len(order))  # the runs' markers spread over half the gap between validations
    for i, name in enumerate(order):
        r = by[name]
        if r["train_losses"]:
            steps, loss = zip(*r["train_losses"])
            ax_loss.plot(steps, loss, ":" if stock[name] else "-", color=colour[name], linewidth=1.4 if stock[name] else 1)
        if r["val_losses"]:
            vs, vl = zip(*r["val_losses"])
            shift = (i - (len(order) - 1) / 2) * offset
            ax_loss.plot([v + shift for v in vs], vl, linestyle="none", marker=marker[name], markersize=6,
                         color=colour[name], markerfacecolor="none" if stock[name] else colour[name])
    ax_loss.set_xlabel("step (validation points offset slightly)")
    ax_loss.set_ylabel("loss (nats/byte)")
    ax_loss.set_title("train loss (lines), validation loss (markers)", fontsize=9)

    pos = list(range(len(order)))
    mem = [by[n]["peak_mib_per_rank"] for n in order]
    tok = [by[n]["tokens_per_s"] for n in order]
    estimates = [by[n].get("estimate_mib_per_rank") for n in order]
    for ax, values in ((ax_mem, mem), (ax_tok, tok)):
        ax.bar(pos, values, width=0.7, color=[colour[n] for n in order], edgecolor="black", linewidth=0.5,
               hatch=None, alpha=0.9)
        for i, n in enumerate(order):
            if stock[n]:
                ax.bar(i, values[i], width=0.7, color="white", edgecolor=colour[n], hatch="///", linewidth=1)
        ax.set_xticks(pos, order, rotation=35, ha="right", fontsize=8)
    ax_mem.scatter([i for i, e in zip(pos, estimates) if e is not None], [e for e in estimates if e is not None],
                   marker="_", s=500, color="black", linewidths=2, zorder=3)
    ax_mem.set_ylabel("peak MiB, fullest rank")
    ax_mem.set_title("peak memory per rank (live tensors); ratio as on the right", fontsize=9)
    ax_tok.set_ylabel("tokens/s")
    ax_tok.set_title("throughput; ratio = ringzero / the stock bar on its right", fontsize=9)
    placed = []  # (axes, labels, the heights they stand on, the panel's highest mark)
    for ax, values, key in ((ax_mem, mem, "peak_mib_per_rank"), (ax_tok, tok, "tokens_per_s")):
        top = max([v for v in values if v == v] + [e for e in estimates if e is not None and ax is ax_mem] + [1e-9])
        ax.set_ylim(0, top * 1.15)
        labels, anchors = [], []
        for i, n in enumerate(order):
            if n in rel:
                height = max(values[i], estimates[i] or 0) if ax is ax_mem else values[i]
                labels.append(ax.annotate(_ratio_label(rel, n, order, key), (i, height), xytext=(0, LABEL_GAP_PT),
                                          textcoords="offset points", ha="center", va="bottom",
                                          fontsize=LABEL_FONT_PT))
                anchors.append(height)
        placed.append((ax, labels, anchors, top))

    handles = [Line2D([], [], color=colour[n], linestyle=":" if stock[n] else "-", marker=marker[n],
                      markerfacecolor="none" if stock[n] else colour[n], label=n) for n in order]
    handles.append(Line2D([], [], color="black", linestyle="none", marker="_", markersize=14, markeredgewidth=2,
                          label="ringzero.estimate"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 9), fontsize=8, frameon=False)
    first = results[0]
    model = first.get("model", "gpt")
    fig.suptitle(f"ringzero train: {model}, {first['ranks']} ranks, {first['steps']} steps, "
                 f"{first['params'] / 1e6:.2f}M params, {first.get('device', 'cpu')}")
    rows = math.ceil(len(handles) / 9)
    fig.set_dpi(DPI)
    for _ in range(2):  # the y ranges change the tick labels' widths, which tight_layout then answers
        fig.tight_layout(rect=(0, 0.04 + 0.045 * rows, 1, 1))
        for ax, labels, anchors, top in placed:
            _fit_labels(fig, ax, labels, anchors, top)
    return fig


def plot_compare(results: list[dict], path: str) -> str:
    """Writes the comparison PNG to `path` and returns it. Each run keeps one colour in all panels; a
    ringzero row and the stock row it is compared with share it (the stock row dotted and hatched).
    Validation points carry one marker per run, offset a little along the step axis so that coinciding
    ones stay visible. In the bar panels each ringzero bar carries its one ratio (ours / the stock bar
    right of it, or the one it names: the table's "vs" row)."""
    import matplotlib.pyplot as plt

    fig = draw_compare(results)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
