"""The swap-in backend across the lab's hosts (tests/helpers/hostlab.py), as a new user runs it: torchrun per host,
`dist.init_process_group("ringzero")`, stock torch.distributed calls and stock DDP and FSDP2, against the
same calls on a gloo group of the same processes (issue 43's bars).

Collectives: dist.all_reduce, dist.reduce_scatter_tensor and dist.all_gather_into_tensor on float32
buffers of each size (the whole buffer: all-reduce's tensor, reduce-scatter's input, all-gather's output)
on the default group (ringzero) and on dist.new_group(backend="gloo"), the two taking turns in every
repeat; the slowest rank's median (benchmarks/hostlab_bench.py's timing). "of bound" is the link bound
(the bytes each host's link must carry each way for ringzero's algorithm, over the rate) over the time;
results are checked equal to gloo's on integers. "all_reduce x4" is four asynchronous dist.all_reduce calls of
a quarter of the size each, issued together and then waited for (DDP's buckets when the link is the
bottleneck): its link bound is the whole size's.

Training: stock DistributedDataParallel and stock FSDP2 (fully_shard per layer and at the root) of an MLP
with 4.2M float32 parameters (16.8 MB of gradients), AdamW, the same seed and data on both groups: the
median step time over the steps after the first two, and the largest parameter difference after them;
DDP again with 4 MiB buckets (bucket_cap_mb=4: one bucket per layer, so that buckets queue behind each other
on the link); and DDP's steps under no_sync() (no gradient all-reduce: the step's time outside the
collectives). backend_stats shows which ops ran on ringzero's collectives; "tails deferred" counts the
all-reduces whose last segment the next call finished ([Note: the engine's deferred tail],
csrc/torch/backend_hosts.h).

Run as root: nice -n 19 python benchmarks/hostlab_backend.py [--rates-gbit 1] [--sizes-mib 16 64]
[--hosts 2] [--ranks-per-host 2] [--repeats 5] [--steps 20].
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "helpers"))
OPS = ("all_reduce", "reduce_scatter", "all_gather")
WIDTH, LAYERS = 1024, 4  # the MLP: 4 x (1024 x 1024 + 1024) = 4.2M parameters
BATCH = 32


def mlp():
    import torch

    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()]
    return torch.nn.Sequential(*layers[:-1])


def train(kind: str, group, steps: int):
    """Stock DDP or FSDP2 on `group`: (step times in s, parameters after `steps`, flattened). "ddp no_sync":
    DDP's steps under no_sync(), which skips the gradient all-reduces: the step's time outside them."""
    import contextlib

    import torch
    import torch.distributed as dist

    model = mlp()
    if kind.startswith("ddp"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = DDP(model, process_group=group, **({"bucket_cap_mb": 4} if kind == "ddp 4 MiB buckets" else {}))
    else:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        wrapped = fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    times = []
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
        x = torch.randn(BATCH, WIDTH, generator=g)
        dist.barrier(group=group)
        t0 = time.perf_counter()
        optim.zero_grad(set_to_none=True)
        with wrapped.no_sync() if kind == "ddp no_sync" else contextlib.nullcontext():
            wrapped(x).pow(2).mean().backward()
        optim.step()
        times.append(time.perf_counter() - t0)
    params = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
    return times, torch.cat([p.detach().reshape(-1) for p in params])


def rank_main(out: str, sizes_mib: list[float], repeats: int, steps: int):
    import torch
    import torch.distributed as dist

    import ringzero
    from hostlab_bench import slowest_medians_ms

    dist.init_process_group("ringzero")
    world, rank = dist.get_world_size(), dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    rows = []
    for mib in sizes_mib:
        n = int(mib * (1 << 20)) // 4 // world * world
        x, piece = torch.ones(n), torch.ones(n // world)
        ways = {"all_reduce": {"ringzero": lambda: dist.all_reduce(x), "gloo": lambda: dist.all_reduce(x, group=gloo)},
                "reduce_scatter": {"ringzero": lambda: dist.reduce_scatter_tensor(piece, x),
                                   "gloo": lambda: dist.reduce_scatter_tensor(piece, x, group=gloo)},
                "all_gather": {"ringzero": lambda: dist.all_gather_into_tensor(x, piece),
                               "gloo": lambda: dist.all_gather_into_tensor(x, piece, group=gloo)}}
        for op in OPS:
            row = {"op": op, "bytes": n * 4, **slowest_medians_ms(ways[op], repeats)}
            # Equal to gloo's, on integers (exact in float32 at these sizes).
            v = (torch.arange(n) % 7 + rank).float()
            got, want = v.clone(), v.clone()
            if op == "all_reduce":
                dist.all_reduce(got)
                dist.all_reduce(want, group=gloo)
            elif op == "reduce_scatter":
                got, want = torch.empty(n // world), torch.empty(n // world)
                dist.reduce_scatter_tensor(got, v)
                dist.reduce_scatter_tensor(want, v, group=gloo)
            else:
                got, want = torch.empty(n * world), torch.empty(n * world)
                dist.all_gather_into_tensor(got, v)
                dist.all_gather_into_tensor(want, v, group=gloo)
            row["equal"] = bool(torch.equal(got, want))
            rows.append(row)
        # Four calls in a row (DDP's buckets queued behind each other), checked against gloo's likewise.
        quarters = [torch.ones(n // 4) for _ in range(4)]

        def back_to_back(group=None, ts=quarters):
            for w in [dist.all_reduce(t, group=group, async_op=True) for t in ts]:
                w.wait()

        row = {"op": "all_reduce x4", "bytes": n * 4, **slowest_medians_ms(
            {"ringzero": back_to_back, "gloo": lambda: back_to_back(gloo)}, repeats)}
        got = [(torch.arange(n // 4) % 7 + rank + i).float() for i in range(4)]
        want = [t.clone() for t in got]
        back_to_back(None, got)
        back_to_back(gloo, want)
        row["equal"] = all(torch.equal(a, b) for a, b in zip(got, want))
        rows.append(row)
    trained = {}
    from ringzero.comm.backend import hosts_engines

    transport = hosts_engines()[0].transport
    for kind in ("ddp", "ddp 4 MiB buckets", "ddp no_sync", "fsdp2") if steps else ():
        deferred = getattr(transport, "deferred_calls", 0)
        t_rz, p_rz = train(kind, dist.group.WORLD, steps)
        deferred = getattr(transport, "deferred_calls", 0) - deferred
        t_gloo, p_gloo = train(kind, gloo, steps)
        worst = torch.tensor([statistics.median(t_rz[2:]), statistics.median(t_gloo[2:])], dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        trained[kind] = {"ringzero_ms": worst[0].item() * 1e3, "gloo_ms": worst[1].item() * 1e3,
                         "max_diff": (p_rz - p_gloo).abs().max().item(), "params": p_rz.numel(),
                         "deferred": deferred}
    stats = ringzero.backend_stats()
    if rank == 0:
        with open(os.path.join(out, "bench.json"), "w") as f:
            json.dump({"rows": rows, "training": trained, "stats": stats, "world": world}, f)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates-gbit", type=float, nargs="+", default=[1])
    p.add_argument("--sizes-mib", type=float, nargs="+", default=[16, 64])
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--ranks-per-host", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="training steps per run (0: no training rows)")
    p.add_argument("--burst-bytes", type=int, default=None, help="tbf bucket (default: hostlab's)")
    p.add_argument("--rank", metavar="OUT", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank:
        return rank_main(args.rank, args.sizes_mib, args.repeats, args.steps)
    import hostlab
    from hostlab_bench import link_bound_ms, run_in_lab

    H, L = args.hosts, args.ranks_per_host
    print(f"# hostlab_backend | {H} hosts x {L} ranks | init_process_group('ringzero') against a gloo group | "
          f"float32 SUM | median of {args.repeats}, slowest rank | {time.strftime('%Y-%m-%d')}")
    for rate in args.rates_gbit:
        with hostlab.HostLab(H, rate_gbit=rate, burst_bytes=args.burst_bytes) as lab, tempfile.TemporaryDirectory() as out:
            argv = [os.path.abspath(__file__), "--rank", out, "--repeats", str(args.repeats), "--steps",
                    str(args.steps), "--sizes-mib", *map(str, args.sizes_mib)]
            result = run_in_lab(lab, [L] * H, argv, out, 1500)
        print(f"\nlink {rate:g} Gbit/s per host and direction (tbf burst {lab.burst_bytes} B); load average "
              f"{os.getloadavg()[0]:.2f}")
        print(f"{'dist.' + 'op':<16} | {'MiB':>4} | {'ringzero ms':>11} | {'gloo ms':>8} | {'gloo/rz':>7} | "
              f"{'bound ms':>8} | {'of bound':>8} | equal")
        for row in result["rows"]:
            bound = link_bound_ms(row["op"].split()[0], row["bytes"], H, rate)
            print(f"{row['op']:<16} | {row['bytes'] / (1 << 20):>4g} | {row['ringzero']:>11.1f} | {row['gloo']:>8.1f} | "
                  f"{row['gloo'] / row['ringzero']:>6.2f}x | {bound:>8.1f} | {bound / row['ringzero']:>8.0%} | "
                  f"{row['equal']}")
        print(f"\n{'stock model':<17} | {'params':>7} | {'ringzero ms':>11} | {'gloo ms':>8} | {'gloo/rz':>7} | "
              f"max |param diff| after {args.steps} steps | tails deferred (rank 0)")
        for kind, t in result["training"].items():
            print(f"{kind:<17} | {t['params'] / 1e6:>6.1f}M | {t['ringzero_ms']:>11.1f} | {t['gloo_ms']:>8.1f} | "
                  f"{t['gloo_ms'] / t['ringzero_ms']:>6.2f}x | {t['max_diff']:.2e} | {t['deferred']}")
        print(f"\nbackend_stats of rank 0: native {result['stats']['native']}, fallback {result['stats']['fallback']}")


if __name__ == "__main__":
    main()
