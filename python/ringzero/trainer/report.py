"""The comparison's outputs: the table (with each ringzero row's ratio to its like-for-like stock row,
registry.LIKE_FOR_LIKE, named in the "vs" column) and the PNG (loss curves, peak memory per rank
measured and estimated, tokens/s). Runs with expert parallelism add an "a2a s" column (their all-to-alls,
Run.exchange_seconds) and its ratio "a2a x". Runs that carry the step-time model's prediction
(estimate_check.predicted_step_for_run) add "cores ms" (the median step less waits for a core), "pred ms" and
"pred x", the first over the second."""
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
_PRED = [("cores ms", "{:>8.1f}", "step_ms_on_cores"), ("pred ms", "{:>8.1f}", "pred_step_ms"),
         ("pred x", "{:>6.2f}", "pred_x")]
"""The median step on the ranks' cores (less the slowest rank's wait for a core: [Note: a step's time on
its cores] in loop.py), the step-time model's step (CPU ranks: a CPU kind calibrated in the ranks,
estimate/cpu_kind.py) and the first over the second; '-' where not predicted (pred_note says why)."""


def _with_prediction(r: dict) -> dict:
    """`r` with pred_x: its median step on its cores (step_ms where that was not kept) over its predicted step."""
    pred, measured = r.get("pred_step_ms"), r.get("step_ms_on_cores", r.get("step_ms"))
    return {**r, "pred_x": measured / pred if pred and measured else None}


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


def _prediction_notes(results: list[dict]) -> list[str]:
    """What the pred columns are, with the range of the rates calibrated in the runs, and why a row has none."""
    cpu = [r["pred_cpu"] for r in results if r.get("pred_cpu")]
    lines = []
    if cpu:
        flops = [c["gemm_flops_per_s"] / 1e9 for c in cpu]
        copy = [c["memory_bytes_per_s"] / 1e9 for c in cpu]
        lines.append(f"pred ms: ringzero.estimate's step-time model on a CPU kind calibrated in each run's ranks "
                     f"(float32 GEMMs {min(flops):.1f}-{max(flops):.1f} GFLOP/s, memory-bound kernels "
                     f"{min(copy):.1f}-{max(copy):.1f} GB/s) and one host's shared memory; cores ms = the median step "
                     f"less the slowest rank's wait for a core; pred x = cores ms / pred ms")
    lines += [f"pred ms of {r['strategy']}: {r['pred_note']}" for r in results if r.get("pred_note")]
    return lines


def table(results: list[dict]) -> str:
    """The table `ringzero train` prints: one row per run; the ratio columns only when a torch row ran."""
    rel = ratios(results)
    name_fmt = "{:<%d}" % max([10] + [len(r["strategy"]) for r in results])  # as wide as the longest name
    a2a = any(r.get("a2a_s") is not None for r in results)
    own = [(n, name_fmt if k == "strategy" else f, k) for n, f, k in _COLUMNS] + ([_A2A] if a2a else [])
    predicted = any("pred_step_ms" in r for r in results)
    if predicted:
        at = next(i for i, (_, _, k) in enumerate(own) if k == "step_ms") + 1
        own[at:at] = _PRED
        results = [_with_prediction(r) for r in results]
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
    if predicted:
        lines += _prediction_notes(results)
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
