"""Plot saved `ringzero bench` tables: bus bandwidth against message size, ringzero beside gloo.

    ringzero bench --nproc 2 > benchmarks/results/cpu-collectives-2ranks-DATE.txt
    python benchmarks/plot_collectives.py benchmarks/results/cpu-collectives-*ranks-DATE.txt \
        --out benchmarks/results/cpu-collectives-DATE.png

One panel per collective, one line per (file, backend): solid ringzero, dashed gloo, one colour per
file (its "ranks N" header). It reads what `ringzero bench` printed, so the plot shows that run's
numbers and nothing else; rows without a gloo column (`--no-gloo`) plot ringzero only.
"""
from __future__ import annotations

import argparse
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import torch  # noqa: E402

from ringzero.cli.bench import BUS_FACTOR, DTYPES  # noqa: E402


def read_table(path: str) -> tuple[str, dict[str, list[tuple[int, float, float | None]]]]:
    """(label, {op: [(bytes, ringzero busbw, gloo busbw or None)]}) of one `ringzero bench` output."""
    world, elem, op, rows = None, None, None, {}
    with open(path) as f:
        for line in f:
            if line.startswith("# ringzero"):
                m = re.search(r"ranks (\d+)", line)
                world = int(m.group(1)) if m else None
                m = re.search(r"dtype (\w+)", line)
                elem = torch.tensor([], dtype=DTYPES[m.group(1)]).element_size() if m else None
            elif line.startswith("## "):
                op = line[3:].strip()
                rows[op] = []
            elif op and "|" in line and not line.lstrip().startswith("size"):
                cols = [c.split() for c in line.split("|")]
                size = int(cols[0][1]) * elem
                # busbw from the time columns (the printed GB/s round small sizes to 0.00); time in us
                factor = BUS_FACTOR[op](world)
                ours = size / float(cols[1][0]) * 1e-3 * factor
                tg = float(cols[2][0]) if len(cols) > 2 else None    # no gloo columns under --no-gloo
                gloo = size / tg * 1e-3 * factor if tg and tg == tg else None    # older files: nan
                rows[op].append((size, ours, gloo))
    if world is None or elem is None or not any(rows.values()):
        raise SystemExit(f"{path}: no `ringzero bench` output found (expected its '# ringzero ... ranks N' "
                         f"header with its dtype, and '## <op>' tables)")
    return f"{world} ranks", rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tables", nargs="+", help="files written from `ringzero bench` output")
    p.add_argument("--out", required=True, help="PNG to write")
    args = p.parse_args(argv)
    tables = [read_table(t) for t in args.tables]
    ops = list(dict.fromkeys(op for _, rows in tables for op in rows))
    fig, axes = plt.subplots(1, len(ops), figsize=(5 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for i, (label, rows) in enumerate(tables):
            pts = rows.get(op, [])
            if not pts:
                continue
            color = f"C{i}"
            ax.plot([s for s, _, _ in pts], [b for _, b, _ in pts], "-o", ms=3, color=color, label=f"ringzero, {label}")
            gloo = [(s, g) for s, _, g in pts if g is not None]
            if gloo:
                ax.plot(*zip(*gloo), "--", color=color, label=f"gloo, {label}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(op)
        ax.set_xlabel("message bytes")
        ax.set_ylabel("busbw GB/s")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
