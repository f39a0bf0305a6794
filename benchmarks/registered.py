"""Registered tensors against plain ones on one host (issue 47): ringzero.all_gather_into_tensor,
reduce_scatter_tensor and all_reduce on tensors from ringzero.empty (read from the peers directly,
[Note: registered tensors] in csrc/core/shm_window.cpp) and on plain tensors (staged through the slots, or
for all-gather blocks of 64 KiB-16 MiB read with process_vm_readv), with the one-copy floor of each.

The floor is what the direct path itself must move per rank, timed as a copy of that volume on every rank at
once, in the same run (so the ranks share the memory system as in the collective), by the collectives' own two
copies (memcpy, and streaming stores, which large all-gathers use), the faster of them: a copy of S bytes
reads S and writes S, and the volume is
  all_gather      S = the whole output (every block read once and written once, the own one included)
  reduce_scatter  reads the whole input, writes 1/n of it: S = (1 + 1/n) / 2 of the input
  all_reduce      reads its chunk of every tensor (the whole tensor's bytes) and writes it in place over
                  lines it has just read (not counted), then copies (n-1)/n in: S = (1 + 2(n-1)/n) / 2 of it
"of floor" is the floor's time over the registered call's (100% would be the floor; above it the floor
is wrong).

    python benchmarks/registered.py [--world 2] [--sizes-mib 0.0625 1 16 64] [--rounds 5] [--dtype float32]

Sizes are the whole buffer (all-gather's output, reduce-scatter's input, all-reduce's tensor). Each round
times every (op, size, way) in turn, a block of calls each after a barrier; medians over rounds, rank 0's.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

OPS = ("all_gather", "reduce_scatter", "all_reduce")


def copy_volume(op: str, nbytes: int, world: int) -> int:
    """S of the module docstring: the bytes of a plain copy that moves what the direct path must."""
    if op == "all_gather":
        return nbytes
    if op == "reduce_scatter":
        return int(nbytes * (1 + 1 / world) / 2)
    return int(nbytes * (1 + 2 * (world - 1) / world) / 2)


def calls_for(nbytes: int) -> int:
    return max(3, min(200, (64 << 20) // max(nbytes, 1)))


def rank_main(rank: int, world: int, store: str, sizes: list[int], rounds: int, dtype_name: str, out: str):
    import torch
    import torch.distributed as dist

    import ringzero
    from ringzero import _C

    torch.set_num_threads(1)  # the collectives copy on one thread per rank; so does the floor
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    dtype = getattr(torch, dtype_name)
    es = dtype.itemsize
    def ways_for(op: str, n: int) -> dict:
        """name -> a call of `op` on buffers of n elements (made here: each size's calls keep their own)."""
        vol = copy_volume(op, n * es, world) // es
        src, dst = torch.ones(vol, dtype=dtype), torch.empty(vol, dtype=dtype)
        floor = {"memcpy": lambda: _C.copy_bytes(dst, src, False), "streaming": lambda: _C.copy_bytes(dst, src, True)}
        if op == "all_gather":
            out, plain, reg = torch.empty(n, dtype=dtype), torch.ones(n // world, dtype=dtype), \
                ringzero.empty(n // world, dtype=dtype)
            reg.fill_(1)
            return {"plain": lambda: ringzero.all_gather_into_tensor(out, plain),
                    "registered": lambda: ringzero.all_gather_into_tensor(out, reg), **floor}
        if op == "reduce_scatter":
            out, plain, reg = torch.empty(n // world, dtype=dtype), torch.ones(n, dtype=dtype), ringzero.empty(n, dtype=dtype)
            reg.fill_(1)
            return {"plain": lambda: ringzero.reduce_scatter_tensor(out, plain),
                    "registered": lambda: ringzero.reduce_scatter_tensor(out, reg), **floor}
        plain, reg = torch.zeros(n, dtype=dtype), ringzero.empty(n, dtype=dtype)
        reg.zero_()  # zeros stay zeros: no overflow however many calls
        return {"plain": lambda: ringzero.all_reduce(plain), "registered": lambda: ringzero.all_reduce(reg), **floor}

    cases = {(op, nbytes // es // world * world * es): ways_for(op, nbytes // es // world * world)
             for nbytes in sizes for op in OPS}
    # Registered results equal the plain ones (integers in float: exact at these sizes).
    for nbytes in sizes[:1]:
        n = nbytes // es // world * world
        v = ringzero.empty(n, dtype=dtype)
        v.copy_(torch.arange(n) % 13 + rank)
        w = (torch.arange(n) % 13 + rank).to(dtype)
        ringzero.all_reduce(v)
        ringzero.all_reduce(w)
        assert torch.equal(v, w), "registered all_reduce differs from the staged one"
    times = {key: {way: [] for way in ways} for key, ways in cases.items()}
    for _ in range(rounds):
        for key, ways in cases.items():
            calls = calls_for(key[1])
            for way, fn in ways.items():
                fn()
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                times[key][way].append((time.perf_counter() - t0) / calls * 1e6)
    if rank == 0:
        rows = [{"op": op, "bytes": nbytes, **{way: statistics.median(ts) for way, ts in by_way.items()}}
                for (op, nbytes), by_way in times.items()]
        for row in rows:  # the floor: the faster of the two copies of the volume
            row["floor"] = min(row.pop("memcpy"), row.pop("streaming"))
        with open(out, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--sizes-mib", type=float, nargs="+", default=[1 / 16, 1, 16, 64])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dtype", default="float32")
    args = p.parse_args()
    import torch.multiprocessing as mp

    sizes = [int(m * (1 << 20)) for m in args.sizes_mib]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        mp.start_processes(rank_main, args=(args.world, os.path.join(tmp, "store"), sizes, args.rounds, args.dtype,
                                            out), nprocs=args.world, start_method="spawn")
        with open(out) as f:
            rows = json.load(f)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"# registered tensors | {args.world} ranks | {args.dtype} | {cpu} | median of {args.rounds} rounds, rank 0 | "
          f"{time.strftime('%Y-%m-%d')} | load average {os.getloadavg()[0]:.2f}")
    print(f"{'op':<15} | {'MiB':>7} | {'plain us':>9} | {'registered us':>13} | {'plain/reg':>9} | {'floor us':>9} | "
          f"{'of floor':>8}")
    for r in rows:
        print(f"{r['op']:<15} | {r['bytes'] / (1 << 20):>7.4g} | {r['plain']:>9.1f} | {r['registered']:>13.1f} | "
              f"{r['plain'] / r['registered']:>8.2f}x | {r['floor']:>9.1f} | {r['floor'] / r['registered']:>8.0%}")


if __name__ == "__main__":
    sys.exit(main())
