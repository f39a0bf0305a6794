"""The estimator's alpha-beta times against a step-by-step simulation of each algorithm.

The reference runs ring, one-shot, two-shot and hierarchical all-reduce, reduce-scatter and all-gather
on real numpy buffers of n ranks (checking the reduced result against a plain sum), and times every
step as alpha of its slowest link plus the bytes the busiest rank receives over that link's bandwidth.
It shares no code with ringzero.estimate.network, which uses closed forms. Also: nccl-tests' bus
bandwidth (algbw x 2(n-1)/n for all-reduce) equals the link bandwidth when alpha is 0, and the ZeRO
paper's volumes (ZeRO-1/2 as much as DDP, ZeRO-3 1.5 times).
"""
import numpy as np
import pytest

from ringzero.estimate import Cluster, GroupShape, Link, Plan, Precision, collective_times, estimate, parse_cluster

INTRA = Link(bytes_per_s=300e9, latency_s=2e-6)
INTER = Link(bytes_per_s=25e9, latency_s=7e-6)
ITEM = 8  # float64 elements in the simulation


class Sim:
    """n ranks with a buffer each; step() moves chunks all at once and adds up the step's time."""

    def __init__(self, bufs, local):
        self.bufs, self.local, self.t = bufs, local, 0.0

    def step(self, moves):
        """moves: (src, dst, src_slice, dst_slice, add) done simultaneously."""
        data = [(dst, dsl, self.bufs[src][ssl].copy(), add, src) for src, dst, ssl, dsl, add in moves]
        worst = 0.0
        for rank in {m[0] for m in data}:
            incoming = [m for m in data if m[0] == rank]
            links = [INTRA if m[4] // self.local == rank // self.local else INTER for m in incoming]
            nbytes = sum(m[2].size * ITEM for m in incoming)
            worst = max(worst, max(lk.latency_s for lk in links) + nbytes / min(lk.bytes_per_s for lk in links))
        for dst, dsl, chunk, add, _ in data:
            if add:
                self.bufs[dst][dsl] += chunk
            else:
                self.bufs[dst][dsl] = chunk
        self.t += worst


def chunks(lo, hi, n):
    c = (hi - lo) // n
    return [slice(lo + i * c, lo + (i + 1) * c) for i in range(n)]


def ring_steps(group, lo, hi, phase):
    """Steps of a ring reduce-scatter ('rs': rank i ends owning chunk i+1) or all-gather ('ag')."""
    n, ch = len(group), chunks(lo, hi, len(group))
    for t in range(n - 1):
        shift = -t if phase == "rs" else 1 - t
        yield [(group[i], group[(i + 1) % n], ch[(i + shift) % n], ch[(i + shift) % n], phase == "rs")
               for i in range(n)]


def run_parallel(sim, step_lists):
    """Runs several groups' step sequences side by side (their steps overlap in time)."""
    for steps in zip(*step_lists):
        sim.step([m for s in steps for m in s])


def simulate(op, algo, n, local, count):
    rng = np.random.default_rng(n * 100 + local)
    inputs = [rng.standard_normal(count) for _ in range(n)]
    sim = Sim([x.copy() for x in inputs], local)
    ranks, nodes = list(range(n)), n // local
    if algo == "ring":
        if op in ("all_reduce", "reduce_scatter"):
            run_parallel(sim, [ring_steps(ranks, 0, count, "rs")])
        if op == "all_gather":
            run_parallel(sim, [ring_steps(ranks, 0, count, "ag")])
        if op == "all_reduce":
            run_parallel(sim, [ring_steps(ranks, 0, count, "ag")])
    elif algo == "one-shot":
        ch = chunks(0, count, n)
        if op == "all_reduce":  # every rank reads every peer's whole buffer
            sim.step([(s, d, slice(0, count), slice(0, count), True) for d in ranks for s in ranks if s != d])
        else:
            add = op == "reduce_scatter"
            sim.step([(s, d, ch[d if add else s], ch[d if add else s], add) for d in ranks for s in ranks if s != d])
    elif algo == "two-shot":
        ch = chunks(0, count, n)
        sim.step([(s, d, ch[d], ch[d], True) for d in ranks for s in ranks if s != d])
        sim.step([(s, d, ch[s], ch[s], False) for d in ranks for s in ranks if s != d])
    else:  # hierarchical: inside each node on the whole buffer, across nodes on the node's 1/local piece
        node_groups = [list(range(k * local, (k + 1) * local)) for k in range(nodes)]
        piece = chunks(0, count, local)
        owned = lambda i: piece[(i + 1) % local]  # noqa: E731  (ring reduce-scatter ownership)
        cross = [[k * local + i for k in range(nodes)] for i in range(local)]
        if op in ("all_reduce", "reduce_scatter"):
            run_parallel(sim, [ring_steps(g, 0, count, "rs") for g in node_groups])
            run_parallel(sim, [ring_steps(c, owned(i).start, owned(i).stop, "rs") for i, c in enumerate(cross)])
        if op == "all_reduce":
            run_parallel(sim, [ring_steps(c, owned(i).start, owned(i).stop, "ag") for i, c in enumerate(cross)])
        if op in ("all_reduce", "all_gather"):
            if op == "all_gather":
                run_parallel(sim, [ring_steps(c, owned(i).start, owned(i).stop, "ag") for i, c in enumerate(cross)])
            run_parallel(sim, [ring_steps(g, 0, count, "ag") for g in node_groups])
    total = sum(inputs)
    if op == "all_reduce":
        for b in sim.bufs:
            np.testing.assert_allclose(b, total, rtol=1e-10, atol=1e-10)
    return sim.t


CASES = [(n, n) for n in (2, 3, 4, 5)] + [(4, 2), (6, 3), (6, 2), (8, 4)]


@pytest.mark.parametrize("n,local", CASES)
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
def test_closed_forms_match_simulation(n, local, op):
    count = n * n * local * 6  # divisible by every chunking the algorithms use
    cluster = Cluster("test", local, INTRA, INTER)
    shape = GroupShape(n=n, nodes=n // local, local=local)
    times = collective_times(op, count * ITEM, shape, cluster)
    expected_algos = {"ring"} | ({"one-shot"} if n == local else {"hierarchical"}) | (
        {"two-shot"} if n == local and op == "all_reduce" else set())
    assert set(times) == expected_algos
    for algo, t in times.items():
        ref = simulate(op, algo, n, local, count)
        assert t == pytest.approx(ref, rel=1e-12), (algo, t, ref)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_ring_bus_bandwidth_is_the_link_bandwidth_without_latency(n):
    link = Link(bytes_per_s=123e9, latency_s=0.0)
    cluster = Cluster("test", 8, link, link)
    nbytes = 2**26
    t = collective_times("all_reduce", nbytes, GroupShape(n, 1, n), cluster)["ring"]
    assert nbytes / t * 2 * (n - 1) / n == pytest.approx(123e9, rel=1e-12)
    t = collective_times("all_gather", nbytes, GroupShape(n, 1, n), cluster)["ring"]
    assert nbytes / t * (n - 1) / n == pytest.approx(123e9, rel=1e-12)


def test_world_of_one_costs_nothing():
    cluster = parse_cluster("8xH100")[0]
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        assert set(collective_times(op, 1e6, GroupShape(1, 1, 1), cluster).values()) == {0.0}
    assert estimate(1000, plan=Plan("ddp", world=1), cluster=cluster).collectives == []


@pytest.mark.parametrize("world", [2, 3, 5, 64])
def test_zero_paper_communication_volumes(world):
    """ZeRO paper section 7: stages 1 and 2 move what DDP moves (2 x params); stage 3 moves 1.5 times that."""
    prec = Precision.for_dtype("bfloat16")
    sent = {s: estimate(10**9 + 7, precision=prec, plan=Plan(s, world=world)).sent_per_rank
            for s in ("ddp", "zero1", "zero2", "zero3")}
    assert sent["ddp"] == pytest.approx(2 * (world - 1) / world * 2 * (10**9 + 7))
    assert sent["zero1"] == pytest.approx(sent["ddp"]) and sent["zero2"] == pytest.approx(sent["ddp"])
    assert sent["zero3"] == pytest.approx(1.5 * sent["ddp"])


def test_cluster_presets_and_layout():
    cluster, world = parse_cluster("64xH100")
    assert world == 64 and cluster.gpus_per_node == 8 and cluster.gpu_mem_bytes == 80 * 10**9
    small, world = parse_cluster("3xa100")
    assert world == 3 and small.gpus_per_node == 3
    # Pipeline-major ranks: 4 stages x 16 dp ranks; each dp group spans 2 nodes, stage neighbours cross nodes.
    e = estimate(10**9, batch=None, precision=Precision(), plan=Plan("pp+zero1", world=64, pp=4), cluster=cluster)
    assert all("hierarchical" in c.times_s for c in e.collectives if c.group == "dp")


@pytest.mark.parametrize("nodes,local", [(2, 2), (3, 2), (2, 4)])
def test_hosts_with_one_nic_carry_every_cross_ring(nodes, local):
    """CPU hosts (nics_per_node=1): the local cross-node rings of the hierarchical all-reduce run at once
    through one NIC, so the node's link moves 2(N-1)/N of the whole buffer, not of its 1/local piece."""
    link = Link(bytes_per_s=1e9, latency_s=0.0)
    nbytes, n = 2**24, nodes * local
    shape = GroupShape(n, nodes, local)
    per_gpu = collective_times("all_reduce", nbytes, shape, Cluster("t", local, link, link))["hierarchical"]
    shared = collective_times("all_reduce", nbytes, shape, Cluster("t", local, link, link, nics_per_node=1))
    inside = per_gpu - 2 * (nodes - 1) / nodes * nbytes / local / 1e9
    assert shared["hierarchical"] == pytest.approx(inside + 2 * (nodes - 1) / nodes * nbytes / 1e9, rel=1e-12)
    # The flat ring crosses each node boundary once per direction: one NIC is enough for it.
    assert shared["ring"] == collective_times("all_reduce", nbytes, shape, Cluster("t", local, link, link))["ring"]


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
def test_pipelined_hierarchical_overlaps_its_steps(op):
    """ringzero's CPU path across hosts (Cluster.pipeline_segment_bytes): the in-node steps and the cross-node
    step overlap over k segments, so the time is the slower of the two plus one segment of the other; below
    two segments the steps run one after another, as without pipelining."""
    intra, inter = Link(bytes_per_s=2e9, latency_s=0.0), Link(bytes_per_s=125e6, latency_s=0.0)
    shape, nbytes = GroupShape(4, 2, 2), 2**24
    serial = Cluster("t", 2, intra, inter, nics_per_node=1)
    inside = collective_times(op, nbytes, GroupShape(2, 1, 2), Cluster("t", 2, intra, intra))["ring"]
    if op == "all_reduce":  # reduce-scatter then all-gather inside the node
        inside = 2 * collective_times("reduce_scatter", nbytes, GroupShape(2, 1, 2), Cluster("t", 2, intra, intra))["ring"]
    whole = collective_times(op, nbytes, shape, serial)["hierarchical"]
    cross = whole - inside
    piped = Cluster("t", 2, intra, inter, nics_per_node=1, pipeline_segment_bytes=nbytes // 4)
    assert collective_times(op, nbytes, shape, piped)["hierarchical"] == pytest.approx(cross + inside / 4, rel=1e-12)
    one = Cluster("t", 2, intra, inter, nics_per_node=1, pipeline_segment_bytes=nbytes)
    assert collective_times(op, nbytes, shape, one)["hierarchical"] == pytest.approx(whole, rel=1e-12)


def test_cores_slower_than_the_link_cap_it_and_end_the_overlap():
    """Cluster.host_bytes_per_s below the NICs: the cross-node rate is the cores', and the pipelined steps
    add up (the in-node steps need the same cores); above the NICs it changes nothing."""
    intra, inter = Link(bytes_per_s=2e9, latency_s=0.0), Link(bytes_per_s=1.25e9, latency_s=0.0)
    shape, nbytes = GroupShape(4, 2, 2), 2**24
    slow = Cluster("t", 2, intra, Link(bytes_per_s=0.5e9, latency_s=0.0), nics_per_node=1)
    capped = Cluster("t", 2, intra, inter, nics_per_node=1, pipeline_segment_bytes=nbytes // 4, host_bytes_per_s=0.5e9)
    got = collective_times("all_reduce", nbytes, shape, capped)["hierarchical"]
    assert got == pytest.approx(collective_times("all_reduce", nbytes, shape, slow)["hierarchical"], rel=1e-12)
    fast = Cluster("t", 2, intra, inter, nics_per_node=1, pipeline_segment_bytes=nbytes // 4, host_bytes_per_s=5e9)
    plain = Cluster("t", 2, intra, inter, nics_per_node=1, pipeline_segment_bytes=nbytes // 4)
    assert collective_times("all_reduce", nbytes, shape, fast) == collective_times("all_reduce", nbytes, shape, plain)
