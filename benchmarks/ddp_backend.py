"""Stock torch DDP step time on the "ringzero" backend against the same on gloo, in the same run.

    PYTHONPATH=python python benchmarks/ddp_backend.py --world 2 4

Each rank trains two replicas of the same ringzero.models.GPT with stock
torch.nn.parallel.DistributedDataParallel, one on a gloo group and one on a group made with
backend="ringzero", one step of each in turn (the order alternating by step, so that changes in
machine load hit both alike). The table gives the median step time of each (forward, backward with
DDP's bucketed all-reduces, AdamW step) and the ratio gloo / ringzero (above 1: ringzero faster),
and the same for the process CPU time per step (all threads), which other work on the machine
disturbs less than wall time. A second table times one all-reduce of the whole
gradient (float32) on each group, with bus bandwidth (algbw x 2(n-1)/n) and the fraction of the
memory floor: every rank's B bytes of gradient must be read once and written once, 2 n B bytes spread
over the n ranks' cores, so no algorithm beats 2 B at the single-core copy bandwidth measured in this
run. (Until 2026-11-28 the floor was the two-shot algorithm's own traffic, 5 B + B/n per rank; staged
through slots that stay in cache, the swap-in door's blocking all-reduce beat it, 116-122% of it on an
Intel Xeon VM with a 480 MiB L3: that was no floor.)
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))


def _model(args):
    from ringzero.models import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=256, seq_len=args.seq_len, n_layer=args.layers, n_head=4, d_model=args.width))


def _time_ddp(groups: dict, args, rank) -> dict:
    """Trains one DDP replica per group, one step of each in turn (the order alternating by step, so
    that changes in machine load hit both alike); returns per-step wall and process CPU seconds."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ringzero.models import lm_loss

    models = {name: DDP(_model(args), process_group=g) for name, g in groups.items()}
    optims = {name: torch.optim.AdamW(m.parameters(), lr=1e-3) for name, m in models.items()}
    g = torch.Generator().manual_seed(rank)
    tokens = torch.randint(0, 256, (args.batch, args.seq_len + 1), generator=g)
    times = {name: {"wall": [], "cpu": []} for name in groups}
    names = list(groups)
    for step in range(args.warmup + args.steps):
        for name in (names if step % 2 == 0 else names[::-1]):
            dist.barrier(group=groups[name])
            t0, c0 = time.perf_counter(), time.process_time()
            optims[name].zero_grad(set_to_none=True)
            lm_loss(models[name](tokens[:, :-1]), tokens[:, 1:]).backward()
            optims[name].step()
            if step >= args.warmup:
                times[name]["wall"].append(time.perf_counter() - t0)
                times[name]["cpu"].append(time.process_time() - c0)
    return times


def _time_all_reduce(group, numel: int, reps: int) -> float:
    x = torch.ones(numel)
    for _ in range(3):
        dist.all_reduce(x, group=group)
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(reps):
        dist.all_reduce(x, group=group)
    return (time.perf_counter() - t0) / reps


def _copy_bandwidth(numel: int) -> float:
    """Bytes per second of one core copying float32 (read + write counted)."""
    src, dst = torch.ones(numel), torch.empty(numel)
    dst.copy_(src)
    best = float("inf")
    for _ in range(10):  # the best of ten: other work on the machine only ever slows a copy down
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * 4 * numel / best


def _rank(rank, world, store_path, args, out):
    torch.set_num_threads(1)
    import ringzero  # noqa: F401  (registers the backend)

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    groups = {"gloo": dist.new_group(backend="gloo"), "ringzero": dist.new_group(backend="ringzero")}
    steps = _time_ddp(groups, args, rank)
    numel = sum(p.numel() for p in _model(args).parameters())
    ar = {name: statistics.median(_time_all_reduce(g, numel, 5) for _ in range(3)) for name, g in groups.items()}
    copy_bw = _copy_bandwidth(numel)
    if rank == 0:
        out.put({"world": world, "numel": numel, "steps": steps, "all_reduce": ar, "copy_bw": copy_bw})
    dist.barrier()
    dist.destroy_process_group()


def run(world: int, args) -> dict:
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_rank, args=(r, world, os.path.join(tmp, "store"), args, out)) for r in range(world)]
        for p in procs:
            p.start()
        result = out.get(timeout=args.timeout_s)
        for p in procs:
            p.join(timeout=60)
            if p.exitcode != 0:
                raise RuntimeError(f"a rank exited with {p.exitcode}")
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=40, help="timed steps per backend")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=1800)
    args = parser.parse_args(argv)

    print(f"# torch {torch.__version__}, {os.cpu_count()} CPUs, GPT {args.layers}x{args.width}, "
          f"batch {args.batch}x{args.seq_len}, {args.steps} steps each (medians), 1 thread per rank")
    print(f"{'world':>5} {'params':>9} {'grad MB':>8} {'gloo ms/step':>13} {'ringzero ms/step':>17} {'ratio':>6} "
          f"{'gloo CPU ms':>12} {'ringzero CPU ms':>16} {'CPU ratio':>9}")
    rows = []
    for world in args.world:
        r = run(world, args)
        gloo, ours = (statistics.median(r["steps"][k]["wall"]) * 1e3 for k in ("gloo", "ringzero"))
        gcpu, zcpu = (statistics.median(r["steps"][k]["cpu"]) * 1e3 for k in ("gloo", "ringzero"))
        print(f"{world:>5} {r['numel']:>9} {r['numel'] * 4 / 1e6:>8.2f} {gloo:>13.2f} {ours:>17.2f} {gloo / ours:>6.2f} "
              f"{gcpu:>12.2f} {zcpu:>16.2f} {gcpu / zcpu:>9.2f}", flush=True)
        rows.append(r)
    print()
    print(f"{'world':>5} {'bytes':>10} {'gloo us':>9} {'gloo busbw GB/s':>16} {'ringzero us':>12} "
          f"{'ringzero busbw GB/s':>20} {'ratio':>6} {'floor frac':>10}")
    for r in rows:
        n, nbytes = r["world"], r["numel"] * 4
        bus = lambda t: nbytes / t * 2 * (n - 1) / n / 1e9  # noqa: E731
        g, z = r["all_reduce"]["gloo"], r["all_reduce"]["ringzero"]
        floor_s = 2 * nbytes / r["copy_bw"]
        print(f"{n:>5} {nbytes:>10} {g * 1e6:>9.0f} {bus(g):>16.2f} {z * 1e6:>12.0f} {bus(z):>20.2f} "
              f"{g / z:>6.2f} {floor_s / z:>10.2f}")
    print(f"# single-core copy bandwidth measured in this run: {rows[-1]['copy_bw'] / 1e9:.2f} GB/s (read + write)")


if __name__ == "__main__":
    main()
