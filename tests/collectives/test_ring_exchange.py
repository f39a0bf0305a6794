"""The rings between hosts (comm/ring.py) on an in-process wire that reads a send's buffer as late as gloo may:
when the receiver waits for it, and no earlier. A member that writes a buffer before its send has completed
is caught (the last member reads late, so the others' writes come first). Two members summing exchange whole
buffers ([Note: two members exchange]); MIN/MAX, larger messages and three members keep the ring. Every result
is checked against the sum computed apart (float64, or integers) and bitwise across the members."""
import concurrent.futures
import random
import threading
import time

import pytest
import torch

from ringzero.comm import ring as ring_mod
from ringzero.comm.ring import P2PRing
from ringzero.comm.types import ReduceOp

SLICE_BYTES = 64  # 16 float32 per slice: the sizes below span many slices


class Wire:
    """Messages between in-process members, matched per (src, dst, tag) in posting order, as gloo's pairs."""

    def __init__(self):
        self.cv = threading.Condition()
        self.sent = {}  # (src, dst, tag) -> [SendWork], in posting order
        self.posted_recvs = {}  # (src, dst, tag) -> count of receives posted
        self.messages = {}  # src -> messages sent


class SendWork:
    def __init__(self, t):
        self.t = t  # not copied: the receiver reads it when it waits
        self.done = threading.Event()

    def wait(self, timeout=None):
        return self.done.wait(timeout.total_seconds() if timeout is not None else 30)


class RecvWork:
    def __init__(self, wire, key, index, t, delay_s):
        self.wire, self.key, self.index, self.t, self.delay_s = wire, key, index, t, delay_s

    def wait(self, timeout=None):
        limit = time.monotonic() + (timeout.total_seconds() if timeout is not None else 30)
        time.sleep(self.delay_s)
        with self.wire.cv:
            while len(self.wire.sent.get(self.key, [])) <= self.index:
                if not self.wire.cv.wait(max(0.0, limit - time.monotonic())):
                    return False
            send = self.wire.sent[self.key][self.index]
        self.t.copy_(send.t)  # the sender's bytes as they are now
        send.done.set()
        return True


class FakeLink:
    def __init__(self, wire, me, delay_s=0.0):
        self.wire, self.me, self.delay_s = wire, me, delay_s

    def isend(self, t, peer, tag):
        work = SendWork(t)
        with self.wire.cv:
            self.wire.sent.setdefault((self.me, peer, tag), []).append(work)
            self.wire.messages[self.me] = self.wire.messages.get(self.me, 0) + 1
            self.wire.cv.notify_all()
        return work

    def irecv(self, t, peer, tag):
        key = (peer, self.me, tag)
        with self.wire.cv:
            index = self.wire.posted_recvs.get(key, 0)
            self.wire.posted_recvs[key] = index + 1
        return RecvWork(self.wire, key, index, t, self.delay_s)


def run_ring(inputs, op=ReduceOp.SUM, divisor=1, split=False):
    """All-reduce of inputs[i] on member i (in place, on copies); returns (results, wire). The last member
    reads every message 5 ms late. split: through all_reduce_start / all_reduce_finish with two calls in
    flight at once, as the hierarchical pipeline runs them (halves of the buffer, tags 1 and 2)."""
    n = len(inputs)
    wire = Wire()
    rings = [P2PRing(None, list(range(n)), i, 30.0, SLICE_BYTES,
                     FakeLink(wire, i, 0.005 if i == n - 1 else 0.0)) for i in range(n)]
    outs = [x.clone() for x in inputs]

    def member(i):
        rings[i].begin("test all_reduce")
        if not split:
            rings[i].all_reduce(outs[i], op, divisor)
            return
        halves = outs[i].tensor_split(2)
        states = [rings[i].all_reduce_start(h, op, divisor, tag=1 + k) for k, h in enumerate(halves)]
        for s in states:
            rings[i].all_reduce_finish(s)

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        for f in [pool.submit(member, i) for i in range(n)]:
            f.result(timeout=60)
    return outs, wire


@pytest.mark.parametrize("numel", [0, 1, 2, 7, 16, 17, 31, 257, 1000])
@pytest.mark.parametrize("split", [False, True])
def test_two_members_sum_exchanges_and_matches_the_reference(numel, split):
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(numel, generator=g), torch.randn(numel, generator=g)
    (ra, rb), wire = run_ring([a, b], split=split)
    want = (a.double() + b.double()).float()  # one correctly rounded addition
    assert torch.equal(ra, want) and torch.equal(rb, want), f"seed {seed}"
    per = SLICE_BYTES // 4
    halves = [h.numel() for h in a.tensor_split(2)] if split else [numel]
    assert wire.messages.get(0, 0) == sum(-(-k // per) for k in halves)  # whole buffers, one pass


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float64, torch.bfloat16, torch.float16])
def test_two_members_sum_other_dtypes(dtype):
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        a, b = (torch.randn(101, generator=g).to(dtype) for _ in range(2))
        want = (a.float() + b.float()).to(dtype) if dtype != torch.float64 else a + b
    else:
        a, b = (torch.randint(-(1 << 30), 1 << 30, (101,), generator=g, dtype=dtype) for _ in range(2))
        want = a + b  # wraps alike in both
    (ra, rb), _ = run_ring([a, b])
    assert torch.equal(ra, rb), f"seed {seed}: the members differ"
    assert torch.equal(ra, want), f"seed {seed}"


def test_two_members_avg_divides_once():
    a = torch.arange(45, dtype=torch.float32)
    b = 3 * torch.arange(45, dtype=torch.float32) + 1
    (ra, rb), _ = run_ring([a, b], divisor=2)
    assert torch.equal(ra, (a + b) / 2) and torch.equal(rb, (a + b) / 2)


@pytest.mark.parametrize("op", [ReduceOp.MAX, ReduceOp.MIN])
def test_two_members_min_max_keep_the_ring(op):
    a = torch.tensor([1.0, float("nan"), 3.0, -2.0] * 10)
    b = torch.tensor([2.0, 5.0, float("nan"), -7.0] * 10)
    (ra, rb), wire = run_ring([a, b], op=op)
    assert torch.equal(ra.isnan(), rb.isnan()) and torch.equal(ra[~ra.isnan()], rb[~rb.isnan()])
    finite = ~(a.isnan() | b.isnan())
    want = torch.maximum(a, b) if op == ReduceOp.MAX else torch.minimum(a, b)
    assert torch.equal(ra[finite], want[finite])
    # The ring: each member sends one half, then the folded other half (20 floats = 2 slices each).
    assert wire.messages[0] == 4 and wire.messages[1] == 4


def test_two_members_above_the_bound_keep_the_ring(monkeypatch):
    monkeypatch.setattr(ring_mod, "EXCHANGE_MAX_BYTES", 64 * 4)
    a, b = torch.arange(200, dtype=torch.int64), torch.arange(200, dtype=torch.int64) * 7
    (ra, rb), wire = run_ring([a, b])
    assert torch.equal(ra, a + b) and torch.equal(rb, a + b)
    assert wire.messages[0] == 2 * -(-100 * 8 // SLICE_BYTES)  # two steps of half the buffer
    (ra, rb), wire = run_ring([a[:32], b[:32]])  # 256 bytes: at the bound, exchanged
    assert torch.equal(ra, a[:32] + b[:32]) and wire.messages[0] == 32 * 8 // SLICE_BYTES


@pytest.mark.parametrize("n", [3, 5])
@pytest.mark.parametrize("numel", [0, 1, 4, 37, 500])
def test_more_members_keep_the_ring(n, numel):
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randint(-1000, 1000, (numel,), generator=g, dtype=torch.int64) for _ in range(n)]
    outs, wire = run_ring(xs)
    want = torch.stack(xs).sum(0) if numel else torch.empty(0, dtype=torch.int64)
    for r in outs:
        assert torch.equal(r, want), f"seed {seed}"
