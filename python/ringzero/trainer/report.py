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


def plot_compare(results: list[dict], path: str) -> str:
    """Loss curves, peak memory per rank and tokens/s of the compared runs, in one PNG; ringzero rows
    with a matching torch row carry their ratio to it above their bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rel = ratios(results)
    fig, (ax_loss, ax_mem, ax_tok) = plt.subplots(1, 3, figsize=(15, 4.2))
    for r in results:
        steps, loss = zip(*r["train_losses"])
        style = ":" if r["strategy"].startswith("torch") else "-"
        line, = ax_loss.plot(steps, loss, style, label=f"{r['strategy']} train", linewidth=1)
        if r["val_losses"]:
            vs, vl = zip(*r["val_losses"])
            ax_loss.plot(vs, vl, "o--", color=line.get_color(), label=f"{r['strategy']} val", markersize=4)
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss (nats/byte)")
    ax_loss.legend(fontsize=7)
    names = [r["strategy"] for r in results]
    pos = list(range(len(names)))
    mem = [r["peak_mib_per_rank"] for r in results]
    ax_mem.bar([i - 0.2 for i in pos], mem, width=0.4, color="tab:orange", label="measured (live tensors)")
    estimates = [math.nan if r.get("estimate_mib_per_rank") is None else r["estimate_mib_per_rank"] for r in results]
    ax_mem.bar([i + 0.2 for i in pos], estimates, width=0.4, color="tab:gray",
               label="ringzero.estimate")
    ax_mem.set_xticks(pos, names, rotation=30, fontsize=8)
    ax_mem.set_ylabel("peak MiB, fullest rank")
    ax_mem.legend(fontsize=7)
    tok = [r["tokens_per_s"] for r in results]
    ax_tok.bar(names, tok, color=["tab:blue" if n.startswith("torch") else "tab:green" for n in names])
    ax_tok.set_xticks(pos, names, rotation=30, fontsize=8)
    ax_tok.set_ylabel("tokens/s")
    for i, n in enumerate(names):
        if n in rel:
            ax_mem.annotate(f"x{rel[n]['peak_mib_per_rank']:.2f}", (i - 0.2, mem[i]), ha="center", va="bottom", fontsize=7)
            ax_tok.annotate(f"x{rel[n]['tokens_per_s']:.2f}\nvs {rel[n]['ref']}", (i, tok[i]), ha="center",
                            va="bottom", fontsize=7)
    first = results[0]
    fig.suptitle(f"ringzero train: {first['ranks']} ranks, {first['steps']} steps, {first['params'] / 1e6:.2f}M params, "
                 f"{first.get('device', 'cpu')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
