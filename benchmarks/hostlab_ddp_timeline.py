"""Where a stock DDP step's time goes on the swap-in across the lab's hosts (issue 43's DDP bar): a timeline of
every rank, from timestamps taken around the backend engine's calls and each step of its pipelined all-reduce
(wrapped in this process only; the code that runs is the shipped one), on the clock the lab's hosts share.

The model, data and step are hostlab_backend.py's (stock DistributedDataParallel, default buckets, AdamW).
Per step, on the lab's one clock (the last rank's step start is 0):
  ready        the last rank's first bucket handed to the backend (its all-reduce can start no earlier)
  first rs     start and end of the first segment's in-host reduce-scatter, the last rank's (the link waits
               for it: it needs both local ranks and ends with one synchronisation per staging slot)
  link start   the last rank's first segment posted across hosts (the link starts carrying gradients)
  link span    link start to the last segment's arrival, against the link bound of all buckets' bytes
  gaps         the link's idle time between consecutive buckets: the last rank's first segment of bucket k+1
               posted after the last arrival of bucket k
  last ag      the last arrival to the end of the last rank's last in-host all-gather
  after link   the last arrival to the last rank's backward() returning (last in-host all-gather, DDP's copy
               of the buckets into the gradients, wake-ups)
  optimizer    the last backward() to the last optimizer step's end
and the two measures of a step: the slowest rank's own (its start to its end, hostlab_backend.py's) and the
group's (the last start to the last end), each against the same on a gloo group of the same processes.

Run as root: nice -n 19 python benchmarks/hostlab_ddp_timeline.py [--steps 20] [--rate-gbit 1].
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
WARMUP_STEPS = 2


def rank_main(out: str, steps: int):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hostlab_backend import BATCH, WIDTH, mlp
    from ringzero.comm import backend, transports

    events = []  # (time s, name) of this rank, in order

    def mark(name):
        events.append((time.perf_counter(), name))

    pipelined = transports.all_reduce_pipelined

    calls = [0]  # pipelined all-reduces begun in this step: a deferred tail's arrival comes in the next call

    def traced_pipelined(x, local_world, segment_numel, reduce_scatter, cross_start, cross_finish, all_gather,
                         **kwargs):
        k = calls[0]
        calls[0] += 1

        def start(part):
            mark(("posted", k))
            return cross_start(part)

        def finish(handle):
            got = cross_finish(handle)
            mark(("arrived", k))
            return got

        def rs(seg, part):
            mark(("rs>", k))
            reduce_scatter(seg, part)
            mark(("rs<", k))

        def ag(part, seg):
            all_gather(part, seg)
            mark(("ag<", k))
        return pipelined(x, local_world, segment_numel, rs, start, finish, ag, **kwargs)

    transports.all_reduce_pipelined = traced_pipelined
    engine_call = backend.HostsEngine.__call__

    def traced_call(self, op, tensors, args, call=None):
        mark(f"{op}>")
        engine_call(self, op, tensors, args, call)
    backend.HostsEngine.__call__ = traced_call

    dist.init_process_group("ringzero")
    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    runs = {}
    for name, group in (("ringzero", dist.group.WORLD), ("gloo", gloo)):
        model = DDP(mlp(), process_group=group)
        optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
        steps_marks = []
        for step in range(steps):
            x = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(1000 * step + rank))
            dist.barrier(group=group)
            events.clear()
            calls[0] = 0
            mark("start")
            optim.zero_grad(set_to_none=True)
            model(x).pow(2).mean().backward()
            mark("backward")
            optim.step()
            mark("end")
            steps_marks.append(list(events))
        runs[name] = steps_marks
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(runs, f)
    if rank == 0:
        with open(os.path.join(out, "bench.json"), "w") as f:
            json.dump({"world": dist.get_world_size()}, f)
    dist.destroy_process_group()


def step_phases(ranks: list[list], bound_ms: float) -> dict:
    """One step's phases (module docstring) from every rank's marks of that step, in ms."""
    def last(name, nth=0):
        return max([t for t, n in marks if n == name][nth] for marks in ranks)

    t0 = last("start")
    phases = {"own step": max((m[-1][0] - m[0][0]) for m in ranks) * 1e3,
              "group step": (last("end") - t0) * 1e3, "start skew": (t0 - min(m[0][0] for m in ranks)) * 1e3}
    calls = [[i for i, (_, n) in enumerate(m) if n == "all_reduce>"] for m in ranks]
    if calls[0]:  # the ringzero run: its engine's calls are marked
        buckets = []  # per bucket (pipelined all-reduce k of the step): (last first post, last last arrival)
        for k in range(len(calls[0])):
            firsts = [next(t for t, n in m if n == ["posted", k]) for m in ranks]
            lasts = [[t for t, n in m if n == ["arrived", k]][-1] for m in ranks]
            buckets.append((max(firsts), max(lasts)))
        first_rs = [[(t, n[0]) for t, n in m if n in (["rs>", 0], ["rs<", 0])][:2] for m in ranks]
        last_ag = max([t for t, n in m if n == ["ag<", len(buckets) - 1]][-1] for m in ranks)
        phases.update({
            "ready": (max(m[i[0]][0] for m, i in zip(ranks, calls)) - t0) * 1e3,
            "first rs start": (max(r[0][0] for r in first_rs) - t0) * 1e3,
            "first rs end": (max(r[1][0] for r in first_rs) - t0) * 1e3,
            "link start": (buckets[0][0] - t0) * 1e3,
            "link span": (buckets[-1][1] - buckets[0][0]) * 1e3, "link bound": bound_ms,
            "gaps": sum(max(0.0, b[0] - a[1]) for a, b in zip(buckets, buckets[1:])) * 1e3,
            "last ag": (last_ag - buckets[-1][1]) * 1e3,
            "after link": (last("backward") - buckets[-1][1]) * 1e3,
            "optimizer": (last("end") - last("backward")) * 1e3, "buckets": len(buckets)})
    return phases


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rate-gbit", type=float, default=1)
    p.add_argument("--rank", metavar="OUT", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank:
        return rank_main(args.rank, args.steps)
    import hostlab
    from hostlab_backend import LAYERS, WIDTH
    from hostlab_bench import link_bound_ms, run_in_lab

    grad_bytes = LAYERS * (WIDTH * WIDTH + WIDTH) * 4
    bound = link_bound_ms("all_reduce", grad_bytes, 2, args.rate_gbit)
    with hostlab.HostLab(2, rate_gbit=args.rate_gbit) as lab, tempfile.TemporaryDirectory() as out:
        run_in_lab(lab, [2, 2], [os.path.abspath(__file__), "--rank", out, "--steps", str(args.steps)], out, 1500)
        ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(4)]
    print(f"# hostlab_ddp_timeline | 2 hosts x 2 ranks | {args.rate_gbit:g} Gbit/s | stock DDP, "
          f"{grad_bytes / 1e6:.1f} MB of gradients | median of steps {WARMUP_STEPS + 1}-{args.steps} | "
          f"{time.strftime('%Y-%m-%d')} | load average {os.getloadavg()[0]:.2f}")
    medians = {}
    for name in ("ringzero", "gloo"):
        per_step = [step_phases([r[name][k] for r in ranks], bound) for k in range(WARMUP_STEPS, args.steps)]
        medians[name] = {key: statistics.median(s[key] for s in per_step) for key in per_step[0]}
        print(f"\n{name}: " + " | ".join(f"{key} {v:.1f}" for key, v in medians[name].items()))
    for measure in ("own step", "group step"):
        rz, gl = medians["ringzero"][measure], medians["gloo"][measure]
        print(f"{measure}: ringzero {rz:.1f} ms, gloo {gl:.1f} ms, gloo / ringzero {gl / rz:.2f}x")


if __name__ == "__main__":
    main()
