"""Training step time and peak memory per rank on CPU: torch DDP, ringzero DDP, torch
ZeroRedundancyOptimizer, torch FSDP2 (fully_shard per block) and ringzero ZeRO-1/2/3, all in one run
on the shared GPT (ringzero.models.GPT, default GPTConfig: about 3.3 M parameters), float32, AdamW.

    PYTHONPATH=python python benchmarks/training.py --worlds 2 4 --steps 5

Each (world, method) runs in freshly forked ranks, `--rounds` times with the methods interleaved.
Step time: median over timed steps of the slowest rank (forward, backward, optimizer step,
zero_grad), the fastest round reported (work by others on a shared machine only adds time).
CPU ms: CPU time per step summed over all ranks and their threads (median step, lowest round): less
sensitive to other work than wall time, and it charges spin-waiting in collectives to the method. Peak memory: growth of the rank's peak resident
set (VmHWM, reset through /proc/self/clear_refs) over its resident set before the model was built,
with glibc told to return every allocation of 64 KiB or more to the OS (so RSS follows live tensors),
after one plain step of a throwaway model has made the shared code pages and thread pools resident.
ringzero's shared-memory staging segment (RINGZERO_SHM_BUFFER_BYTES x 2 per rank, shared by the ranks)
is resident in every rank's RSS; "shm seg" shows it and "by share" counts each rank's share only.
Tensor MiB: the most tensor bytes alive at once (ringzero.memory.TensorMemoryMeter, counting every
storage from allocation to release, what torch.cuda.max_memory_allocated counts on a GPU), in a second
pass after the timed one: the model built and wrapped under the meter, two steps (the second has the
optimizer state). It leaves out what is not a tensor (the staging segment, allocator slack).
For ringzero ZeRO the bytes of params + grads + optimizer state (model.memory_bytes, after backward)
are printed beside the ZeRO paper's formula with this run's 4-byte parameters and gradients.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "helpers"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import torch  # noqa: E402

from harness import run_ranks  # noqa: E402

METHODS = ["torch-ddp", "ringzero-ddp", "torch-zero-redundancy", "torch-fsdp2", "ringzero-zero1",
           "ringzero-zero2", "ringzero-zero3"]
MIB = 1 << 20


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _shm_segment_kib() -> tuple[int, int]:
    """(Rss, Pss) in KiB of ringzero's shared-memory staging segments mapped in this process."""
    rss = pss = 0
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                inside = any("ringzero-" in h for h in head[5:])
            elif inside and head[0] == "Rss:":
                rss += int(head[1])
            elif inside and head[0] == "Pss:":
                pss += int(head[1])
    return rss, pss


def _reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


def build(method, model, world):
    import torch.distributed as dist
    from ringzero.models import Block
    from ringzero.parallel import DistributedDataParallel, ZeroDataParallel
    if method == "torch-ddp":
        m = torch.nn.parallel.DistributedDataParallel(model)
        return m, torch.optim.AdamW(m.parameters(), lr=1e-4)
    if method == "ringzero-ddp":
        m = DistributedDataParallel(model)
        return m, torch.optim.AdamW(m.parameters(), lr=1e-4)
    if method == "torch-zero-redundancy":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        m = torch.nn.parallel.DistributedDataParallel(model)
        return m, ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4)
    if method == "torch-fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4)
    stage = int(method[-1])
    m = ZeroDataParallel(model, stage=stage, unit=Block if stage == 3 else None)
    del dist
    return m, torch.optim.AdamW(m.parameters(), lr=1e-4)


def run(rank, world, method, steps, warmup, batch):
    import torch.distributed as dist
    from ringzero.models import GPT, GPTConfig, lm_loss
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD: big blocks are mmapped and unmapped on free
    from torch.distributed.fsdp import fully_shard  # noqa: F401  (imports before the baseline RSS)
    from torch.distributed.optim import ZeroRedundancyOptimizer  # noqa: F401

    import ringzero.parallel  # noqa: F401
    cfg = GPTConfig()
    g = torch.Generator().manual_seed(rank)
    data = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len + 1), generator=g)
    x, y = data[:, :-1], data[:, 1:]
    # One plain step on a throwaway model first, so that the code pages and thread pools every method
    # uses are resident before the baseline and do not count as the method's memory.
    scratch = GPT(cfg)
    lm_loss(scratch(x), y).backward()
    torch.optim.AdamW(scratch.parameters()).step()
    del scratch
    torch.manual_seed(0)
    base_kib = _rss_kib("VmRSS")
    _reset_peak()
    model = GPT(cfg)
    numel = sum(p.numel() for p in model.parameters())
    model, opt = build(method, model, world)
    times, cpu, accounted = [], [], None
    for k in range(warmup + steps):
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        loss = lm_loss(model(x), y)
        loss.backward()
        if k == warmup and hasattr(model, "memory_bytes"):
            accounted = model.memory_bytes(opt)  # after backward: gradients and optimizer state both live
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    peak_kib = _rss_kib("VmHWM")
    seg_rss, seg_pss = _shm_segment_kib()
    tensor_peak = _tensor_peak(method, world, cfg, x, y)
    slowest = torch.tensor(times[warmup:], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    cpu_s = torch.tensor(cpu[warmup:], dtype=torch.float64)
    dist.all_reduce(cpu_s, op=dist.ReduceOp.SUM)  # CPU seconds of all ranks (every thread) per step
    # The staging segment is shared by the ranks of the host but counted whole in each rank's RSS;
    # "peak by share" counts each rank's share of it only (as Pss does).
    return {"step_s": statistics.median(slowest.tolist()), "cpu_s": statistics.median(cpu_s.tolist()), "peak_mib": (peak_kib - base_kib) / 1024,
            "seg_mib": seg_rss / 1024, "shared_peak_mib": (peak_kib - base_kib - seg_rss + seg_pss) / 1024,
            "numel": numel, "accounted": accounted, "tensor_mib": tensor_peak / MIB}


def _tensor_peak(method, world, cfg, x, y) -> int:
    """Peak live tensor bytes of building, wrapping and two steps of a fresh model."""
    from ringzero.memory import TensorMemoryMeter
    from ringzero.models import GPT, lm_loss
    with TensorMemoryMeter() as meter:
        torch.manual_seed(0)
        model, opt = build(method, GPT(cfg), world)
        for _ in range(2):
            lm_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        del model, opt
    return meter.peak_bytes()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4, help="sequences of seq_len tokens per rank")
    ap.add_argument("--rounds", type=int, default=3, help="runs of every method; the fastest round is reported")
    ap.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    args = ap.parse_args()
    from ringzero.parallel import zero_memory_formula
    print(f"# torch {torch.__version__}, {os.cpu_count()} CPUs, batch {args.batch} x 128 tokens per rank, "
          f"{args.steps} timed steps after {args.warmup}, best of {args.rounds} rounds, "
          f"load average {os.getloadavg()[0]:.1f} at start")
    print(f"{'world':>5} {'method':<22} {'step ms':>9} {'vs torch-ddp':>12} {'vs fsdp2':>9} {'cpu ms':>8} "
          f"{'vs ddp':>7} {'vs fsdp2':>8} {'peak MiB':>9} "
          f"{'vs fsdp2':>9} {'shm seg':>7} {'by share':>8} {'vs fsdp2':>9} {'tensor MiB':>10} {'vs fsdp2':>9} "
          f"{'accounted MiB':>13} {'formula MiB':>11} "
          f"{'ratio':>6}")
    for world in args.worlds:
        rounds = {m: [] for m in args.methods}
        for _ in range(args.rounds):  # methods interleaved, so that load from other work hits all alike
            for method in args.methods:
                rounds[method].append(run_ranks(world, run, method, args.steps, args.warmup, args.batch,
                                                timeout_s=1200))
        res = {}
        for method, runs in rounds.items():
            # Fastest round's median step (other work on the machine only ever adds time); memory:
            # each rank's largest peak over the rounds.
            best = min(runs, key=lambda rs: rs[0]["step_s"])
            res[method] = [dict(best[r], **{k: max(run[r][k] for run in runs)
                                            for k in ("peak_mib", "seg_mib", "shared_peak_mib", "tensor_mib")})
                           for r in range(world)]
        for method in args.methods:
            rs = res[method]
            step = rs[0]["step_s"]
            peak = max(r["peak_mib"] for r in rs)
            ddp = res.get("torch-ddp", [{}])[0].get("step_s")
            cpu_of = {m: min(run[0]["cpu_s"] for run in rounds[m]) for m in rounds}  # lowest round, like wall
            ddp_cpu, cpu = cpu_of.get("torch-ddp"), cpu_of[method]
            fsdp = res.get("torch-fsdp2")
            fsdp_peak = max(r["peak_mib"] for r in fsdp) if fsdp else None
            acc = rs[0]["accounted"]
            seg = max(r["seg_mib"] for r in rs)
            shared = max(r["shared_peak_mib"] for r in rs)
            fsdp_shared = max(r["shared_peak_mib"] for r in fsdp) if fsdp else None
            tensor = max(r["tensor_mib"] for r in rs)
            fsdp_tensor = max(r["tensor_mib"] for r in fsdp) if fsdp else None
            line = (f"{world:>5} {method:<22} {step * 1e3:>9.1f} {step / ddp if ddp else float('nan'):>12.2f} "
                    f"{step / fsdp[0]['step_s'] if fsdp else float('nan'):>9.2f} {cpu * 1e3:>8.0f} "
                    f"{cpu / ddp_cpu if ddp_cpu else float('nan'):>7.2f} "
                    f"{cpu / cpu_of['torch-fsdp2'] if fsdp else float('nan'):>8.2f} {peak:>9.1f} "
                    f"{peak / fsdp_peak if fsdp_peak else float('nan'):>9.2f} {seg:>7.1f} {shared:>8.1f} "
                    f"{shared / fsdp_shared if fsdp_shared else float('nan'):>9.2f} {tensor:>10.1f} "
                    f"{tensor / fsdp_tensor if fsdp_tensor else float('nan'):>9.2f}")
            if acc is not None:
                stage = int(method[-1])
                formula = zero_memory_formula(stage, rs[0]["numel"], world, param_bytes=4, grad_bytes=4)
                total = acc["params"] + acc["grads"] + acc["master"] + acc["optimizer"]
                line += f" {total / MIB:>13.1f} {formula / MIB:>11.1f} {total / formula:>6.2f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
