"""Fused Adam benchmark: ringzero against torch.optim.AdamW (foreach and fused) in the same run.

(a) plain float32 AdamW step: ringzero.optim.FusedAdamW vs torch.optim.AdamW(foreach=True) and
    (fused=True), params as a list of 1M-element tensors. Bytes per parameter: 28 (grad 4, param 4+4,
    exp_avg 4+4, exp_avg_sq 4+4).
(b) mixed-precision step on flat buffers: bfloat16 grads, unscale by the loss scale, inf check, clip to a
    global norm, AdamW on float32 masters, bfloat16 parameter copy. ringzero: ops.sum_squares (one read,
    also sets found_inf) + ops.adam_step_ (one pass, writes the bfloat16 params): 30 B/param. torch: the
    usual sequence of separate passes (GradScaler's non-finite check and unscale, clip_grad_norm_,
    cast of the grads to float32, fused AdamW on the masters, copy to the bfloat16 params).

The floor is bytes moved / the memory bandwidth measured in the same run (the faster of a large copy_
and an in-place add_, every byte read or written counted). Prints time (median), GB/s counted with our bytes per parameter, the fraction
of the floor, and the speed ratio baseline_time / our_time.

    python benchmarks/optim.py [--sizes 1M,16M,128M] [--device cpu|cuda] [--threads N]

With --device cuda the table is also written to benchmarks/results/optim_<gpu name>.txt.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

import ringzero
from ringzero import ops
from ringzero.optim import FusedAdamW

TENSOR_ELEMS = 1 << 20
HYPER = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
MAX_NORM = 1.0


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed_round_robin(fns, device, reps, setups=None):
    """Median seconds of each fn over reps runs, after two warm-up runs. The fns take turns within each
    rep, so load from other work on a shared machine falls on all of them alike. setups[i]() runs
    untimed before each run of fns[i]."""
    setups = setups or [None] * len(fns)
    times = [[] for _ in fns]
    for rep in range(reps + 2):
        for i, fn in enumerate(fns):
            if setups[i]:
                setups[i]()
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            if rep >= 2:
                times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def memory_bandwidth(device, reps):
    """Bytes per second of the faster of two large streaming ops, the reference for the floor: a copy
    (read + write counted) and an in-place add (two reads, one write), which is closer to Adam's
    read-modify-write pattern."""
    n = 64 << 20
    a, b = torch.ones(n, device=device), torch.empty(n, device=device)
    t_copy, t_add = timed_round_robin([lambda: b.copy_(a), lambda: b.add_(a)], device, reps)
    return max(8 * n / t_copy, 12 * n / t_add)


def split(n, device, dtype, fill):
    sizes = [TENSOR_ELEMS] * (n // TENSOR_ELEMS) + ([n % TENSOR_ELEMS] if n % TENSOR_ELEMS else [])
    return [fill(s, dtype, device) for s in sizes]


def rand(n, dtype, device):
    return (torch.rand(n, device=device) - 0.5).to(dtype)


def case_a(n, device, reps):
    """Rows: (name, seconds) for plain float32 AdamW."""
    names = ("torch foreach", "torch fused", "ringzero")
    opts = []
    for name in names:
        params = [p.requires_grad_() for p in split(n, device, torch.float32, rand)]
        for p in params:
            p.grad = rand(p.numel(), torch.float32, device)
        if name == "ringzero":
            opts.append(FusedAdamW(params, **HYPER))
        else:
            opts.append(torch.optim.AdamW(params, foreach=name == "torch foreach", fused=name == "torch fused",
                                          **HYPER))
    return list(zip(names, timed_round_robin([o.step for o in opts], device, reps)))


def case_b(n, device, reps):
    """Rows for the mixed-precision step (flat buffers, as ZeRO holds its shard)."""
    # Our buffers as ZeRO would hold them: ops.flat_buffer skews each so they do not alias modulo 4 KiB.
    master = ops.flat_buffer(n, torch.float32, device, 0).copy_(rand(n, torch.float32, device))
    param16 = ops.flat_buffer(n, torch.bfloat16, device, 1).copy_(master)
    grad16 = ops.flat_buffer(n, torch.bfloat16, device, 2).copy_(rand(n, torch.bfloat16, device) * 1024)
    m, v = ops.flat_buffer(n, torch.float32, device, 3), ops.flat_buffer(n, torch.float32, device, 4)
    inv_scale = torch.full((1,), 1.0 / 1024, device=device)
    step = [0]

    def ours():
        found = torch.zeros(1, device=device)
        sumsq = ops.sum_squares([grad16], inv_scale=inv_scale, found_inf=found)
        step[0] += 1
        ops.adam_step_(master, grad16, m, v, lr=HYPER["lr"], beta1=0.9, beta2=0.999, eps=1e-8,
                       weight_decay=HYPER["weight_decay"], step=step[0], inv_scale=inv_scale,
                       clip_coef=ops.clip_coef(sumsq, MAX_NORM), found_inf=found, param_out=param16)


    # torch: separate passes; the unscale and clip rewrite the bfloat16 grads in place, so they are
    # restored from grad16 before each run, untimed.
    tmaster = master.clone().requires_grad_()
    tmaster.grad = torch.empty_like(master)
    opt = torch.optim.AdamW([tmaster], fused=True, **HYPER)
    work16 = grad16.clone()

    def theirs():
        found = torch.zeros(1, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_([work16], found, inv_scale)  # read + write bf16
        torch.nn.utils.clip_grad_norm_([work16], MAX_NORM, foreach=True)  # norm read, scale read + write
        tmaster.grad.copy_(work16)  # cast to float32: read 2, write 4
        if not found.item():  # GradScaler skips on inf (a host sync)
            opt.step()  # 28 B
        param16.copy_(tmaster.detach())  # read 4, write 2

    t_theirs, t_ours = timed_round_robin([theirs, ours], device, reps, setups=[lambda: work16.copy_(grad16), None])
    return [("torch sequence", t_theirs), ("ringzero", t_ours)]


def bytes_per_param(case, name):
    if case == "a":
        return 28
    # torch: unscale 2+2, norm 2, clip 2+2, cast 2+4, adam 28 (float32 grad), copy 4+2 = 50
    return 50 if name.startswith("torch") else 30


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1], 1)
    return int(float(s[:-1] if s[-1] in "KMG" else s) * mult)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1M,16M,128M")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=0, help="timed runs per row (default: by size)")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: CUDA is not available here")
    bw = memory_bandwidth(device, 10)
    where = torch.cuda.get_device_name() if device.type == "cuda" else \
        f"CPU, {torch.get_num_threads()} threads, ISA {ringzero._C.adam_isa()}"
    lines = []

    def emit(line):
        print(line, flush=True)
        lines.append(line)

    emit(f"# device: {where}; memory bandwidth {bw / 1e9:.1f} GB/s (best of copy_, add_); torch {torch.__version__}; "
          f"load average {os.getloadavg()[0]:.1f}")
    emit(f"{'case':5} {'params':>8} {'impl':16} {'B/param':>7} {'time ms':>9} {'GB/s':>7} {'floor':>6} "
          f"{'vs torch fused/seq':>18} {'vs foreach':>10}")
    for s in args.sizes.split(","):
        n = parse_size(s)
        reps = args.reps or (20 if n <= (4 << 20) else 8 if n <= (32 << 20) else 4)
        for case, rows in (("a", case_a(n, device, reps)), ("b", case_b(n, device, reps))):
            times = dict(rows)
            base = times.get("torch fused", times.get("torch sequence"))
            for name, t in rows:
                bpp = bytes_per_param(case, name)
                gbs = bpp * n / t / 1e9
                floor = 28 * n / bw if case == "a" else 30 * n / bw  # the fused step's bytes at the measured bandwidth
                ratio = f"{base / t:.2f}x" if name == "ringzero" else ""
                fe = f"{times['torch foreach'] / t:.2f}x" if name == "ringzero" and "torch foreach" in times else ""
                emit(f"{case:5} {s:>8} {name:16} {bpp:7d} {t * 1e3:9.2f} {gbs:7.1f} {floor / t:6.2f} "
                     f"{ratio:>18} {fe:>10}")
    if device.type == "cuda":  # GPU tables are kept as files (benchmarks/results/), CPU ones in RESULTS.md
        out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
        os.makedirs(out_dir, exist_ok=True)
        name = "optim_" + torch.cuda.get_device_name().replace(" ", "_") + ".txt"
        with open(os.path.join(out_dir, name), "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
