"""Random sequences of torch.distributed calls on a "ringzero" group that spans forced hosts, every result
checked exactly against a model of what the same calls give one after the other.

The calls mix what ringzero's engine runs across hosts (all_reduce and its coalesced form, reduce_scatter,
all_gather in both forms, broadcast, reduce, barrier, all_to_all_single, gather) with what the backend hands
to its inner gloo (bitwise reductions, isend/irecv): docs/backend.md, "What runs where". They are
asynchronous, waited on in a random order of each rank's own (c10d allows any), and a call's input is often
the tensor of an earlier call that may still be in flight, so that the order the engine keeps between its
own calls, its deferred tails ([Note: the engine's deferred tail] in csrc/torch/backend_hosts.h) and the
calls it hands on is what the model checks. Sizes: 0, 1, primes, and around the 2 MiB from which an
all-reduce across hosts is pipelined and may defer its tail. Values are small integers, bounded so that
every sum, product and average stays exact in its dtype.

The seed is printed and in every message; RINGZERO_FUZZ_SEED=<n> repeats a run, RINGZERO_FUZZ_OPS sets the
number of calls, RINGZERO_FUZZ_HOSTS the layouts.
"""
import os
import random
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from harness import run_ranks

# Exact integers each dtype holds (a bound on every value the model lets a tensor reach).
LIMIT = {torch.float32: 1 << 24, torch.float64: 1 << 53, torch.float16: 2048, torch.bfloat16: 256,
         torch.int32: (1 << 31) - 1, torch.int64: (1 << 62), torch.int8: 127, torch.uint8: 255}
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
PIPELINED = 2 << 20  # bytes: an all-reduce across hosts this large is pipelined (and may defer its tail)


class Entry:
    """A tensor of the sequence: this rank's tensor and the model of every rank's value (float64 exact
    integers, None where a call leaves that rank's value unspecified), with a bound on its values."""

    def __init__(self, t, model, bound):
        self.t, self.model, self.bound = t, model, bound
        self.busy = None  # a call not waited on reads or writes it: "native" (ringzero's engine), "inner" (gloo)

    @property
    def known(self):
        return all(m is not None for m in self.model)


def values(rank, n, salt, hi, dtype):
    g = torch.Generator().manual_seed(salt * 131 + rank)
    return torch.randint(0, hi, (n,), generator=g, dtype=torch.int64).to(dtype)


def reduce_model(op, xs, world):
    """op over the ranks' float64 values; op is a name."""
    if op == "sum":
        return sum(xs[1:], xs[0].clone())
    if op == "avg":
        return sum(xs[1:], xs[0].clone()) / world
    if op == "premul2":
        return sum(xs[1:], xs[0].clone()) * 2
    if op == "product":
        out = xs[0].clone()
        for x in xs[1:]:
            out *= x
        return out
    if op in ("min", "max"):
        stacked = torch.stack(xs)
        return stacked.amin(0) if op == "min" else stacked.amax(0)
    ints = [x.to(torch.int64) for x in xs]
    out = ints[0].clone()
    for x in ints[1:]:
        out = out & x if op == "band" else out | x if op == "bor" else out ^ x
    return out.to(torch.float64)


def torch_op(op):
    if op == "premul2":
        return dist._make_nccl_premul_sum(2.0)
    return {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT,
            "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND,
            "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}[op]


def grown_bound(op, bound, world):
    if op in ("sum",):
        return bound * world
    if op == "premul2":
        return 2 * bound * world
    if op == "product":
        return bound ** world
    if op in ("band", "bor", "bxor"):
        return (1 << max(1, int(bound).bit_length())) - 1
    return bound  # avg, min, max


def within_sum(e, world, fresh):
    """e, or a fresh tensor of its size and dtype where a sum over the ranks could pass its dtype's exact integers."""
    return e if e.bound * world <= LIMIT[e.t.dtype] else fresh(e.t.numel(), e.t.dtype, 8)


def fuzz(rank, world, seed, n_ops):
    shared, mine = random.Random(seed), random.Random(seed * 7919 + rank)  # the calls; this rank's waits
    g = dist.new_group(backend="ringzero", timeout=timedelta(seconds=60))
    pool: list[Entry] = []  # tensors a later call may take as its input (the newest last)
    pending = []  # works not waited on yet
    where = f"seed {seed}, rank {rank}"
    counts = {}
    calls = []  # what each call was, for the message
    power_of_two = world & (world - 1) == 0

    def size(dtype, multiple=1):
        es = torch.empty((), dtype=dtype).element_size()
        n = shared.choice([0, 1, 2, 3, 7, 13, 1021, 65537, PIPELINED // es - 1, PIPELINED // es,
                           PIPELINED // es + 13, (3 << 20) // es + 7])
        return n * multiple

    def fresh(n, dtype, hi):
        salt = shared.randrange(1 << 30)
        model = [values(r, n, salt, hi, torch.float64) for r in range(world)]
        return Entry(model[rank].to(dtype, copy=True), model, hi - 1)

    def an_input(dtype, n=None, hi=4, inner=False):
        """An earlier tensor of this dtype (and numel, if given) whose value every rank's model knows, or a
        fresh one. The backend keeps its own calls in call order, and the calls it hands to the inner gloo
        in gloo's order, which runs two at a time on its worker threads: an asynchronous gloo call is not
        ordered against the next call, as on a plain gloo group. So a tensor that a call not waited on
        touches is an input only where both calls are ringzero's own."""
        old = [e for e in pool if e.t.dtype == dtype and e.known and (n is None or e.t.numel() == n)
               and (e.busy is None if inner else e.busy != "inner")]
        if old and shared.random() < 0.6:
            return shared.choice(old)
        return fresh(size(dtype) if n is None else n, dtype, hi)

    def wait_some(all_of_them=False):
        mine.shuffle(pending)
        keep = [] if all_of_them else pending[:mine.randrange(len(pending) + 1)]
        for w, has_future in pending[len(keep):]:
            (w.get_future().wait() if has_future and mine.random() < 0.3 else w.wait())  # a Future: its wait()
        pending[:] = keep

    def mark(es, inner=False):
        for e in es:
            e.busy = "inner" if inner else e.busy or "native"

    def check_all():
        wait_some(all_of_them=True)
        for i, e in enumerate(pool):
            e.busy = None
            if e.model[rank] is None:
                continue
            got = e.t.to(torch.float64)
            if not torch.equal(got, e.model[rank]):
                bad = (got != e.model[rank]).nonzero()
                first = int(bad[0, 0]) if bad.numel() else -1
                raise AssertionError(f"{where}: pool tensor {i} ({e.t.dtype}, {e.t.numel()} elements) differs at "
                                     f"{bad.shape[0]} elements, first [{first}]: got {got[first].item()}, "
                                     f"want {e.model[rank][first].item()}; the calls:\n" + "\n".join(calls))

    def remember(e):
        pool.append(e)
        if len(pool) > 8:
            pool.pop(0)

    for step in range(n_ops):
        kind = shared.choice(["all_reduce"] * 6 + ["reduce_scatter", "all_gather", "all_gather_list", "broadcast",
                                                   "reduce", "barrier", "coalesced", "reduce_scatter_list",
                                                   "all_to_all", "gather", "bitwise", "sendrecv"])
        dtype = shared.choice(list(LIMIT))
        counts[kind] = counts.get(kind, 0) + 1
        work, note = None, ""

        if kind in ("all_reduce", "bitwise"):
            ops = (["band", "bor", "bxor"] if kind == "bitwise" and not dtype.is_floating_point else
                   ["sum", "sum", "min", "max", "product"] + (["avg", "premul2"] if dtype in FLOATS and power_of_two
                                                              else []))
            op = shared.choice(ops)
            inner = op in ("band", "bor", "bxor")
            e = an_input(dtype, hi=3 if op == "product" else 8, inner=inner)
            if grown_bound(op, e.bound, world) > LIMIT[dtype]:
                op = "max"
            # A strided view where ringzero runs the op (the inner gloo refuses one: test_backend_ops.py).
            strided = not inner and e.t.numel() > 1 and shared.random() < 0.1
            target = e.t[::2] if strided else e.t
            work = dist.all_reduce(target, op=torch_op(op), group=g, async_op=True)
            note = f"op {op} on {id(e.t) % 10007} ({e.t.numel()}{', strided' if strided else ''})"
            picks = slice(None, None, 2) if strided else slice(None)
            reduced = reduce_model(op, [m[picks] for m in e.model], world)
            for m in e.model:
                m[picks] = reduced
            e.bound = grown_bound(op, e.bound, world)
            mark([e], inner)
            if e not in pool:
                remember(e)
        elif kind == "coalesced":
            es = [an_input(dtype) for _ in range(shared.randrange(1, 4))]
            es = [e for i, e in enumerate(es) if all(e is not f for f in es[:i])]  # one tensor once
            if any(e.bound * world > LIMIT[dtype] for e in es):
                es = [fresh(e.t.numel(), dtype, 8) for e in es]
            work = dist.all_reduce_coalesced([e.t for e in es], group=g, async_op=True)
            note = f"on {[id(e.t) % 10007 for e in es]}"
            pending.append((work, False))  # torch returns this one's future (a Future, not a Work)
            work = None
            for e in es:
                reduced = reduce_model("sum", e.model, world)
                e.model = [reduced.clone() for _ in range(world)]
                e.bound *= world
                mark([e])
                if e not in pool:
                    remember(e)
        elif kind in ("reduce_scatter", "reduce_scatter_list"):
            k = size(dtype) // 2 if shared.random() < 0.5 else shared.choice([0, 1, 5, 4099])
            e = an_input(dtype, n=k * world)
            e = within_sum(e, world, fresh)
            out = torch.full((k,), 99, dtype=dtype)
            if kind == "reduce_scatter":
                work = dist.reduce_scatter_tensor(out, e.t, group=g, async_op=True)
            else:
                work = dist.reduce_scatter(out, list(e.t.chunk(world)) if k else [e.t[:0]] * world, group=g,
                                           async_op=True)
            reduced = reduce_model("sum", e.model, world)
            note = f"from {id(e.t) % 10007} ({e.t.numel()}) into {id(out) % 10007}"
            remember(Entry(out, [reduced[r * k:(r + 1) * k].clone() for r in range(world)], e.bound * world))
            mark([e, pool[-1]])
        elif kind == "all_gather":
            k = size(dtype) // 3 if shared.random() < 0.5 else shared.choice([0, 1, 7, 4099])
            e = an_input(dtype, n=k)
            out = torch.full((k * world,), 99, dtype=dtype)
            work = dist.all_gather_into_tensor(out, e.t, group=g, async_op=True)
            note = f"from {id(e.t) % 10007} ({e.t.numel()}) into {id(out) % 10007}"
            whole = torch.cat(e.model)
            remember(Entry(out, [whole.clone() for _ in range(world)], e.bound))
            mark([e, pool[-1]])
        elif kind == "all_gather_list":
            ns = [shared.choice([0, 1, 3, 1021, 65537]) for _ in range(world)]
            if shared.random() < 0.5:
                ns = [ns[0]] * world
            e = an_input(dtype, n=ns[rank]) if len(set(ns)) == 1 else None
            salt = shared.randrange(1 << 30)
            model = [values(r, ns[r], salt, 8, torch.float64) for r in range(world)]
            t = e.t if e is not None else model[rank].to(dtype, copy=True)
            if e is not None:
                model = e.model
            outs = [torch.full((ns[r],), 99, dtype=dtype) for r in range(world)]
            work = dist.all_gather(outs, t, group=g, async_op=True)
            note = f"sizes {ns} from {id(t) % 10007}"
            for r in range(world):
                remember(Entry(outs[r], [model[r].clone() for _ in range(world)], 7 if e is None else e.bound))
                mark([pool[-1]])
            mark([e] if e is not None else [])
        elif kind == "broadcast":
            e = an_input(dtype)
            src = shared.randrange(world)
            work = dist.broadcast(e.t, src=src, group=g, async_op=True)
            note = f"src {src} on {id(e.t) % 10007} ({e.t.numel()})"
            e.model = [e.model[src].clone() for _ in range(world)]
            mark([e])
            if e not in pool:
                remember(e)
        elif kind == "reduce":
            e = an_input(dtype)
            e = within_sum(e, world, fresh)
            dst = shared.randrange(world)
            work = dist.reduce(e.t, dst=dst, group=g, async_op=True)
            note = f"dst {dst} on {id(e.t) % 10007} ({e.t.numel()})"
            reduced = reduce_model("sum", e.model, world)
            # The other ranks' tensors are unspecified after a reduce (torch's contract): not checked again.
            e.model = [reduced if r == dst else None for r in range(world)]
            e.bound *= world
            mark([e])
            if e not in pool:
                remember(e)
        elif kind == "barrier":
            work = dist.barrier(group=g, async_op=True)
        elif kind == "all_to_all":
            k = shared.choice([0, 1, 13, 1021])
            e = an_input(dtype, n=k * world, inner=True)
            out = torch.full((k * world,), 99, dtype=dtype)
            work = dist.all_to_all_single(out, e.t, group=g, async_op=True)
            note = f"from {id(e.t) % 10007} ({e.t.numel()}) into {id(out) % 10007}"
            remember(Entry(out, [torch.cat([e.model[q][r * k:(r + 1) * k] for q in range(world)])
                                 for r in range(world)], e.bound))
            mark([e, pool[-1]], inner=True)
        elif kind == "gather":
            e = an_input(dtype, n=shared.choice([0, 1, 1021]), inner=True)
            dst = shared.randrange(world)
            outs = [torch.full_like(e.t, 99) for _ in range(world)] if rank == dst else None
            work = dist.gather(e.t, outs, dst=dst, group=g, async_op=True)
            note = f"dst {dst} from {id(e.t) % 10007} ({e.t.numel()})"
            for q in range(world):  # every rank keeps the pool in step: the others' entries model nothing
                remember(Entry(outs[q] if rank == dst else torch.empty(0, dtype=dtype),
                               [e.model[q].clone() if r == dst else None for r in range(world)], e.bound))
                mark([pool[-1]], inner=True)
            mark([e], inner=True)
        else:  # sendrecv: a ring, each rank to the next (inner gloo across hosts)
            e = an_input(dtype, n=shared.choice([0, 1, 1021, 65537]), inner=True)
            out = torch.full_like(e.t, 99)
            works = [dist.isend(e.t, (rank + 1) % world, group=g), dist.irecv(out, (rank - 1) % world, group=g)]
            pending.extend((w, False) for w in works)  # gloo's point-to-point Work has no future
            remember(Entry(out, [e.model[(r - 1) % world].clone() for r in range(world)], e.bound))
            mark([e, pool[-1]], inner=True)
        calls.append(f"{step}: {kind} {dtype} {note}; pool {[(id(e.t) % 10007, e.t.numel()) for e in pool]}")
        if work is not None:
            pending.append((work, True))
        if mine.random() < 0.3:
            wait_some()
        if shared.random() < 0.08:
            check_all()
    check_all()
    dist.destroy_process_group(g)
    return counts


# Hosts of the ranks: the hierarchical form (two layouts), the flat ring (uneven hosts), and one host (the
# shared-memory path). RINGZERO_FUZZ_HOSTS="a,a,b,b,c,c;a,b,b" runs others.
LAYOUTS = os.environ.get("RINGZERO_FUZZ_HOSTS", "a,a,b,b;a,b,a,b;a,a,b;a,a,a").split(";")


@pytest.mark.parametrize("hosts", LAYOUTS)
def test_random_calls_give_the_sequential_results(hosts):
    seed = int(os.environ.get("RINGZERO_FUZZ_SEED") or random.randrange(1 << 31))
    n_ops = int(os.environ.get("RINGZERO_FUZZ_OPS", "120"))
    print(f"test_backend_fuzz: hosts {hosts}, seed {seed} (RINGZERO_FUZZ_SEED={seed} repeats it), {n_ops} calls")
    world = len(hosts.split(","))
    counts = run_ranks(world, fuzz, seed, n_ops, env={"RINGZERO_HOST_IDS": hosts}, timeout_s=400)
    assert all(c == counts[0] for c in counts), (seed, counts)
    assert counts[0].get("all_reduce", 0) > 0, (seed, counts)


def fuzz_api(rank, world, seed, n_ops):
    """The same for the ringzero.* functions on the default group (the door ringzero's DDP and ZeRO take), their
    tensors often from ringzero.empty (read from the peers in place), whole or a contiguous part at one offset
    on every rank. Every call is ringzero's own, so any tensor a call not waited on touches may be the next
    call's input."""
    import ringzero

    shared, mine = random.Random(seed), random.Random(seed * 7919 + rank)
    pool: list[Entry] = []
    pending, calls = [], []
    where = f"seed {seed}, rank {rank} (ringzero.*)"
    power_of_two = world & (world - 1) == 0
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int8,
              torch.uint8]
    ops = {"sum": ringzero.ReduceOp.SUM, "avg": ringzero.ReduceOp.AVG, "min": ringzero.ReduceOp.MIN,
           "max": ringzero.ReduceOp.MAX, "product": ringzero.ReduceOp.PRODUCT}

    def tensor(n, dtype):
        """A tensor of n elements: plain, registered, or a part of a larger registered one (the same offset on
        every rank)."""
        how = shared.random()
        if how < 0.4:
            return torch.empty(n, dtype=dtype)
        extra = shared.choice([0, 1, 17]) if how < 0.7 else 0
        big = ringzero.empty(n + 2 * extra, dtype=dtype)
        return big[extra:extra + n]

    def fresh(n, dtype, hi):
        salt = shared.randrange(1 << 30)
        model = [values(r, n, salt, hi, torch.float64) for r in range(world)]
        t = tensor(n, dtype)
        t.copy_(model[rank])
        return Entry(t, model, hi - 1)

    def an_input(dtype, n=None, hi=4):
        old = [e for e in pool if e.t.dtype == dtype and e.known and (n is None or e.t.numel() == n)]
        if old and shared.random() < 0.6:
            return shared.choice(old)
        n = n if n is not None else shared.choice([0, 1, 3, 13, 1021, 16411, 65537, (1 << 20) // 4 + 5,
                                                   (3 << 20) // 4 + 7])
        return fresh(n, dtype, hi)

    def remember(e):
        if all(e is not f for f in pool):
            pool.append(e)
        if len(pool) > 8:
            pool.pop(0)

    def wait_some(all_of_them=False):
        mine.shuffle(pending)
        keep = [] if all_of_them else pending[:mine.randrange(len(pending) + 1)]
        for w in pending[len(keep):]:
            w.wait()
        pending[:] = keep

    def check_all():
        wait_some(all_of_them=True)
        for i, e in enumerate(pool):
            if e.model[rank] is None:
                continue
            got = e.t.to(torch.float64)
            if not torch.equal(got, e.model[rank]):
                bad = (got != e.model[rank]).nonzero()
                first = int(bad[0, 0])
                raise AssertionError(f"{where}: pool tensor {i} ({e.t.dtype}, {e.t.numel()} elements) differs at "
                                     f"{bad.shape[0]} elements, first [{first}]: got {got[first].item()}, want "
                                     f"{e.model[rank][first].item()}; the calls:\n" + "\n".join(calls))

    for step in range(n_ops):
        kind = shared.choice(["all_reduce"] * 4 + ["reduce_scatter", "all_gather", "all_gather_v", "broadcast",
                                                   "reduce", "barrier"])
        dtype = shared.choice(dtypes)
        work, note = None, ""
        if kind == "all_reduce":
            op = shared.choice(["sum", "sum", "min", "max", "product"] +
                               (["avg"] if dtype.is_floating_point and power_of_two else []))
            e = an_input(dtype, hi=3 if op == "product" else 8)
            if grown_bound(op, e.bound, world) > LIMIT[dtype]:
                op = "max"
            work = ringzero.all_reduce(e.t, op=ops[op], async_op=True)
            reduced = reduce_model(op, e.model, world)
            e.model = [reduced.clone() for _ in range(world)]
            e.bound = grown_bound(op, e.bound, world)
            note = f"{op} on {e.t.numel()}"
            remember(e)
        elif kind == "reduce_scatter":
            k = shared.choice([0, 1, 5, 4099, (1 << 20) // 8 + 3])
            e = an_input(dtype, n=k * world)
            e = within_sum(e, world, fresh)
            out = tensor(k, dtype)
            work = ringzero.reduce_scatter_single(out, e.t, async_op=True)
            reduced = reduce_model("sum", e.model, world)
            note = f"{k * world} into {k}"
            remember(Entry(out, [reduced[r * k:(r + 1) * k].clone() for r in range(world)], e.bound * world))
        elif kind == "all_gather":
            k = shared.choice([0, 1, 7, 4099, (1 << 20) // 8 + 3])
            e = an_input(dtype, n=k)
            out = tensor(k * world, dtype)
            work = ringzero.all_gather_single(out, e.t, async_op=True)
            whole = torch.cat(e.model)
            note = f"{k} into {k * world}"
            remember(Entry(out, [whole.clone() for _ in range(world)], e.bound))
        elif kind == "all_gather_v":
            counts = [shared.choice([0, 1, 3, 1021, 65537]) for _ in range(world)]
            salt = shared.randrange(1 << 30)
            model = [values(r, counts[r], salt, 8, torch.float64) for r in range(world)]
            inp = model[rank].to(dtype, copy=True)
            out = tensor(sum(counts), dtype)
            work = ringzero.all_gather_v(out, inp, counts, async_op=True)
            whole = torch.cat(model)
            note = f"counts {counts}"
            remember(Entry(out, [whole.clone() for _ in range(world)], 7))
        elif kind == "broadcast":
            e = an_input(dtype)
            src = shared.randrange(world)
            work = ringzero.broadcast(e.t, src=src, async_op=True)
            e.model = [e.model[src].clone() for _ in range(world)]
            note = f"src {src} on {e.t.numel()}"
            remember(e)
        elif kind == "reduce":
            e = an_input(dtype)
            e = within_sum(e, world, fresh)
            dst = shared.randrange(world)
            work = ringzero.reduce(e.t, dst=dst, async_op=True)
            reduced = reduce_model("sum", e.model, world)
            e.model = [reduced if r == dst else e.model[r] for r in range(world)]  # the others unchanged (its doc)
            e.bound *= world
            note = f"dst {dst} on {e.t.numel()}"
            remember(e)
        else:
            work = ringzero.barrier(async_op=True)
        calls.append(f"{step}: {kind} {dtype} {note}")
        if work is not None:
            pending.append(work)
        if mine.random() < 0.3:
            wait_some()
        if shared.random() < 0.08:
            check_all()
    check_all()
    return len(calls)


@pytest.mark.parametrize("hosts", LAYOUTS)
def test_random_ringzero_calls_give_the_sequential_results(hosts):
    seed = int(os.environ.get("RINGZERO_FUZZ_SEED") or random.randrange(1 << 31))
    n_ops = int(os.environ.get("RINGZERO_FUZZ_OPS", "120"))
    print(f"test_backend_fuzz (ringzero.*): hosts {hosts}, seed {seed} (RINGZERO_FUZZ_SEED={seed} repeats it), "
          f"{n_ops} calls")
    counts = run_ranks(len(hosts.split(",")), fuzz_api, seed, n_ops, env={"RINGZERO_HOST_IDS": hosts}, timeout_s=400)
    assert counts == [n_ops] * len(counts), (seed, counts)
