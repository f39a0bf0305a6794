"""Fused Adam benchmark: ringzero against torch.optim.AdamW (foreach and fused) in the same run.

(a)  plain float32 AdamW step: ringzero.optim.FusedAdamW vs torch.optim.AdamW(foreach=True) and
     (fused=True), and on the CPU DeepSpeedCPUAdam when deepspeed is installed; params as a list of
     1M-element tensors. Bytes per parameter: 28 (grad 4, param 4+4, exp_avg 4+4, exp_avg_sq 4+4).
(a4) the same with the parameters as 4 large tensors.
(b)  mixed-precision step on flat buffers: 16-bit grads, clip to a global norm, AdamW on float32
     masters, 16-bit parameter copy, in the two forms torch supports: "fp16": float16 grads with loss
     scaling (unscale and inf check, skip on inf; GradScaler's path); "bf16": bfloat16 grads, no loss
     scaling. ringzero: ops.sum_squares (one read, also sets found_inf) + ops.adam_step_ (one pass, writes
     the 16-bit params): 30 B/param. torch: the usual sequence of separate passes (the non-finite check
     and unscale for fp16, clip_grad_norm_, cast of the grads to float32, fused AdamW on the masters,
     copy to the 16-bit params).

The floor is the fused step's bytes moved (28 B/param for a, 30 for b) over the memory bandwidth
measured in the same run over the same working set (the best run of a copy_, an in-place add_ and an
in-place addcmul_ over 28 B/param, every byte read or written counted, taking turns with the case's rows
in every rep, the best run taken; at 1M params the probe's data stays in cache, and the floor says so,
while the rows taking turns evict each other's data): no implementation of the step can be faster. Prints the floor in ms, time (median), GB/s
counted with each row's own bytes per parameter, the fraction of the floor reached (floor / time), and the
speed ratios baseline_time / our_time against torch fused (or the torch sequence) and the other baselines:
the median over reps of the ratio of the two runs of one rep.

    python benchmarks/optim.py [--sizes 1M,16M,128M] [--device cpu|cuda] [--threads N] [--cases a,b bf16] [--out FILE]

--out also writes the table to FILE (gpu_check.sh keeps it under benchmarks/results/).
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


def timed_round_robin(fns, device, reps, setups=None, stat=statistics.median, runs=False):
    """Median (or `stat`) seconds of each fn over reps runs, after two warm-up runs. The fns take turns within each
    rep, so load from other work on a shared machine falls on all of them alike. setups[i]() runs
    untimed before each run of fns[i]. runs=True returns every run's seconds instead (lists of reps)."""
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
    return times if runs else [stat(t) for t in times]


class BandwidthProbe:
    """Streaming ops over the working set of a step of `n_params` float32 parameters (so that a step whose
    data stays in a cache is held to the cache's speed, not to DRAM's): a copy (read + write counted), an
    in-place add (two reads, one write) and an in-place addcmul (three reads, one write), and on the CPU
    ringzero._C.adam_traffic_ (p, m, v += g: the step's own seven streams and 28 B/param without its
    maths). Its fns take turns with the rows being measured, so the floor is measured at the same
    moments as the rows (this VM's memory bandwidth drifts by a third within minutes, with its
    neighbours' load: a floor measured once, before the rows, was beaten by up to 7% in some runs);
    bandwidth() is the best any run of any of the ops reached."""

    def __init__(self, device, n_params):
        n3 = max(1 << 16, 28 * n_params // 12)  # three float32 tensors: the step's working set
        a, b, c = torch.ones(n3, device=device), torch.empty(n3, device=device), torch.ones(n3, device=device)
        self.fns = [lambda: b.copy_(a), lambda: b.add_(a), lambda: b.addcmul_(a, c)]
        self.bytes = [8 * n3, 12 * n3, 16 * n3]
        if device.type == "cpu":
            n4 = max(1 << 16, n_params)
            p, g, m, v = (ops.flat_buffer(n4, torch.float32, device, k) for k in range(4))  # no 4K aliasing
            self.fns.append(lambda: ringzero._C.adam_traffic_(p, g, m, v))
            self.bytes.append(28 * n4)

    def bandwidth(self, times):
        """Bytes per second of the fastest run, from timed_round_robin(..., runs=True)'s lists for self.fns."""
        return max(nbytes / min(t) for nbytes, t in zip(self.bytes, times))


def memory_bandwidth(device, reps, n_params):
    """The probe's bandwidth measured on its own (the headline figure)."""
    probe = BandwidthProbe(device, n_params)
    return probe.bandwidth(timed_round_robin(probe.fns, device, reps, runs=True))


def split(n, device, dtype, fill):
    sizes = [TENSOR_ELEMS] * (n // TENSOR_ELEMS) + ([n % TENSOR_ELEMS] if n % TENSOR_ELEMS else [])
    return [fill(s, dtype, device) for s in sizes]


def rand(n, dtype, device):
    return (torch.rand(n, device=device) - 0.5).to(dtype)


def deepspeed_cpu_adam():
    """deepspeed's DeepSpeedCPUAdam class, or None when deepspeed (or its op build) is not available."""
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    except Exception:  # noqa: BLE001 - any import or build failure means: no such row
        return None
    return DeepSpeedCPUAdam


def case_a(n, device, reps, probe, tensors=None):
    """Rows: (name, seconds of each rep) for plain float32 AdamW, params as 1M-element tensors or `tensors`
    equal ones; and the probe's bandwidth measured between them."""
    names = ["torch foreach", "torch fused", "ringzero"]
    ds_adam = deepspeed_cpu_adam() if device.type == "cpu" else None
    if ds_adam is not None:
        names.insert(2, "deepspeed cpu")
    opts = []
    for name in names:
        if tensors:
            params = [rand(n // tensors + (k < n % tensors), torch.float32, device) for k in range(tensors)]
        else:
            params = split(n, device, torch.float32, rand)
        params = [p.requires_grad_() for p in params]
        for p in params:
            p.grad = rand(p.numel(), torch.float32, device)
        if name == "ringzero":
            opts.append(FusedAdamW(params, **HYPER))
        elif name == "deepspeed cpu":
            opts.append(ds_adam(params, adamw_mode=True, **HYPER))
        else:
            opts.append(torch.optim.AdamW(params, foreach=name == "torch foreach", fused=name == "torch fused",
                                          **HYPER))
    times = timed_round_robin([o.step for o in opts] + probe.fns, device, reps, runs=True)
    return list(zip(names, times)), probe.bandwidth(times[len(opts):])


def case_b(n, device, reps, dtype, probe):
    """Rows for the mixed-precision step (flat buffers, as ZeRO holds its shard): float16 grads with loss
    scaling, or bfloat16 grads without; and the probe's bandwidth measured between them."""
    scaled = dtype == torch.float16
    # Our buffers as ZeRO would hold them: ops.flat_buffer skews each so they do not alias modulo 4 KiB.
    master = ops.flat_buffer(n, torch.float32, device, 0).copy_(rand(n, torch.float32, device))
    param16 = ops.flat_buffer(n, dtype, device, 1).copy_(master)
    grad16 = ops.flat_buffer(n, dtype, device, 2).copy_(rand(n, dtype, device) * (1024 if scaled else 1))
    m, v = ops.flat_buffer(n, torch.float32, device, 3), ops.flat_buffer(n, torch.float32, device, 4)
    inv_scale = torch.full((1,), 1.0 / 1024, device=device) if scaled else None
    step = [0]

    def ours():
        found = torch.zeros(1, device=device) if scaled else None
        sumsq = ops.sum_squares([grad16], inv_scale=inv_scale, found_inf=found)
        step[0] += 1
        ops.adam_step_(master, grad16, m, v, lr=HYPER["lr"], beta1=0.9, beta2=0.999, eps=1e-8,
                       weight_decay=HYPER["weight_decay"], step=step[0], inv_scale=inv_scale,
                       clip_coef=ops.clip_coef(sumsq, MAX_NORM), found_inf=found, param_out=param16)

    # torch: separate passes; the unscale and clip rewrite the 16-bit grads in place, so they are
    # restored from grad16 before each run, untimed.
    tmaster = master.clone().requires_grad_()
    tmaster.grad = torch.empty_like(master)
    opt = torch.optim.AdamW([tmaster], fused=True, **HYPER)
    work16 = grad16.clone()

    def theirs():
        if scaled:  # GradScaler's unscale_ and inf check (float16: the dtype its CUDA kernel takes)
            found = torch.zeros(1, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_([work16], found, inv_scale)  # read + write 2
        torch.nn.utils.clip_grad_norm_([work16], MAX_NORM, foreach=True)  # norm read, scale read + write
        tmaster.grad.copy_(work16)  # cast to float32: read 2, write 4
        if not scaled or not found.item():  # GradScaler skips on inf (a host sync)
            opt.step()  # 28 B
        param16.copy_(tmaster.detach())  # read 4, write 2

    times = timed_round_robin([theirs, ours] + probe.fns, device, reps,
                              setups=[lambda: work16.copy_(grad16)] + [None] * (1 + len(probe.fns)), runs=True)
    return [("torch sequence", times[0]), ("ringzero", times[1])], probe.bandwidth(times[2:])


def bytes_per_param(case, name):
    """Bytes each row moves per parameter (its own passes counted)."""
    if case.startswith("a"):
        return 28
    if not name.startswith("torch"):
        return 30  # sum of squares 2, adam 28 with a 16-bit grad and param copy (2 + 8 + 16 + 2)
    # torch: [unscale 2+2], norm 2, clip 2+2, cast 2+4, adam 28 (float32 grad), copy 4+2
    return 50 if case == "b fp16" else 46


def floor_bytes(case):
    """What the fused step must move per parameter: every operand read once, written once."""
    return 28 if case.startswith("a") else 30


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
    ap.add_argument("--cases", default="a,a4,b fp16,b bf16", help="comma-separated subset of the cases")
    ap.add_argument("--out", default="", help="also write the table to this file")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: CUDA is not available here")
    bw_large = memory_bandwidth(device, 10, (1 << 30) // 28)  # a 1 GiB working set: no cache holds it
    where = torch.cuda.get_device_name() if device.type == "cuda" else \
        f"CPU, {torch.get_num_threads()} threads, ISA {ringzero._C.adam_isa()}"
    lines = []

    def emit(line):
        print(line, flush=True)
        lines.append(line)

    traffic = ", adam_traffic_" if device.type == "cpu" else ""
    emit(f"# device: {where}; memory bandwidth {bw_large / 1e9:.1f} GB/s (best run of copy_, add_, addcmul_{traffic} over 1 GiB; each size's floor: the same ops over its own working set, taking turns with its rows); torch {torch.__version__}; "
          f"load average {os.getloadavg()[0]:.1f}")
    if device.type == "cpu" and deepspeed_cpu_adam() is None:
        emit("# deepspeed is not installed here: no DeepSpeedCPUAdam rows")
    emit(f"{'case':7} {'params':>6} {'impl':15} {'B/param':>7} {'floor ms':>8} {'time ms':>8} {'GB/s':>6} "
         f"{'floor':>5} {'vs fused/seq':>12} {'vs foreach':>10} {'vs deepspeed':>12}")
    for s in args.sizes.split(","):
        n = parse_size(s)
        reps = args.reps or (60 if n <= (4 << 20) else 12 if n <= (32 << 20) else 5)
        probe = BandwidthProbe(device, n)
        cases = (("a", lambda: case_a(n, device, reps, probe)), ("a4", lambda: case_a(n, device, reps, probe, tensors=4)),
                 ("b fp16", lambda: case_b(n, device, reps, torch.float16, probe)),
                 ("b bf16", lambda: case_b(n, device, reps, torch.bfloat16, probe)))
        results = [(case, *run()) for case, run in cases if case in args.cases.split(",")]
        del probe
        for case, rows, bw in results:
            runs = dict(rows)
            times = {name: statistics.median(r) for name, r in runs.items()}
            base = "torch fused" if "torch fused" in runs else "torch sequence"
            floor = floor_bytes(case) * n / bw  # the fused step's bytes at the measured bandwidth

            def ratio(other, runs=runs):
                # Median over reps of the paired ratio (the two ran back to back in each rep), which
                # drifting load on a shared machine disturbs less than a ratio of two medians.
                if other not in runs:
                    return ""
                return f"{statistics.median(a / b for a, b in zip(runs[other], runs['ringzero'])):.2f}x"

            for name, t in times.items():
                bpp = bytes_per_param(case, name)
                ours = name == "ringzero"
                emit(f"{case:7} {s:>6} {name:15} {bpp:7d} {floor * 1e3:8.2f} {t * 1e3:8.2f} {bpp * n / t / 1e9:6.1f} "
                     f"{floor / t:5.2f} {ratio(base) if ours else '':>12} {ratio('torch foreach') if ours else '':>10} "
                     f"{ratio('deepspeed cpu') if ours else '':>12}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
