"""The comparison's outputs: the table (with each ringzero row's ratio to its like-for-like stock row,
baselines.LIKE_FOR_LIKE, named in the "vs" column) and the PNG (loss curves, peak memory per rank
measured and estimated, tokens/s)."""
from __future__ import annotations

import math

from .baselines import LIKE_FOR_LIKE

_COLUMNS = [("strategy", "{:<10}", "strategy"), ("train loss", "{:>10.4f}", "final_train_loss"),
            ("val loss", "{:>9.4f}", "final_val_loss"), ("tokens/s", "{:>9.0f}", "tokens_per_s"),
            ("step ms", "{:>8.1f}", "step_ms"), ("peak MiB/rank", "{:>13.1f}", "peak_mib_per_rank"),
            ("estimate MiB", "{:>12.1f}", "estimate_mib_per_rank"), ("comm s", "{:>7.2f}", "comm_s")]
_RATIOS = [("vs", "{:<15}", "ref"), ("tok/s x", "{:>7.2f}", "tokens_per_s"),
           ("step x", "{:>6.2f}", "step_ms"), ("peak x", "{:>6.2f}", "peak_mib_per_rank")]


def ratios(results: list[dict]) -> dict[str, dict]:
    """For each ringzero row with a stock row in `results` (the first of LIKE_FOR_LIKE[row] that ran):
    that row's name ('ref') and our value over theirs for tokens/s, step time and peak memory per rank."""
    by = {r["strategy"]: r for r in results}
    out = {}
    for r in results:
        ref = next((by[name] for name in LIKE_FOR_LIKE.get(r["strategy"], ()) if name in by), None)
        if ref is not None:
            out[r["strategy"]] = {"ref": ref["strategy"], **{k: r[k] / ref[k] if ref[k] else math.nan
                                                             for _, _, k in _RATIOS[1:]}}
    return out


def _cell(fmt: str, value) -> str:
    width = len(fmt.format(0.0 if "f" in fmt else ""))
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-".rjust(width) if ">" in fmt else "-".ljust(width)
    return fmt.format(value)


def table(results: list[dict]) -> str:
    """The table `ringzero train` prints: one row per run; the ratio columns only when a torch row ran."""
    rel = ratios(results)
    name_fmt = "{:<%d}" % max([10] + [len(r["strategy"]) for r in results])  # as wide as the longest name
    cols = [(n, name_fmt if k == "strategy" else f, k) for n, f, k in _COLUMNS] + (_RATIOS if rel else [])
    widths = [len(_cell(fmt, 0.0 if "f" in fmt else "x")) for _, fmt, _ in cols]
    head = " | ".join(f"{n:<{w}}" if fmt.startswith("{:<") else f"{n:>{w}}" for (n, fmt, _), w in zip(cols, widths))
    lines = [head]
    for r in results:
        cells = [_cell(fmt, r.get(key)) for _, fmt, key in cols[:len(_COLUMNS)]]
        if rel:
            mine = rel.get(r["strategy"], {})
            cells += [_cell(fmt, mine.get(key)) for _, fmt, key in _RATIOS]
        lines.append(" | ".join(cells))
    return "\n".join(lines)


_MARKERS = "osD^vP*Xhp<>"
"""One validation marker per run, so that coinciding validation points stay distinguishable."""


def bar_order(results: list[dict]) -> list[str]:
    """The runs in the order the bar panels show them: each ringzero row directly followed by the stock
    row its ratio is taken against (when that row was not placed already), the others in run order."""
    rel = ratios(results)
    order = []
    for r in results:
        name = r["strategy"]
        waiting = name not in rel and any(v["ref"] == name and k not in order for k, v in rel.items())
        if name in order or waiting:
            continue  # a stock row waits for the first ringzero row that is compared with it
        order.append(name)
        if name in rel and rel[name]["ref"] not in order:
            order.append(rel[name]["ref"])
    return order + [r["strategy"] for r in results if r["strategy"] not in order]


def _ratio_label(rel: dict, name: str, order: list[str], key: str) -> str:
    """'1.32x' when the compared stock bar stands right of `name`'s, else '1.32x vs <row>'."""
    i = order.index(name)
    beside = i + 1 < len(order) and order[i + 1] == rel[name]["ref"]
    return f"{rel[name][key]:.2f}x" + ("" if beside else f" vs {rel[name]['ref']}")


def plot_compare(results: list[dict], path: str) -> str:
    """Loss curves, peak memory per rank and tokens/s of the compared runs, in one PNG with one legend
    (below the panels). Each run keeps one colour in all panels; a ringzero row and the stock row it is
    compared with share it (the stock row dotted and hatched). Validation points carry one marker per
    run, offset a little along the step axis so that coinciding ones stay visible. In the bar panels each
    ringzero bar carries its one ratio (ours / the stock bar right of it, the table's "vs" row)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from .layout import BASELINES

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
    for ax, values, key in ((ax_mem, mem, "peak_mib_per_rank"), (ax_tok, tok, "tokens_per_s")):
        top = max([v for v in values if v == v] + [e for e in estimates if e is not None and ax is ax_mem] + [1e-9])
        ax.set_ylim(0, top * 1.15)
        for i, n in enumerate(order):
            if n in rel:
                height = max(values[i], estimates[i] or 0) if ax is ax_mem else values[i]
                ax.annotate(_ratio_label(rel, n, order, key), (i, height), xytext=(0, 3), textcoords="offset points",
                            ha="center", va="bottom", fontsize=8, rotation=90 if len(order) > 10 else 0)

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
    fig.tight_layout(rect=(0, 0.04 + 0.045 * rows, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
