"""`ringzero estimate --search`: the layouts of a model, a global batch and a cluster, ranked by predicted
step time among those that fit the memory per GPU, with a count of why the others fell out.

The space: tp among the divisors of a node's GPUs that split the heads and the MLP (sequence parallelism on
whenever tp > 1: the same bytes as Megatron's all-reduces, fewer activations and elementwise passes), pp among
the divisors of world / tp up to the layers, micro-batches of 1, 2, 4 or 8 sequences, the schedules (1F1B,
interleaved with 2 or 4 chunks, ZB-H1), ZeRO 0-2 (0-3 without a pipeline) and recomputation. Two shortcuts
keep it fast, each exact under the model: for a layout, recomputation only slows a step, so the least that
fits is taken; the schedule changes only the bubble (step_time.py), so the other schedules are priced from
the 1F1B estimate, their memory checked with an estimate of their own.
"""
from __future__ import annotations

import collections
import dataclasses

from .core import estimate
from .gpus import GpuKind
from .model import ModelShape
from .network import Cluster
from .plan import Plan, Precision
from .step_time import Overlap, StepTime, step_time

MICRO_BATCH_SIZES = (1, 2, 4, 8)
"""Sequences per micro-batch tried."""
INTERLEAVED_CHUNKS = (2, 4)
"""Virtual stages of the interleaved schedule, fewest first; the most that the layers allow is taken."""
RECOMPUTE_ORDER = ("none", "selective", "full")
"""Fastest first: the least recomputation that fits wins."""


@dataclasses.dataclass
class Candidate:
    """One layout that fits, with its prediction."""

    plan: Plan
    micro_batch: int
    step: StepTime
    memory_bytes: int

    def describe(self) -> str:
        p = self.plan
        chunks = f" v{p.virtual_stages}" if p.virtual_stages > 1 else ""
        return (f"tp {p.tp} pp {p.pp} dp {p.dp} mb {self.micro_batch} x {p.microbatches} {p.strategy} "
                f"{p.schedule if p.pp > 1 else ''}{chunks} recompute {p.recompute}").replace("  ", " ")


@dataclasses.dataclass
class SearchResult:
    """The best layouts (fastest first) and, by reason, how many layouts fell out."""

    best: list
    rejected: collections.Counter
    tried: int


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _strategies(pp: int) -> tuple:
    return ("pp", "pp+zero1", "pp+zero2") if pp > 1 else ("ddp", "zero1", "zero2", "zero3")


def search(shape: ModelShape, batch: int, precision: Precision, cluster: Cluster, gpu: GpuKind, world: int,
           memory_bytes: float, keep: int = 5, overlap: Overlap | None = None) -> SearchResult:
    """Every layout of `world` GPUs for `shape` and `batch` sequences per step whose fullest GPU holds at most
    memory_bytes, ranked by predicted step time; the `keep` fastest are returned."""
    rejected, fits, tried = collections.Counter(), [], 0
    for tp in _divisors(min(world, cluster.gpus_per_node)):
        if shape.n_head % tp or shape.kv % tp or shape.width % tp:
            rejected["tp does not split the heads or the MLP"] += 1
            continue
        for pp in _divisors(world // tp):
            if pp > shape.n_layer:
                continue
            dp = world // (tp * pp)
            if batch % dp:
                rejected["the batch does not split over the data-parallel ranks"] += 1
                continue
            for mb in MICRO_BATCH_SIZES:
                if (batch // dp) % mb:
                    continue
                m = batch // (dp * mb)
                for strategy in _strategies(pp):
                    tried += 1
                    found = _fastest_fit(shape, batch, precision, cluster, gpu, world, memory_bytes, overlap,
                                         Plan(strategy, world=world, pp=pp, tp=tp, microbatches=m,
                                              sequence_parallel=tp > 1), mb)
                    if isinstance(found, str):
                        rejected[found] += 1
                    else:
                        fits += found
    fits.sort(key=lambda c: c.step.step_s)
    return SearchResult(fits[:keep], rejected, tried)


def _fastest_fit(shape, batch, precision, cluster, gpu, world, memory_bytes, overlap, plan: Plan, mb: int):
    """The candidates of one layout (its schedules) with the least recomputation that fits, or the reason
    none fits."""
    for recompute in RECOMPUTE_ORDER:
        trial = dataclasses.replace(plan, recompute=recompute)
        est = estimate(shape, batch, precision, trial, cluster)
        if est.total_bytes <= memory_bytes:
            break
    else:
        return "over the memory per GPU even with full recomputation"
    base = step_time(est, gpu, overlap)
    found = [Candidate(trial, mb, base, est.total_bytes)]
    if trial.pp == 1:
        return found
    bubble = sum(t.seconds for t in base.terms if t.name.startswith("pipeline bubble"))
    # More chunks shorten the bubble and hold fewer extra micro-batches: only the most that fit the layers matter.
    chunks = [v for v in INTERLEAVED_CHUNKS if trial.microbatches % trial.pp == 0 and shape.n_layer >= trial.pp * v]
    options = [("zb-h1", 1, 1 / 3)] + [("interleaved", v, 1 / v) for v in chunks[-1:]]
    for schedule, v, share in options:
        other = dataclasses.replace(trial, schedule=schedule, virtual_stages=v)
        memory = estimate(shape, batch, precision, other).total_bytes if schedule == "interleaved" else est.total_bytes
        if memory > memory_bytes:
            continue
        priced = dataclasses.replace(base, step_s=base.step_s - bubble * (1 - share))
        found.append(Candidate(other, mb, priced, memory))
    return found


def search_lines(result: SearchResult, memory_bytes: float, batch: int) -> list[str]:
    """The table `--search` prints: the best layouts, then why the others fell out."""
    from .report import fmt_bytes, fmt_time

    lines = [f"best layouts for batch {batch} within {fmt_bytes(memory_bytes)} per GPU ({result.tried} layouts "
             "tried; schedules and recomputation within each)",
             f"  {'layout':<72} {'step':>10} {'tokens/s':>12} {'MFU':>6} {'memory':>10}"]
    for c in result.best:
        lines.append(f"  {c.describe():<72} {fmt_time(c.step.step_s):>10} "
                     f"{c.step.tokens_per_step / c.step.step_s:>12,.0f} "
                     f"{c.step.model_flops / c.step.step_s / c.step.world / c.step.gpu.peak_flops_per_s:>6.1%} "
                     f"{fmt_bytes(c.memory_bytes):>10}")
    if not result.best:
        lines.append("  nothing fits")
    lines.append("  fell out: " + ("; ".join(f"{n} x {why}" for why, n in result.rejected.most_common()) or "none")
                 + "; the rest were slower")
    return lines
