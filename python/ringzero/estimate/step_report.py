"""`ringzero estimate`'s step-time part: its flags, the breakdown table and the `--json` record."""
from __future__ import annotations

import argparse

from .core import Estimate
from .gpus import GPU_KINDS, gpu_kind
from .report import fmt_bytes, fmt_time
from .step_time import Overlap, StepTime, step_time


def _overlap(args) -> Overlap:
    return Overlap(dp=args.overlap_dp, tp=args.overlap_tp, pp=args.overlap_pp, ep=args.overlap_ep)


def _gpu(args, cluster_name: str):
    if args.gpu is None and cluster_name.split("x")[-1].upper() not in GPU_KINDS:
        raise ValueError(f"a custom cluster needs --gpu (one of {', '.join(GPU_KINDS)}) for the step time")
    return gpu_kind(args.gpu or cluster_name, gemm_fraction=args.gemm_fraction, memory_fraction=args.memory_fraction)


def add_step_arguments(p: argparse.ArgumentParser) -> None:
    """The step-time flags (a group of their own) and --json."""
    g = p.add_argument_group("step time (with --cluster, a model shape and --batch)")
    g.add_argument("--gpu", help=f"GPU kind, one of {', '.join(GPU_KINDS)} (default: the --cluster preset's)")
    g.add_argument("--gemm-fraction", type=float, help="fraction of the GPU's peak large GEMMs reach (default: the "
                   "kind's, estimate/gpus.py)")
    g.add_argument("--memory-fraction", type=float, help="fraction of HBM bandwidth elementwise kernels reach")
    for name, what in (("dp", "data-parallel gradient reduction and gathers"), ("tp", "tensor-parallel collectives"),
                       ("pp", "messages between pipeline stages"), ("ep", "expert-parallel all-to-alls")):
        g.add_argument(f"--overlap-{name}", type=float, default=0.0, metavar="FRACTION",
                       help=f"share of the {what} hidden behind compute (default 0)")
    g.add_argument("--virtual-stages", type=int, default=1, help="model chunks per pipeline rank of --schedule "
                   "interleaved (default 1)")
    g.add_argument("--search", nargs="?", const="", metavar="BATCHES", help="rank the layouts (tp, pp, dp, micro-batch, "
                   "schedule, ZeRO stage, recomputation) that fit --cluster's memory per GPU by predicted step time, "
                   "for --batch or each of BATCHES (comma-separated global batches)")
    p.add_argument("--json", action="store_true", help="print one JSON object (memory, communication and step "
                   "time per strategy) instead of the tables")


def step_for(est: Estimate, args) -> StepTime | None:
    """The step time of `est` when it can be had (a shape, a batch, a cluster and its GPU kind), else None (with
    a note when only --gpu is missing). ValueError for a bad flag (an unknown --gpu, a fraction outside [0, 1])."""
    overlap = _overlap(args)
    if est.model is None or est.micro_batch is None or est.cluster is None:
        return None
    if args.gpu is None and est.cluster.name.split("x")[-1].upper() not in GPU_KINDS:
        est.notes.append(f"step time not computed: a custom cluster needs --gpu ({', '.join(GPU_KINDS)})")
        return None
    return step_time(est, _gpu(args, est.cluster.name), overlap)


def search_report(args, model, precision, cluster, world: int) -> str:
    """`--search`: the best layouts for each batch (search.py), as text or, with --json, one JSON list."""
    from .model import ModelShape
    from .search import search, search_lines

    if not isinstance(model, ModelShape):
        raise ValueError("--search needs the model's shape (--layers ... / --model / --hf-config), not --params")
    if cluster is None or not cluster.gpu_mem_bytes:
        raise ValueError("--search needs --cluster (its links and memory per GPU; --gpu-mem-gb to change the memory)")
    text = args.search or (str(args.batch) if args.batch is not None else "")
    try:
        batches = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise ValueError(f"--search {args.search!r}: give global batches as integers, e.g. 512,1024") from None
    if not batches or min(batches) < 1:
        raise ValueError("--search needs a global batch: --batch N or --search N[,N...]")
    gpu, out, records = _gpu(args, cluster.name), [], []
    for batch in batches:
        result = search(model, batch, precision, cluster, gpu, world, cluster.gpu_mem_bytes, overlap=_overlap(args))
        out.append("\n".join(search_lines(result, cluster.gpu_mem_bytes, batch)))
        records.append({"batch": batch, "tried": result.tried, "rejected": dict(result.rejected),
                        "best": [{"layout": c.describe(), "memory_bytes": c.memory_bytes, **c.step.as_dict()}
                                 for c in result.best]})
    if args.json:
        import json

        return json.dumps(records, indent=1)
    return "\n\n".join(out) + "\n(predictions of the step-time model; docs/estimate.md says how far to trust them)"


def step_lines(st: StepTime) -> list[str]:
    """The headline numbers and the breakdown, one row per term on the critical path or hidden."""
    lines = [f"step time on {st.gpu.describe()}",
             f"  step {fmt_time(st.step_s)}, {st.tokens_per_s:,.0f} tokens/s, {st.tflops_per_gpu:.1f} TFLOP/s per GPU "
             f"(model FLOPs; {st.hardware_tflops_per_gpu:.1f} with recomputation), MFU {st.mfu:.1%}",
             f"  {'term':<72} {'time':>10} {'share':>6} {'hidden':>10}  note"]
    for t in st.terms:
        lines.append(f"  {t.name:<72} {fmt_time(t.seconds):>10} {t.seconds / st.step_s:>6.1%} "
                     f"{fmt_time(t.hidden_s) if t.hidden_s else '-':>10}  {t.note}".rstrip())
    lines.append("  (a prediction: estimate/gpus.py states the constants, docs/estimate.md the published runs it "
                 "was compared with)")
    return lines


def summary_line(est: Estimate, st: StepTime | None) -> str:
    """One row of the per-strategy step summary."""
    if st is None:
        return f"{est.plan.strategy:<10} -"
    return (f"{est.plan.strategy:<10} {fmt_time(st.step_s):>10} {st.tokens_per_s:>14,.0f} {st.tflops_per_gpu:>8.1f} "
            f"{st.mfu:>6.1%} {fmt_bytes(est.total_bytes):>10}")


def json_record(est: Estimate, st: StepTime | None) -> dict:
    """What `--json` prints for one strategy: the plan, memory of the fullest GPU, collectives, step time."""
    plan = est.plan
    return {
        "strategy": plan.strategy, "world": plan.world, "dp": plan.dp, "tp": plan.tp, "pp": plan.pp, "ep": plan.ep,
        "microbatches": plan.microbatches, "micro_batch": est.micro_batch, "schedule": plan.schedule,
        "virtual_stages": plan.virtual_stages, "recompute": plan.recompute,
        "memory_bytes": {"params": est.params_bytes, "grads": est.grads_bytes, "optimizer": est.optimizer_bytes,
                         "activations": est.activation_bytes, "total": est.total_bytes},
        "collectives": [{"what": c.what, "op": c.op, "group": c.group, "group_size": c.group_size,
                         "nbytes": c.nbytes, "calls": c.calls, "times_s": c.times_s} for c in est.collectives],
        "step": st.as_dict() if st is not None else None,
        "notes": est.notes,
    }
