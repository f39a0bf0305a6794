"""Pipeline schedules on CPU: our runtime against torch.distributed.pipelining with the same schedule,
model, split and microbatches, in the same run and process group; and each measured bubble against the
simulator's prediction (fed with the measured mean cost of each action kind and stage) and against the
closed form (p-1)/(m+p-1) of GPipe and 1F1B.

    python benchmarks/pipeline.py                                   # table: 2 and 4 stages, 8 and 16 microbatches
    python benchmarks/pipeline.py --trace ZBH1 --stages 4 --microbatches 8   # one real run: Chrome traces + PNG

The trace mode writes, under --out (default benchmarks/results/pipeline/), <name>_measured.json and
<name>_simulated.json (chrome://tracing or ui.perfetto.dev) and <name>.png (measured above simulated).
Step time is the slowest rank's, median over --steps steps after one warm-up step; ours and torch's
steps alternate, so that both see the same background load. The bubble columns are from our last step.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from ringzero.cli.launch import launch
from ringzero.models import GPT, GPTConfig, lm_loss
from ringzero.parallel.pipeline import (PipelineRunner, PipelineStage, bubble_fraction, chrome_trace, gather_timeline,
                                        measured_costs, plot_timelines, simulate, split)

SCHEDULES = ["GPipe", "1F1B", "Interleaved1F1B", "ZBH1"]
TORCH_SCHEDULES = {"GPipe": "ScheduleGPipe", "1F1B": "Schedule1F1B", "Interleaved1F1B": "ScheduleInterleaved1F1B",
                   "ZBH1": "ScheduleInterleavedZeroBubble"}
MULTI_STAGE = {"Interleaved1F1B", "ZBH1"}  # torch classes that take a list of stages


def model_and_parts(args, num_stages):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=256, seq_len=args.seq_len, n_layer=args.layers, n_head=4, d_model=args.width)
    return split(GPT(cfg).as_sequential(), num_stages, by="params")


def batch(args, m):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 256, (args.microbatch_size * m, args.seq_len + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def timed(step):
    """The slowest rank's time for one call of step()."""
    dist.barrier()
    t0 = time.perf_counter()
    step()
    elapsed = torch.tensor(time.perf_counter() - t0)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()


def transfer_time(args):
    """Half the median round trip of one activation-sized message between ranks 0 and 1 (gloo): the
    simulator's cost of one SEND, so that its prediction includes the transfers the runtime makes."""
    buf = torch.zeros(args.microbatch_size, args.seq_len, args.width)
    rank, times = dist.get_rank(), []
    for _ in range(11):
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        times.append((time.perf_counter() - t0) / 2)
    out = torch.tensor(statistics.median(times))
    dist.broadcast(out, 0)
    return out.item()


def ours(args, schedule, m):
    """This rank's runner and a step function for it."""
    p, rank = dist.get_world_size(), dist.get_rank()
    v = 2 if schedule == "Interleaved1F1B" else 1
    parts = model_and_parts(args, p * v)
    stages = [PipelineStage(parts[s], s, p * v) for s in range(rank, p * v, p)]
    runner = PipelineRunner(stages, schedule, m, loss_fn=lm_loss)
    x, y = batch(args, m)
    return runner, lambda: runner.step(x if rank == 0 else None, y if rank == p - 1 else None)


def theirs(args, schedule, m):
    """A step function running torch.distributed.pipelining's class for the same schedule."""
    from torch.distributed import pipelining

    p, rank = dist.get_world_size(), dist.get_rank()
    v = 2 if schedule == "Interleaved1F1B" else 1
    parts = model_and_parts(args, p * v)
    stages = [pipelining.PipelineStage(parts[s], s, p * v, torch.device("cpu")) for s in range(rank, p * v, p)]
    cls = getattr(pipelining, TORCH_SCHEDULES[schedule])
    sched = cls(stages if schedule in MULTI_STAGE else stages[0], m, loss_fn=lm_loss)
    x, y = batch(args, m)
    params = [q for st in stages for q in st.submod.parameters()]

    def step():
        for q in params:
            q.grad = None  # ours zeroes through the optimizer; without one both accumulate: reset here
        kwargs = dict(target=y, losses=[]) if rank == p - 1 else {}
        sched.step(x, **kwargs) if rank == 0 else sched.step(**kwargs)

    return step


def table_worker(args):
    p, rank = dist.get_world_size(), dist.get_rank()
    comm = transfer_time(args)
    if rank == 0:
        print(f"{p} stages: one activation transfer ({args.microbatch_size * args.seq_len * args.width * 4 / 2**10:.0f} "
              f"KiB) takes {comm * 1e3:.2f} ms (half a gloo round trip); the simulator charges it per SEND", flush=True)
    for m in args.microbatches:
        for schedule in SCHEDULES:
            runner, step = ours(args, schedule, m)
            try:
                their_step, note = theirs(args, schedule, m), ""
                timed(their_step)  # warm-up (torch agrees shapes on its first step)
            except Exception as e:  # a configuration torch does not support: say so in the table
                their_step, note = None, f"  torch: {type(e).__name__}: {str(e)[:70]}"
            timed(step)
            # Alternate ours and theirs so that both see the same background load on a shared machine.
            mine, their = [], []
            for _ in range(args.steps):
                mine.append(timed(step))
                timeline = gather_timeline(runner)
                if their_step is not None:
                    their.append(timed(their_step))
            if rank == 0:
                step_s, torch_s = statistics.median(mine), statistics.median(their) if their else None
                measured = bubble_fraction(timeline)
                predicted = simulate(runner.plan, measured_costs(timeline, comm)).bubble
                tcol = f"{torch_s * 1e3:9.1f} {step_s / torch_s:6.2f}" if torch_s else f"{'n/a':>9} {'':>6}"
                fcol = f"{(p - 1) / (m + p - 1) * 100:7.1f}" if schedule in ("GPipe", "1F1B") else f"{'-':>7}"
                print(f"{p:6d} {m:3d} {schedule:>16} {step_s * 1e3:9.1f} {tcol} {measured * 100:8.1f} "
                      f"{predicted * 100:8.1f} {(measured - predicted) * 100:+7.1f} {fcol}{note}", flush=True)


def trace_worker(args):
    schedule, m = args.trace, args.microbatches[0]
    comm = transfer_time(args)
    runner, step = ours(args, schedule, m)
    timed(step)  # warm-up
    step_s = timed(step)
    timeline = gather_timeline(runner)
    if dist.get_rank() == 0:
        sim = simulate(runner.plan, measured_costs(timeline, comm))
        name = f"{schedule}_p{dist.get_world_size()}_m{m}"
        os.makedirs(args.out, exist_ok=True)
        chrome_trace(timeline, os.path.join(args.out, f"{name}_measured.json"), 1e6, f"{name} measured")
        chrome_trace(sim.timeline, os.path.join(args.out, f"{name}_simulated.json"), 1e6, f"{name} simulated")
        measured = bubble_fraction(timeline)
        plot_timelines([(f"{name} measured: step {step_s * 1e3:.1f} ms, bubble {measured:.1%}", timeline, "seconds"),
                        (f"{name} simulated with the measured costs: bubble {sim.bubble:.1%}", sim.timeline,
                         "seconds")], os.path.join(args.out, f"{name}.png"))
        print(f"{name}: step {step_s * 1e3:.1f} ms, measured bubble {measured:.1%}, simulated {sim.bubble:.1%}; "
              f"wrote {args.out}/{name}.png, {name}_measured.json, {name}_simulated.json")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 4], help="pipeline ranks (one process each)")
    ap.add_argument("--microbatches", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--microbatch-size", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--width", type=int, default=256, help="d_model of the GPT")
    ap.add_argument("--layers", type=int, default=8, help="transformer blocks (>= 2 * stages - 2 for interleaved)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per configuration, after one warm-up")
    ap.add_argument("--trace", choices=SCHEDULES, help="write the traces and PNG of one real run of this schedule")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "pipeline"))
    args = ap.parse_args(argv)
    if args.trace:
        for p in args.stages:
            launch(trace_worker, p, args)
        return 0
    print(f"GPT d_model={args.width} layers={args.layers} seq={args.seq_len}, microbatch {args.microbatch_size} "
          f"sequences, float32, 1 thread per rank; step = slowest rank, median of {args.steps}")
    print(f"{'stages':>6} {'m':>3} {'schedule':>16} {'ours ms':>9} {'torch ms':>9} {'ratio':>6} "
          f"{'bubble%':>8} {'sim%':>8} {'diff pp':>7} {'formula':>7}")
    for p in args.stages:
        launch(table_worker, p, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
