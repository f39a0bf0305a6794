"""ZeRO-3 across the lab's hosts with and without ZeRO++'s options (issue 46), against torch FSDP2 on gloo:
`ringzero train` on every host under torchrun (tests/helpers/hostlab.py: network namespaces joined by a
bridge, every link shaped with tbf), the bytes each host sent onto the network counted outside the hosts
(the bridge ports' counters: whole frames, headers included) beside `ringzero estimate`'s count for the same
run (payload only), and the step time `ringzero train` reports.

Bytes per step = (bytes of a run of --steps) - (bytes of a run of --short-steps), over the difference in
steps: setup, checkpoint-free start and the final validation cancel out. Rounds interleave the rows.

Run as root: nice -n 19 python benchmarks/hostlab_zeropp.py [--rate-gbit 1] [--rounds 3] [--zeropp hpz,qw,qg]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(os.path.dirname(HERE), "tests", "helpers"), os.path.join(os.path.dirname(HERE), "python")]

MODEL_ARGS = ["--layers", "4", "--d-model", "320", "--heads", "5", "--val-every", "0", "--no-progress"]
"""5.12M parameters (19.5 MiB in float32, the issue's >= 16 MiB)."""


class RowFailed(Exception):
    """A row's `ringzero train` failed: args (its last error line, the output's end)."""


def run_row(lab, local: int, how: list[str], steps: int, out: str) -> tuple[dict, list[int]]:
    """One `ringzero train` on every host; returns its results.json and the bytes each host sent."""
    before = lab.sent_bytes()
    runs = lab.run([local] * lab.hosts, ["-m", "ringzero.cli.train", *how, *MODEL_ARGS, "--steps", str(steps),
                                         "--out", out], {"RINGZERO_TIMEOUT_S": "300"}, timeout_s=1200)
    sent = [a - b for a, b in zip(lab.sent_bytes(), before)]
    bad = [r for r in runs if r.returncode != 0]
    if bad:
        errors = [line for line in bad[0].output.splitlines() if "Error" in line]
        raise RowFailed(errors[-1].strip() if errors else f"exit {bad[0].returncode}",
                        f"{' '.join(how)}: host {bad[0].host} failed:\n{bad[0].output[-4000:]}")
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f), sent


def estimated_bytes(args, hosts: int, local: int) -> dict:
    """`ringzero estimate`'s bytes per host and step for the two zero3 rows (payload, no headers)."""
    from ringzero.estimate.communication import cross_host_bytes
    from ringzero.estimate.core import estimate
    from ringzero.estimate.plan import Plan
    from ringzero.models import GPTConfig

    i = MODEL_ARGS.index
    cfg = GPTConfig(vocab_size=256, seq_len=args.seq, n_layer=int(MODEL_ARGS[i("--layers") + 1]),
                    n_head=int(MODEL_ARGS[i("--heads") + 1]), d_model=int(MODEL_ARGS[i("--d-model") + 1]))
    out = {}
    for name, zpp in (("zero3", ""), (f"zero3 {args.zeropp}", args.zeropp)):
        plan = Plan("zero3", world=hosts * local, zeropp=zpp, ranks_per_host=local)
        out[name] = cross_host_bytes(estimate(cfg, batch=args.batch, plan=plan))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate-gbit", type=float, default=1.0)
    p.add_argument("--burst-bytes", type=int, default=None, help="tbf bucket (default: hostlab's)")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--ranks-per-host", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=13)
    p.add_argument("--short-steps", type=int, default=3)
    p.add_argument("--zeropp", default="hpz,qw,qg", help="the ZeRO++ row's options")
    p.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--no-fsdp2", action="store_true", help="leave out the torch FSDP2 row")
    p.add_argument("--deepspeed", action="store_true", help="also DeepSpeed's ZeRO-3 with and without the same "
                   "options (its ZeRO++: hpZ, qwZ, qgZ); a row it refuses says why")
    p.add_argument("--quality-steps", type=int, default=0, help="also train zero3 with and without the options for "
                   "this many steps and compare their final validation losses (issue 46: 300)")
    args = p.parse_args()
    import hostlab

    rows = {"zero3": ["--strategy", "zero3"], f"zero3 {args.zeropp}": ["--strategy", "zero3", "--zeropp", args.zeropp]}
    if not args.no_fsdp2:
        rows["torch-fsdp2 (gloo)"] = ["--compare", "torch-fsdp2"]
    if args.deepspeed:
        rows["deepspeed-zero3"] = ["--compare", "deepspeed-zero3"]
        rows[f"deepspeed-zero3 {args.zeropp}"] = ["--compare", "deepspeed-zero3", "--zeropp", args.zeropp]
    refused = {}
    H, L = args.hosts, args.ranks_per_host
    MODEL_ARGS[:0] = ["--batch", str(args.batch), "--seq", str(args.seq)]
    step_ms = {k: [] for k in rows}
    per_step = {k: [] for k in rows}
    loss = {k: [] for k in rows}
    with hostlab.HostLab(H, rate_gbit=args.rate_gbit, burst_bytes=args.burst_bytes) as lab, \
            tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for name, how in rows.items():
                if name in refused:
                    continue
                try:
                    long, sent_long = run_row(lab, L, how, args.steps,
                                              os.path.join(tmp, f"{rnd}-{len(step_ms[name])}-l"))
                    _, sent_short = run_row(lab, L, how, args.short_steps, os.path.join(tmp, f"{rnd}-s"))
                except RowFailed as e:
                    if not name.startswith("deepspeed"):
                        raise SystemExit(e.args[1])
                    refused[name] = e.args[0]
                    print(f"round {rnd} {name}: did not run: {e.args[0]}", flush=True)
                    continue
                step_ms[name].append(long["step_ms"])
                per_step[name].append(sum(a - b for a, b in zip(sent_long, sent_short)) / H /
                                      (args.steps - args.short_steps))
                loss[name].append(long.get("final_train_loss"))
                print(f"round {rnd} {name}: {long['step_ms']:.1f} ms/step, {per_step[name][-1] / 2**20:.2f} MiB sent per "
                      f"host per step, load {os.getloadavg()[0]:.2f}", flush=True)
        quality = {}
        if args.quality_steps:
            for name in list(rows)[:2]:
                how = rows[name] + ["--val-every", str(args.quality_steps), "--val-batches", "8"]
                r, _ = run_row(lab, L, how, args.quality_steps, os.path.join(tmp, f"q-{len(quality)}"))
                quality[name] = r["val_losses"][-1][1]
    base = statistics.median(step_ms["zero3"])
    base_bytes = statistics.median(per_step["zero3"])
    predicted = estimated_bytes(args, H, L)
    print(f"\n# hostlab_zeropp | {H} hosts x {L} ranks | link {args.rate_gbit:g} Gbit/s (tbf burst {lab.burst_bytes} B) | "
          f"{' '.join(MODEL_ARGS)} | "
          f"medians of {args.rounds} rounds, steps {args.short_steps + 1}-{args.steps}")
    print(f"{'run':<24} | {'step ms':>8} | {'zero3 / run':>11} | {'MiB/host/step':>13} | {'estimate':>8} | "
          f"{'of zero3 bytes':>14} | spread ms")
    for name in rows:
        if name in refused:
            print(f"{name:<24} | did not run: {refused[name]}")
            continue
        ms, b = statistics.median(step_ms[name]), statistics.median(per_step[name])
        est = predicted.get(name)
        print(f"{name:<24} | {ms:>8.1f} | {base / ms:>10.2f}x | {b / 2**20:>13.2f} | "
              f"{f'{est / 2**20:.2f}' if est else '-':>8} | {b / base_bytes:>13.0%} | "
              f"{min(step_ms[name]):.0f}-{max(step_ms[name]):.0f}")
    if quality:
        (a, va), (b, vb) = quality.items()
        print(f"\nafter {args.quality_steps} steps: validation loss {a} {va:.4f}, {b} {vb:.4f} ({(vb - va) / va:+.2%})")


if __name__ == "__main__":
    main()
