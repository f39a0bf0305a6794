"""Stock FSDP2 (`torch.distributed.fsdp.fully_shard`) step time on the "ringzero" backend, against gloo and
optionally against another build of ringzero, on one host.

    python benchmarks/fsdp2_backend.py [--other /path/to/other/python] [--runs 5]

Each run is a fresh job of 2 ranks (one core each, one thread): an MLP of --layers x Linear(--width,
--width), each layer and the root sharded, batch 16, AdamW; rank 0's median step of steps 5..--steps. The
jobs of the configurations take turns (this build's ringzero, the other build's, gloo), so that changes in
the machine's load fall on all alike. FSDP2 all-gathers each layer's parameters with async_op=True and
waits on the Work, and reduce-scatters its gradients likewise: the backend's per-call cost shows here
([Note: the caller runs its own collective] in csrc/torch/backend_work.h).
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
THIS = os.path.join(os.path.dirname(HERE), "python")


def rank_main(rank: int, world: int, store: str, backend: str, layers: int, width: int, steps: int, out: str):
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    import ringzero  # noqa: F401  registers the backend

    torch.set_num_threads(1)
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    dist.init_process_group(backend, store=dist.FileStore(store, world), rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    for m in model:
        fully_shard(m)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(16, width)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        with open(out, "w") as f:
            f.write(str(statistics.median(times[5:]) * 1e3))
    dist.destroy_process_group()


def one_job(python_dir: str, backend: str, args) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        env = {**os.environ, "PYTHONPATH": python_dir}
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(r), "--store",
                                   os.path.join(tmp, "store"), "--backend", backend, "--out", out, "--layers",
                                   str(args.layers), "--width", str(args.width), "--steps", str(args.steps)],
                                  env=env, stderr=subprocess.DEVNULL) for r in range(2)]
        if any(p.wait(timeout=600) != 0 for p in procs):
            raise SystemExit(f"a rank of the {backend} job ({python_dir}) failed")
        with open(out) as f:
            return float(f.read())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--other", help="the python/ folder of another build of ringzero to compare with")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank is not None:
        return rank_main(args.rank, 2, args.store, args.backend, args.layers, args.width, args.steps, args.out)
    configs = [("ringzero, this build", THIS, "ringzero")]
    if args.other:
        configs.append(("ringzero, other build", args.other, "ringzero"))
    configs.append(("gloo", THIS, "gloo"))
    print(f"# fsdp2_backend | 2 ranks | {args.layers} x Linear({args.width}, {args.width}), batch 16 | ms per step, "
          f"rank 0's median of steps 5-{args.steps} | load average {os.getloadavg()[0]:.2f}")
    got = {name: [] for name, _, _ in configs}
    for i in range(args.runs):
        for name, path, backend in configs:
            got[name].append(one_job(path, backend, args))
        print(f"run {i}: " + " | ".join(f"{name} {got[name][-1]:.2f}" for name, _, _ in configs), flush=True)
    gloo = statistics.median(got["gloo"])
    print(f"\n{'configuration':<24} | {'median ms':>9} | gloo / this")
    for name, _, _ in configs:
        m = statistics.median(got[name])
        print(f"{name:<24} | {m:9.2f} | {gloo / m:.2f}")


if __name__ == "__main__":
    main()
