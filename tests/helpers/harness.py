"""Spawns N ranks on this machine with a gloo process group and runs one function in each.

One spawn serves many cases (the function loops over them, like torch's run_subtests), because
starting ranks dominates the cost on 2 cores. Ranks are forked (the parent never starts gloo or
OpenMP threads), rendezvous through a FileStore, and are killed if they outlive `timeout_s`.
A rank's exception is re-raised in the parent with that rank's traceback.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import tempfile
import traceback


def _entry(rank, world, store_path, fn, args, env, out):
    try:
        os.environ.update(env or {})
        if isinstance(env, dict) and "RINGZERO_HOST_IDS" in env:
            os.environ["RINGZERO_HOST_ID"] = env["RINGZERO_HOST_IDS"].split(",")[rank]
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
        try:
            result = fn(rank, world, *args)
        finally:
            import ringzero

            ringzero.destroy_communicators()
            dist.destroy_process_group()
        out.put((rank, "ok", result))
    except BaseException:
        error = traceback.format_exc()
        if "Cannot re-initialize CUDA in forked subprocess" in error:
            error += ("(run_ranks: the parent asked torch about CUDA before forking the ranks, and "
                      "torch.cuda.is_available() and device_count() count: run them from a fresh interpreter "
                      "that imports nothing that does, as tests/helpers/cuda_util.run_script does)\n")
        out.put((rank, "error", error))
        raise SystemExit(1)


def run_ranks(world: int, fn, *args, env: dict | None = None, timeout_s: float = 600, expect_exit: dict | None = None):
    """Runs fn(rank, world, *args) on `world` forked ranks; returns the list of results by rank.

    expect_exit maps rank -> True for ranks that are meant to die (they report nothing)."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    expect_exit = expect_exit or {}
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        env = {"RINGZERO_FLIGHT_DIR": tmp, **(env or {})}
        procs = [ctx.Process(target=_entry, args=(r, world, store, fn, args, env, out), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        results, errors = {}, {}
        waiting = world - len(expect_exit)
        try:
            while waiting:
                try:
                    rank, status, payload = out.get(timeout=timeout_s)
                except queue.Empty:
                    raise AssertionError(f"ranks timed out after {timeout_s} s; finished: {sorted(results)}") from None
                waiting -= 1
                (results if status == "ok" else errors)[rank] = payload
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
                    p.join()
        if errors:
            first = min(errors)
            raise AssertionError(f"rank {first} failed:\n{errors[first]}" +
                                 (f"\n(also failed: ranks {sorted(errors)})" if len(errors) > 1 else ""))
        return [results.get(r) for r in range(world)]
