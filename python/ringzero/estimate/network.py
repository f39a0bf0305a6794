"""Clusters and the alpha-beta cost of collectives on them.

A step of an algorithm costs alpha (latency) plus the bytes one rank sends in it over its link's
bandwidth B (per direction, per GPU); a collective is its steps in sequence:

  ring all-reduce         2(n-1) alpha + 2(n-1)/n M/B     reduce-scatter then all-gather, M/n per step
  ring reduce-scatter,    (n-1) alpha + (n-1)/n M/B
    ring all-gather
  one-shot all-reduce     alpha + (n-1) M/B               every rank reads every peer's whole buffer
  one-shot reduce-scatter alpha + (n-1)/n M/B             every rank reads its 1/n from every peer
    / all-gather
  two-shot all-reduce     2 alpha + 2(n-1)/n M/B          one-shot reduce-scatter, one-shot all-gather
  hierarchical            ring inside each node (n_local ranks, intra link) on M, ring across the nodes
                          on M/n_local, ring inside each node again; the n_local cross-node rings run at
                          once and share the node's NICs: each gets B * min(1, nics_per_node / n_local)
                          (GPU nodes: one NIC per GPU; CPU hosts: usually one NIC for all their ranks)
  pipelined hierarchical  (Cluster.pipeline_segment_bytes set: ringzero's CPU path) the same steps on
                          k = M / segment segments at once: the in-node steps (one thread) and the
                          cross-node step (the link) overlap, so the slower of the two runs throughout and
                          the other adds one segment's worth: max(a, b) + min(a, b) / k; where the
                          host's cores move fewer bytes than its NICs (Cluster.host_bytes_per_s), they
                          cap the cross-node rate and the steps run one after another on them

  pairwise all-to-all      (n-1) alpha + (n-1)/n M/B       every pair directly (the flat form; gloo's and NCCL's):
                          n-1 blocks of M/n leave each rank; across nodes at the slower link, the n_local
                          ranks of a node crossing at once and sharing its NICs
  one-shot all-to-all     alpha + (n-1)/n M/B             inside a node: every rank reads its blocks from its peers
  hierarchical all-to-all max((N-1) n_local alpha_inter + (N-1)/N M/B_inter',  alpha_intra + (n_local-1)/n M/B_intra)
                          N nodes: every pair on two nodes exchanges directly (each byte crosses once), the
                          node's n_local ranks sharing its NICs (B_inter' = cross_link(n_local)), while a
                          one-shot all-to-all in the node moves the node's own blocks (n_local/n of M)
                          (ringzero's comm/exchange.py all_to_all_direct_across)

M is the whole buffer as nccl-tests counts it (all-reduce: the tensor; reduce-scatter: the input;
all-gather: the output; all-to-all: what one rank sends, its own block included). One-shot and two-shot need every peer's memory (NVLink/NVSwitch, shared
memory), so they apply only inside a node; across nodes a flat ring runs at the slower link.
"""
from __future__ import annotations

import dataclasses
import math
import re

from .checks import positive_ints

OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv")
ALGORITHMS = ("ring", "one-shot", "two-shot", "hierarchical")

# Latency per algorithm step: assumed values (a few microseconds, the order of NCCL's own latency
# constants for NVLink and InfiniBand), not vendor specifications. Override with --latency-us.
INTRA_LATENCY_US = 2.0
INTER_LATENCY_US = 5.0


@dataclasses.dataclass(frozen=True)
class Link:
    """One GPU's connection of one kind: bandwidth per direction and latency per algorithm step."""

    bytes_per_s: float
    latency_s: float

    def __post_init__(self):
        if not (self.bytes_per_s > 0 and math.isfinite(self.bytes_per_s)):
            raise ValueError(f"link bandwidth must be a positive number, got {self.bytes_per_s!r}")
        if not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise ValueError(f"link latency must be a number >= 0, got {self.latency_s!r}")


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Nodes of gpus_per_node GPUs (or ranks): an intra-node link (NVLink/NVSwitch, shared memory) and
    nics_per_node NICs between nodes (None: one per GPU), `inter` being one NIC. gpu_mem_bytes (None if
    unknown) is what one GPU holds."""

    name: str
    gpus_per_node: int
    intra: Link
    inter: Link
    gpu_mem_bytes: int | None = None
    nics_per_node: int | None = None
    pipeline_segment_bytes: int | None = None
    """The hierarchical collectives pipeline their in-node and cross-node steps over segments of this many
    bytes of M (ringzero's CPU path across hosts, comm/transports.py); None: the steps run one after
    another."""
    host_bytes_per_s: float | None = None
    """What a CPU host's cores can move of a collective's cross-node step per direction, all its ranks
    together, where that is less than its NICs (None: the NICs limit). Then the cores, not the link, set
    the cross-node time, and the in-node steps, which need the same cores, no longer overlap it ([Note:
    where the cores set the time])."""

    @property
    def cores_bound(self) -> bool:
        nics = self.gpus_per_node if self.nics_per_node is None else self.nics_per_node
        return self.host_bytes_per_s is not None and self.host_bytes_per_s < nics * self.inter.bytes_per_s

    def __post_init__(self):
        positive_ints("--", **{"gpus-per-node": self.gpus_per_node})
        if self.nics_per_node is not None:
            positive_ints("--", **{"nics-per-node": self.nics_per_node})

    def cross_link(self, concurrent: int) -> Link:
        """What each of `concurrent` streams leaving a node at once gets of its NICs."""
        nics = self.gpus_per_node if self.nics_per_node is None else self.nics_per_node
        rate = self.inter.bytes_per_s * min(1.0, nics / concurrent)
        if self.host_bytes_per_s is not None:
            rate = min(rate, self.host_bytes_per_s / concurrent)
        return Link(rate, self.inter.latency_s)

    def describe(self) -> str:
        mem = f", {self.gpu_mem_bytes / 1e9:.0f} GB per GPU" if self.gpu_mem_bytes else ""
        nic = "GPU" if self.nics_per_node is None else f"NIC, {self.nics_per_node} per node"
        return (f"{self.name}: {self.gpus_per_node} GPUs per node; intra-node {self.intra.bytes_per_s / 1e9:.0f} GB/s "
                f"per direction, {self.intra.latency_s * 1e6:.1f} us; inter-node {self.inter.bytes_per_s / 1e9:.1f} GB/s "
                f"per {nic} per direction ({self.inter.bytes_per_s * 8 / 1e9:.0f} Gb/s), "
                f"{self.inter.latency_s * 1e6:.1f} us{mem}")


def _preset(name, intra_GBps, inter_Gbps, mem_GB):
    return Cluster(name, 8, Link(intra_GBps * 1e9, INTRA_LATENCY_US * 1e-6),
                   Link(inter_Gbps / 8 * 1e9, INTER_LATENCY_US * 1e-6), int(mem_GB * 1e9))


# Eight-GPU nodes as NVIDIA's public datasheets describe them (bidirectional NVLink figures halved to
# per direction; one InfiniBand NIC per GPU):
PRESETS = {
    # H100 SXM5: NVLink 4 at 900 GB/s per GPU; 80 GB HBM3. DGX H100: eight 400 Gb/s ConnectX-7 NICs.
    "H100": _preset("H100", 450, 400, 80),
    # H200 SXM: NVLink 4 at 900 GB/s; 141 GB HBM3e. DGX H200: eight 400 Gb/s ConnectX-7 NICs.
    "H200": _preset("H200", 450, 400, 141),
    # A100 SXM4 80GB: NVLink 3 at 600 GB/s; 80 GB HBM2e. DGX A100: eight 200 Gb/s ConnectX-6 HDR NICs.
    "A100": _preset("A100", 300, 200, 80),
    # B200: NVLink 5 at 1.8 TB/s per GPU; DGX B200: 1,440 GB over 8 GPUs, eight 400 Gb/s ConnectX-7 NICs.
    "B200": _preset("B200", 900, 400, 180),
}


def parse_cluster(text: str) -> tuple[Cluster, int | None]:
    """'8xH100' -> (the H100 preset, world 8); 'H100' -> (preset, None). Fewer GPUs than a node make
    one smaller node; more must fill whole nodes."""
    m = re.fullmatch(r"\s*(?:(\d+)\s*[xX]\s*)?([A-Za-z][A-Za-z0-9]*)\s*", str(text))
    name = m.group(2).upper() if m else None
    if name not in PRESETS:
        raise ValueError(f"--cluster {text!r}: use COUNTxNAME or NAME with NAME one of {', '.join(PRESETS)} "
                         f"(e.g. 8xH100, 64xH100), or give --intra-gbps/--inter-gbps/--latency-us")
    preset = PRESETS[name]
    if m.group(1) is None:
        return preset, None
    count = int(m.group(1))
    if count < 1:
        raise ValueError(f"--cluster {text!r}: the GPU count must be at least 1")
    if count < preset.gpus_per_node:
        return dataclasses.replace(preset, name=f"{count}x{name}", gpus_per_node=count), count
    if count % preset.gpus_per_node:
        raise ValueError(f"--cluster {text!r}: {count} GPUs do not fill whole {preset.gpus_per_node}-GPU nodes; "
                         f"use a multiple of {preset.gpus_per_node} or at most {preset.gpus_per_node}")
    return dataclasses.replace(preset, name=f"{count}x{name}"), count


def custom_cluster(intra_gbps: float, inter_gbps: float, latency_us: float, gpus_per_node: int = 8,
                   gpu_mem_gb: float | None = None, nics_per_node: int | None = None) -> Cluster:
    """A cluster from link speeds in gigabits per second per direction (intra: per GPU; inter: per NIC,
    nics_per_node of them, default one per GPU) and one step latency."""
    for name, v in (("--intra-gbps", intra_gbps), ("--inter-gbps", inter_gbps)):
        if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
            raise ValueError(f"{name} must be a positive number of gigabits per second, got {v!r}")
    if not (isinstance(latency_us, (int, float)) and latency_us >= 0 and math.isfinite(latency_us)):
        raise ValueError(f"--latency-us must be a number >= 0, got {latency_us!r}")
    mem = None
    if gpu_mem_gb is not None:
        if not (gpu_mem_gb > 0 and math.isfinite(gpu_mem_gb)):
            raise ValueError(f"--gpu-mem-gb must be a positive number, got {gpu_mem_gb!r}")
        mem = int(gpu_mem_gb * 1e9)
    return Cluster("custom", gpus_per_node, Link(intra_gbps / 8 * 1e9, latency_us * 1e-6),
                   Link(inter_gbps / 8 * 1e9, latency_us * 1e-6), mem, nics_per_node)


@dataclasses.dataclass(frozen=True)
class GroupShape:
    """Where a group's ranks live: n ranks over `nodes` nodes, `local` per node (0 when uneven). siblings: groups
    of this shape whose collectives leave each node at the same time and share its NICs (ZeRO++'s cross-host
    groups: one per local rank, all gathering or exchanging at once)."""

    n: int
    nodes: int
    local: int
    siblings: int = 1


def group_shape(ranks: list[int], gpus_per_node: int) -> GroupShape:
    """The node layout of a group of global ranks (node = rank // gpus_per_node)."""
    per_node: dict[int, int] = {}
    for r in ranks:
        per_node[r // gpus_per_node] = per_node.get(r // gpus_per_node, 0) + 1
    counts = set(per_node.values())
    return GroupShape(len(ranks), len(per_node), counts.pop() if len(counts) == 1 else 0)


def _ring(op: str, nbytes: float, n: int, link: Link) -> float:
    if n == 1:
        return 0.0
    steps = (2 if op == "all_reduce" else 1) * (n - 1)
    return steps * (link.latency_s + nbytes / n / link.bytes_per_s)


def _one_shot(op: str, nbytes: float, n: int, link: Link) -> float:
    if n == 1:
        return 0.0
    received = (n - 1) * nbytes if op == "all_reduce" else (n - 1) * nbytes / n
    return link.latency_s + received / link.bytes_per_s


def _two_shot(nbytes: float, n: int, link: Link) -> float:
    if n == 1:
        return 0.0
    return 2 * (link.latency_s + (n - 1) * nbytes / n / link.bytes_per_s)


# [Note: where the cores set the time] A CPU host whose cores cannot drive its NICs (the lab's 2 cores
# running 2 hosts x 2 ranks and both hosts' network stacks at 10 Gbit/s: a cross-host step alone moves 5-7
# of the 9.6 Gbit/s TCP goodput with the cores 79-100% busy) runs its in-host steps and its cross-host
# steps on the same cores, so pipelining cannot overlap them: the time is their sum, the cross-host step
# at host_bytes_per_s. That rate is what the cores move of that collective's own cross-host step (its
# TCP traffic, its reductions, its posts), which is below what they move of bare point-to-point traffic:
# a reduce-scatter's cross-host step took 1.3-1.5x the bare link's time for its bytes
# (benchmarks/hostlab_bench.py measures both; RESULTS.md, issue 36).
def _hierarchical(op: str, nbytes: float, shape: GroupShape, cluster: Cluster) -> float:
    inside, across = shape.local, shape.nodes
    if op == "all_reduce":
        in_node = _ring("reduce_scatter", nbytes, inside, cluster.intra) + _ring("all_gather", nbytes, inside,
                                                                                  cluster.intra)
        cross = _ring("all_reduce", nbytes / inside, across, cluster.cross_link(inside))
    else:  # reduce-scatter: inside the node first, then across on the node's 1/local piece; all-gather mirrors it.
        in_node = _ring(op, nbytes, inside, cluster.intra)
        cross = _ring(op, nbytes / inside, across, cluster.cross_link(inside))
    segments = int(nbytes // cluster.pipeline_segment_bytes) if cluster.pipeline_segment_bytes else 0
    if segments < 2 or cluster.cores_bound:  # ringzero pipelines from two whole segments up
        return in_node + cross
    return max(in_node, cross) + min(in_node, cross) / segments


def _pairwise_all_to_all(nbytes: float, n: int, link: Link) -> float:
    """n - 1 exchanges of nbytes / n, one per peer, each paying the link's latency."""
    if n == 1:
        return 0.0
    return (n - 1) * (link.latency_s + nbytes / n / link.bytes_per_s)


def _hierarchical_all_to_all(nbytes: float, shape: GroupShape, cluster: Cluster) -> float:
    """ringzero's form across nodes (comm/exchange.py all_to_all_direct_across): every pair on two nodes
    exchanges directly, (N-1) * local messages of M/n per rank with the node's NICs shared by its local *
    siblings streams, while a one-shot all-to-all in the node moves the node's own blocks (local/n of each
    rank's buffer) over the intra link: the slower of the two."""
    across, inside = shape.nodes, shape.local
    cross_link = cluster.cross_link(inside * shape.siblings)
    cross = (across - 1) * inside * cross_link.latency_s + (across - 1) / across * nbytes / cross_link.bytes_per_s
    return max(cross, _one_shot("all_to_all", nbytes * inside / (across * inside), inside, cluster.intra))


def _all_to_all_times(nbytes: float, shape: GroupShape, cluster: Cluster) -> dict[str, float]:
    """The all-to-all's algorithms for this group. The pairwise form is reported under 'ring' (the
    column of the flat, step-by-step algorithm; send_recv does the same) so dense reports keep their
    columns. Across nodes every local rank sends over the NICs at once, unlike a ring's one stream per
    node boundary: the flat form's link is shared by local * siblings streams (one when uneven)."""
    if shape.nodes == 1:
        return {"ring": _pairwise_all_to_all(nbytes, shape.n, cluster.intra),
                "one-shot": _one_shot("all_to_all", nbytes, shape.n, cluster.intra)}
    shared = cluster.cross_link(max(1, shape.local) * shape.siblings)
    slow = Link(min(cluster.intra.bytes_per_s, shared.bytes_per_s), max(cluster.intra.latency_s, shared.latency_s))
    times = {"ring": _pairwise_all_to_all(nbytes, shape.n, slow)}
    if shape.local > 1:
        times["hierarchical"] = _hierarchical_all_to_all(nbytes, shape, cluster)
    return times


def collective_times(op: str, nbytes: float, shape: GroupShape, cluster: Cluster) -> dict[str, float]:
    """Seconds of one call of `op` on an nbytes buffer for each algorithm that applies to this group
    (missing keys do not apply). send_recv is one point-to-point message, reported as 'ring'."""
    if op not in OPS:
        raise ValueError(f"op={op!r}: use one of {OPS}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    n = shape.n
    # Across nodes a flat algorithm runs at the slower link; the node's NICs (and cores) are shared among the
    # sibling groups that cross at once (Cluster.cross_link).
    slow = Link(min(cluster.intra.bytes_per_s, cluster.cross_link(shape.siblings).bytes_per_s),
                max(cluster.intra.latency_s, cluster.inter.latency_s))
    if op == "all_to_all":
        return _all_to_all_times(nbytes, shape, cluster)
    if shape.nodes == 1:
        link = cluster.intra
        if op == "send_recv":
            return {"ring": link.latency_s + nbytes / link.bytes_per_s}
        times = {"ring": _ring(op, nbytes, n, link), "one-shot": _one_shot(op, nbytes, n, link)}
        if op == "all_reduce":
            times["two-shot"] = _two_shot(nbytes, n, link)
        return times
    if op == "send_recv":
        return {"ring": slow.latency_s + nbytes / slow.bytes_per_s}
    times = {"ring": _ring(op, nbytes, n, slow)}
    if shape.local > 1:
        times["hierarchical"] = _hierarchical(op, nbytes, shape, cluster)
    return times


def sent_per_rank(op: str, nbytes: float, n: int) -> float:
    """Bytes one rank sends in the ring (bandwidth-optimal) algorithm: what every algorithm but the
    one-shot all-reduce must at least move (nccl-tests' bus-bandwidth factor times M)."""
    if op == "send_recv":
        return nbytes
    factor = {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_gather": (n - 1) / n,
              "all_to_all": (n - 1) / n}[op]
    return factor * nbytes
