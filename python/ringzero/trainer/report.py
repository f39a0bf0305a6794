"""The comparison's outputs: the table (with each ringzero row's ratio to its like-for-like stock row,
registry.LIKE_FOR_LIKE, named in the "vs" column) and the PNG (loss curves, peak memory per rank
measured and estimated, tokens/s). Runs with expert parallelism add an "a2a s" column (their all-to-alls,
Run.exchange_seconds) and its ratio "a2a x"."""
from __future__ import annotations

import math

from .registry import LIKE_FOR_LIKE

_COLUMNS = [("strategy", "{:<10}", "strategy"), ("train loss", "{:>10.4f}", "final_train_loss"),
            ("val loss", "{:>9.4f}", "final_val_loss"), ("tokens/s", "{:>9.0f}", "tokens_per_s"),
            ("step ms", "{:>8.1f}", "step_ms"), ("peak MiB/rank", "{:>13.1f}", "peak_mib_per_rank"),
            ("estimate MiB", "{:>12.1f}", "estimate_mib_per_rank"), ("comm s", "{:>7.2f}", "comm_s")]
_RATIOS = [("vs", "{:<15}", "ref"), ("tok/s x", "{:>7.2f}", "tokens_per_s"),
           ("step x", "{:>6.2f}", "step_ms"), ("peak x", "{:>6.2f}", "peak_mib_per_rank")]
_A2A = ("a2a s", "{:>6.2f}", "a2a_s")
"""Seconds in expert parallelism's all-to-alls (slowest rank), shown when a row has them; a ringzero row's
comm s includes them."""
_A2A_RATIO = ("a2a x", "{:>6.2f}", "a2a_s")


def ratios(results: list[dict]) -> dict[str, dict]:
    """For each ringzero row with a stock row in `results` (the first of LIKE_FOR_LIKE[row] that ran):
    that row's name ('ref') and our value over theirs for tokens/s, step time and peak memory per rank,
    and for the all-to-all seconds (a2a_s) where both rows have them."""
    by = {r["strategy"]: r for r in results}
    out = {}
    for r in results:
        ref = next((by[name] for name in LIKE_FOR_LIKE.get(r["strategy"], ()) if name in by), None)
        if ref is not None:
            out[r["strategy"]] = {"ref": ref["strategy"], **{k: r[k] / ref[k] if ref[k] else math.nan
                                                             for _, _, k in _RATIOS[1:]}}
            if r.get("a2a_s") is not None and ref.get("a2a_s"):
                out[r["strategy"]]["a2a_s"] = r["a2a_s"] / ref["a2a_s"]
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
    a2a = any(r.get("a2a_s") is not None for r in results)
    own = [(n, name_fmt if k == "strategy" else f, k) for n, f, k in _COLUMNS] + ([_A2A] if a2a else [])
    ratio_cols = (_RATIOS + ([_A2A_RATIO] if a2a else [])) if rel else []
    cols = own + ratio_cols
    widths = [len(_cell(fmt, 0.0 if "f" in fmt else "x")) for _, fmt, _ in cols]
    head = " | ".join(f"{n:<{w}}" if fmt.startswith("{:<") else f"{n:>{w}}" for (n, fmt, _), w in zip(cols, widths))
    lines = [head]
    for r in results:
        mine = rel.get(r["strategy"], {})
        cells = [_cell(fmt, r.get(key)) for _, fmt, key in own]
        cells += [_cell(fmt, mine.get(key)) for _, fmt, key in ratio_cols]
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
