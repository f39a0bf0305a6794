"""`ringzero bench --device cuda`: ringzero's CUDA collectives beside NCCL, in nccl-tests' columns.

    ringzero bench --device cuda --nproc 8              # one process per GPU (or under torchrun)
    ringzero bench --device cuda --sim-ranks 4          # 4 simulated ranks on this one GPU, one process

Rows: every size from --min-bytes to --max-bytes, for each implementation: ringzero's automatic choice
("auto") and each forced all-reduce algorithm (oneshot, twoshot, ring; reduce-scatter and all-gather have
the ring alone), and NCCL through torch.distributed on the same tensors in the same run ("nccl"). Columns
as nccl-tests prints them: size (bytes of the whole buffer: the all-reduce tensor, the reduce-scatter
input, the all-gather output), count (its elements), type, redop (sum), time (us per call, the slowest
rank), algbw = size / time, busbw = algbw x 2(n-1)/n (all-reduce) or x (n-1)/n (the others), and #wrong:
after the timed calls every row runs once more on fresh inputs of small integers (exact in every dtype)
and counts the elements that differ from torch's own sum of every rank's inputs in int64, over all
ranks. `vs nccl` is NCCL's time over ours. A row with #wrong above 0 makes the command exit 1.

No NCCL row where NCCL cannot run: ranks sharing a GPU (more processes than GPUs; NCCL refuses two ranks
on one GPU) and --sim-ranks. Ranks sharing a GPU time-share it, so their times measure the time slices
(the header says so); only --sim-ranks and a GPU per rank time the algorithms. Timing: the calls are issued back to back and the GPU is synchronised once
after them (launch costs included, as a training step pays them); the iteration count fills --budget-s.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..timing import time_calls

OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
ALGOS = ("auto", "oneshot", "twoshot", "ring")  # the names of _C.ALL_REDUCE_ALGOS
CUDA_DTYPES = ("float32", "bfloat16", "float16", "int32", "int64")
MAX_SIM_RANKS = 8  # kMaxRanks of csrc/cuda/peer_types.h
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
              "all_gather": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n}


def argument_errors(args, has_cuda_build: bool, device_count: int, under_torchrun: bool) -> list[str]:
    """What is wrong with a `--device cuda` command line on this machine, each naming the argument and
    the fix; empty when it can run. Pure: the CPU tests call it with made-up machines."""
    errors = []
    if not has_cuda_build:
        errors.append("--device cuda: this build of ringzero has no CUDA path (built against a CPU torch or "
                      "without nvcc); reinstall with a CUDA torch and nvcc (docs/install.md)")
    elif device_count < 1:
        errors.append("--device cuda: no CUDA device is visible to this process (check CUDA_VISIBLE_DEVICES "
                      "and the driver)")
    if args.dtype not in CUDA_DTYPES:
        errors.append(f"--dtype {args.dtype}: ringzero's CUDA kernels reduce {', '.join(CUDA_DTYPES)}; pick one")
    bad = [a for a in args.algos if a not in ALGOS]
    if bad:
        errors.append(f"--algos {','.join(bad)}: choose from {', '.join(ALGOS)}")
    if args.no_gloo:
        errors.append("--no-gloo is for --device cpu; on CUDA the baseline is NCCL (--no-nccl leaves it out)")
    if args.sim_ranks is not None:
        if not 2 <= args.sim_ranks <= MAX_SIM_RANKS:
            errors.append(f"--sim-ranks {args.sim_ranks}: simulate 2 to {MAX_SIM_RANKS} ranks")
        if under_torchrun:
            errors.append("--sim-ranks runs every rank in this one process: start it without torchrun")
    return errors


def impls(op: str, algos, nccl: bool) -> list[str]:
    """The rows of one size, in print order: ringzero's (forced algorithms only for all-reduce), then NCCL."""
    ours = list(algos) if op == "all_reduce" else ["auto"]
    return ours + (["nccl"] if nccl else [])


def sizes_of(args) -> list[int]:
    out, s = [], args.min_bytes
    while s <= args.max_bytes:
        out.append(s)
        s *= args.factor
    return out


def shape(op: str, size: int, element_size: int, world: int) -> tuple[int, int, int]:
    """(count of the whole buffer, input elements, output elements) of one rank for a row of `size`
    bytes: nccl-tests' convention (all-reduce: the tensor; reduce-scatter: the input; all-gather: the
    output; all-to-all: each of input and output, even blocks), rounded down to whole elements and, for
    the ops that split it, to a multiple of world."""
    count = max(1, size // element_size)
    if op == "all_reduce":
        return count, count, count
    per = max(1, count // world)
    if op == "all_to_all":
        return per * world, per * world, per * world
    return per * world, (per * world if op == "reduce_scatter" else per), (per if op == "reduce_scatter" else per * world)


def pattern(rank: int, n: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Small nonzero integers in [-3, 3], different per rank and position: every sum over up to 8 ranks
    is exact in every dtype of CUDA_DTYPES."""
    i = torch.arange(n, dtype=torch.int64, device=device)
    v = (i * 5 + rank * 3) % 7 - 3
    return torch.where(v == 0, torch.ones_like(v), v).to(dtype)


def expected(op: str, rank: int, world: int, n_in: int, dtype: torch.dtype, device) -> torch.Tensor:
    """What `rank` must hold after the collective on pattern() inputs of n_in elements per rank."""
    if op == "all_gather":
        return torch.cat([pattern(r, n_in, dtype, device) for r in range(world)])
    if op == "all_to_all":  # block `rank` of every rank's input, in rank order
        per = n_in // world
        return torch.cat([pattern(r, n_in, dtype, device)[rank * per:(rank + 1) * per] for r in range(world)])
    total = sum(pattern(r, n_in, torch.int64, device) for r in range(world)).to(dtype)
    if op == "reduce_scatter":
        per = n_in // world
        return total[rank * per:(rank + 1) * per]
    return total


def row_line(size: int, count: int, dtype: str, impl: str, t: float, world: int, op: str, wrong: int,
             nccl_t: float | None) -> str:
    algbw = size / t / 1e9
    vs = f"{nccl_t / t:8.2f}x" if nccl_t is not None and impl != "nccl" else f"{'':>9}"
    return (f"{size:>12} {count:>11} {dtype:>8} {'sum':>5} {impl:>8} {t * 1e6:>10.1f} {algbw:>7.2f} "
            f"{algbw * BUS_FACTOR[op](world):>7.2f} {wrong:>6} {vs}")


HEADER = (f"{'size':>12} {'count':>11} {'type':>8} {'redop':>5} {'impl':>8} {'time(us)':>10} {'algbw':>7} "
          f"{'busbw':>7} {'#wrong':>6} {'vs nccl':>9}")


def _timed(call, sync, max_over_ranks, budget_s: float) -> float:
    """Seconds per call (timing.time_calls): the calls back to back, one device synchronisation after."""
    return time_calls(call, sync, max_over_ranks, budget_s, settle=torch.cuda.synchronize, most=10_000)


# ---- one process per GPU (spawned by ringzero.cli.launch, or under torchrun) ---------------------------

def _group_per_algo(algos, world: int) -> dict:
    """A process group per forced algorithm: a communicator reads RINGZERO_ALLREDUCE_ALGO when it is
    made, at the group's first collective, which runs here inside config.settings."""
    import ringzero
    from ..comm.config import settings

    groups = {}
    for algo in algos:
        with settings(allreduce_algo=algo):
            groups[algo] = dist.new_group(list(range(world)))
            ringzero.all_reduce(torch.ones(1, device="cuda"), group=groups[algo])
    torch.cuda.synchronize()
    return groups


def _call(op: str, impl: str, groups, inp: torch.Tensor, out: torch.Tensor):
    import ringzero
    from ringzero.comm import torch_compat

    if impl == "nccl":
        if op == "all_reduce":
            return lambda: dist.all_reduce(inp)
        if op == "reduce_scatter":
            return lambda: torch_compat.reduce_scatter_single(out, inp)
        if op == "all_to_all":
            return lambda: dist.all_to_all_single(out, inp)
        return lambda: torch_compat.all_gather_single(out, inp)
    g = groups[impl]
    if op == "all_reduce":
        return lambda: ringzero.all_reduce(inp, group=g)
    if op == "reduce_scatter":
        return lambda: ringzero.reduce_scatter_single(out, inp, group=g)
    if op == "all_to_all":
        return lambda: ringzero.all_to_all_single(out, inp, group=g)
    return lambda: ringzero.all_gather_single(out, inp, group=g)


def _nccl_version() -> str:
    try:
        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception as e:  # a torch without NCCL
        return f"unavailable ({type(e).__name__})"


def run(args) -> None:
    """One rank of `ringzero bench --device cuda`: the process group is up and this rank's GPU chosen."""
    import ringzero
    from ..trainer.device import machine

    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device())
    host = dist.new_group(backend="gloo")  # the host-side agreement: timings, counts of wrong elements
    m = machine("cuda")
    nccl = not args.no_nccl and not m["shared"] and m["nccl"]
    dtype = getattr(torch, args.dtype)
    es = torch.tensor([], dtype=dtype).element_size()
    groups = _group_per_algo(list(dict.fromkeys(["auto", *args.algos])), world)  # auto: the other ops' row

    def max_over_ranks(x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=host)
        return t.item()

    def sync():
        torch.cuda.synchronize()
        dist.barrier(group=host)

    if rank == 0:
        names = sorted({torch.cuda.get_device_name(d) for d in range(torch.cuda.device_count())})
        print(f"# ringzero {ringzero.__version__} CUDA collectives | {world} ranks | {', '.join(names)} | "
              f"{torch.cuda.device_count()} visible GPU(s){', shared by the ranks (CUDA IPC)' if m['shared'] else ''}"
              f" | torch {torch.__version__} | NCCL {_nccl_version()}")
        if not nccl:
            why = ("--no-nccl" if args.no_nccl else "ranks share a GPU: NCCL refuses two ranks on one GPU"
                   if m["shared"] else "this torch has no NCCL")
            print(f"# no NCCL rows: {why}")
        if m["shared"]:
            print("# ranks share a GPU: it runs one process's kernels at a time (time slices of a few ms, unless "
                  "MPS runs), and a kernel waiting for its peer holds the GPU until the slice ends, so these times "
                  "measure the sharing, not the algorithm (2.3 ms per wait on an H200: benchmarks/RESULTS.md); #wrong still "
                  "checks every result")
        print("# time: us per call, slowest rank; algbw, busbw: GB/s; #wrong: elements differing from torch's "
              "int64 sum of every rank's inputs (all-gather, all-to-all: from the blocks they must receive); "
              "vs nccl: NCCL time / time")
    failures = 0
    for op in args.ops:
        if rank == 0:
            print(f"\n## {op}\n{HEADER}", flush=True)
        for size in sizes_of(args):
            count, n_in, n_out = shape(op, size, es, world)
            inp = pattern(rank, n_in, dtype, device)
            out = inp if op == "all_reduce" else torch.empty(n_out, dtype=dtype, device=device)
            want = expected(op, rank, world, n_in, dtype, device)
            rows = []
            for impl in impls(op, args.algos, nccl):
                call = _call(op, impl, groups, inp, out)
                t = _timed(call, sync, max_over_ranks, args.budget_s)
                inp.copy_(pattern(rank, n_in, dtype, device))
                call()
                torch.cuda.synchronize()
                wrong = torch.tensor([int((out != want).sum().item())], dtype=torch.int64)
                dist.all_reduce(wrong, group=host)
                rows.append((impl, t, int(wrong.item())))
            nccl_t = next((t for impl, t, _ in rows if impl == "nccl"), None)
            for impl, t, wrong in rows:
                failures += wrong > 0
                if rank == 0:
                    print(row_line(count * es, count, args.dtype, impl, t, world, op, wrong, nccl_t), flush=True)
    if failures:
        raise SystemExit(f"ringzero bench: {failures} row(s) with wrong elements (the #wrong column)")


# ---- --sim-ranks N: N simulated ranks on one GPU, one process --------------------------------------

def run_simulated(args) -> int:
    """`--sim-ranks N`: every rank's buffers on this GPU, one kernel launch per collective (docs/design.md,
    "Proving GPU code on one GPU"). Returns the exit status (1 if a row has wrong elements)."""
    import ringzero
    from ringzero import _C
    from ringzero.comm import cuda as rz_cuda

    n = args.sim_ranks
    device = torch.device("cuda", torch.cuda.current_device())
    dtype = getattr(torch, args.dtype)
    es = torch.tensor([], dtype=dtype).element_size()
    colls = {"all_reduce": rz_cuda.ALL_REDUCE, "reduce_scatter": rz_cuda.REDUCE_SCATTER,
             "all_gather": rz_cuda.ALL_GATHER}
    sim = rz_cuda.simulated_world(n)
    print(f"# ringzero {ringzero.__version__} CUDA collectives | {n} simulated ranks on one "
          f"{torch.cuda.get_device_name(device)} | torch {torch.__version__}")
    print("# no NCCL rows: NCCL refuses two ranks on one GPU (and a simulated world is one process)")
    print("# time: us per call (one launch serves every rank); algbw, busbw: GB/s per rank; #wrong: elements "
          "differing from torch's int64 sum of every rank's inputs (all-gather, all-to-all: from the blocks they "
          "must receive), all ranks")
    failures = 0
    for op in args.ops:
        print(f"\n## {op}\n{HEADER}", flush=True)
        for size in sizes_of(args):
            count, n_in, n_out = shape(op, size, es, n)
            ins = [pattern(r, n_in, dtype, device) for r in range(n)]
            outs = ins if op == "all_reduce" else [torch.empty(n_out, dtype=dtype, device=device) for _ in range(n)]
            wants = [expected(op, r, n, n_in, dtype, device) for r in range(n)]
            counts = [torch.full((n,), n_in // n, dtype=torch.int64, device=device) for _ in range(n)]
            for impl in impls(op, args.algos, False):
                algo = _C.ALL_REDUCE_ALGOS[impl] if op == "all_reduce" else _C.ALL_REDUCE_ALGOS["auto"]

                def call():
                    if op == "all_to_all":  # even blocks; the counts stay on the device, as the kernel reads them
                        sim.all_to_all(ins, outs, counts)
                    else:
                        sim.run(colls[op], ins, outs, int(ringzero.ReduceOp.SUM), algo)

                t = _timed(call, torch.cuda.synchronize, lambda x: x, args.budget_s)
                for r in range(n):
                    ins[r].copy_(pattern(r, n_in, dtype, device))
                call()
                torch.cuda.synchronize()
                wrong = sum(int((outs[r] != wants[r]).sum().item()) for r in range(n))
                failures += wrong > 0
                print(row_line(count * es, count, args.dtype, impl, t, n, op, wrong, None), flush=True)
    if failures:
        print(f"ringzero bench: {failures} row(s) with wrong elements (the #wrong column)")
    return 1 if failures else 0
