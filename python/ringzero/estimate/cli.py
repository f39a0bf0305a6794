"""`ringzero estimate`: memory per GPU, communication per step and collective times, from the command
line. Every check lives in the library (ValueError); here they become usage errors (exit status 2)."""
from __future__ import annotations

import argparse
import dataclasses
import math
import re

from .core import estimate, largest_model
from .model import ATTENTION_KINDS, RECOMPUTE_KINDS, ModelShape
from .network import PRESETS, custom_cluster, parse_cluster
from .presets import KNOWN_MODELS, known_model
from .plan import OPTIMIZER_STATES, SCHEDULES, STRATEGIES, Plan, Precision
from .report import fmt_bytes, fmt_count, full_report, summary_table
from .step_report import add_step_arguments, json_record, search_report, step_for, step_lines, summary_line

EXAMPLES = """examples:
  ringzero estimate --params 7.5B --dtype bfloat16 --world 64 --strategy ddp,zero1,zero2,zero3
  ringzero estimate --layers 48 --hidden 1600 --heads 25 --vocab 50257 --seq 1024 --tied --batch 32
  ringzero estimate --ringzero-gpt --batch 16 --strategy zero2 --world 2
  ringzero estimate --hf-config Meta-Llama-3-8B/config.json --seq 8192 --dtype bfloat16 --batch 8 --world 8 --strategy zero3
  ringzero estimate --params 70B --dtype bfloat16 --strategy zero3 --cluster 64xH100
  ringzero estimate --model mixtral-8x7b --seq 4096 --dtype bfloat16 --batch 64 --strategy zero1 --ep 8 --cluster 64xH100
  ringzero estimate --layers 96 --hidden 12288 --heads 96 --vocab 51200 --seq 2048 --dtype bfloat16 \\
      --strategy pp --world 64 --pp 8 --tp 8 --sequence-parallel --recompute selective --batch 1 --microbatches 1
  ringzero estimate --layers 32 --hidden 4096 --heads 32 --vocab 32000 --seq 4096 --dtype bfloat16 \\
      --strategy pp+zero1 --pp 4 --microbatches 8 --batch 256 --recompute selective --cluster 32xH100
  ringzero estimate --layers 96 --hidden 12288 --heads 96 --vocab 51200 --seq 2048 --dtype bfloat16 \\
      --strategy pp+zero1 --pp 8 --tp 8 --sequence-parallel --schedule interleaved --virtual-stages 3 \\
      --microbatches 128 --batch 2048 --recompute selective --cluster 1024xH100 --json
  ringzero estimate --layers 96 --hidden 12288 --heads 96 --vocab 51200 --seq 2048 --tied --dtype bfloat16 \\
      --cluster 1024xH100 --search 512,1024,1536,2048
"""

SHAPE_FLAGS = ("layers", "hidden", "heads", "vocab", "seq")


def parse_count(text: str) -> int:
    """'7.5B' -> 7500000000; also K, M, T suffixes and plain numbers like 1.5e9."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([kKmMbBtT]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count; write e.g. 124M, 7.5B or 1.5e9")
    scale = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}[m.group(2).upper()]
    return int(round(float(m.group(1)) * scale))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ringzero estimate", epilog=EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Memory per GPU (parameters, gradients, optimizer state, activations) "
                                            "and communication per step of a training configuration.")
    m = p.add_argument_group("model (--params, or the shape, or --ringzero-gpt, or --hf-config, or --model)")
    m.add_argument("--params", type=parse_count, help="parameter count only, e.g. 7.5B (no activations)")
    m.add_argument("--ringzero-gpt", action="store_true",
                   help="ringzero's byte-level GPT (untied head, no dropout, flash attention); shape flags "
                        "override its GPTConfig defaults")
    m.add_argument("--hf-config", metavar="CONFIG_JSON",
                   help="a Hugging Face model's config.json (llama, mistral, qwen2, gpt2; no download, transformers "
                        "not needed); give --seq")
    m.add_argument("--model", metavar="NAME", help=f"a published shape: {', '.join(KNOWN_MODELS)} (mixtures of "
                   "experts; --seq optional, default 4096)")
    m.add_argument("--layers", type=int)
    m.add_argument("--hidden", type=int)
    m.add_argument("--heads", type=int)
    m.add_argument("--vocab", type=int)
    m.add_argument("--seq", type=int, help="sequence length (tokens per sample)")
    m.add_argument("--mlp-ratio", type=int, default=None, help="MLP width / hidden (default 4)")
    m.add_argument("--tied", action="store_true", help="output projection shares the token embedding (GPT-2)")
    m.add_argument("--no-dropout", action="store_true", help="model without dropout (no masks kept)")
    m.add_argument("--attention", choices=ATTENTION_KINDS, default=None,
                   help="eager keeps the s x s softmax (the paper's default); flash does not")
    t = p.add_argument_group("training")
    t.add_argument("--batch", type=int, help="sequences per optimizer step over all ranks")
    t.add_argument("--dtype", default="float32", metavar="DTYPE",
                   help="float32 (16 B/param with Adam) or a 16-bit type (bfloat16, float16): mixed precision with float32 master "
                        "weights and moments (ZeRO paper: 2 + 2 + 12 B/param)")
    t.add_argument("--optimizer", default="adam", choices=sorted(OPTIMIZER_STATES))
    t.add_argument("--grad-dtype", metavar="DTYPE", help="override the gradients' dtype")
    t.add_argument("--exp-avg-dtype", metavar="DTYPE", help="override Adam's first moment dtype")
    t.add_argument("--exp-avg-sq-dtype", metavar="DTYPE", help="override Adam's second moment dtype")
    t.add_argument("--master", dest="master", action="store_true", default=None,
                   help="keep a float32 master copy (default: only with 16-bit --dtype)")
    t.add_argument("--no-master", dest="master", action="store_false")
    s = p.add_argument_group("parallelism")
    s.add_argument("--world", type=int, help="GPUs in all (default: from --cluster, else 1)")
    s.add_argument("--strategy", default="ddp",
                   help=f"one or more, comma-separated, or 'all': {', '.join(STRATEGIES)}")
    s.add_argument("--pp", type=int, default=None, help="pipeline stages for the pp strategies (default 2)")
    s.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (Megatron's split of heads, MLP and "
                   "vocabulary; default 1); pp x tp must divide --world")
    s.add_argument("--ep", type=int, default=1, help="expert-parallel ranks for a mixture-of-experts model (experts "
                   "sharded over ep of the data-parallel ranks; must divide dp and the experts; default 1)")
    s.add_argument("--sequence-parallel", action="store_true",
                   help="Megatron's sequence parallelism over the --tp ranks (norms and dropouts on s/tp tokens)")
    s.add_argument("--microbatches", type=int, default=None,
                   help="micro-batches per step (default: pp for pipelines, else 1)")
    s.add_argument("--schedule", choices=SCHEDULES, default="1f1b")
    s.add_argument("--recompute", choices=RECOMPUTE_KINDS, default="none", help="activation recomputation")
    s.add_argument("--bucket-mb", type=float, default=25.0, help="gradient bucket in MiB (default 25, as torch DDP)")
    s.add_argument("--zeropp", default="", help="zero3: ZeRO++'s options, e.g. hpz,qw,qg (needs --ranks-per-host)")
    s.add_argument("--ranks-per-host", type=int, default=0, help="data-parallel ranks per host: the report then "
                   "counts the bytes each host sends to the others per step (and --zeropp's in-host groups)")
    c = p.add_argument_group("cluster (for times and the largest model that fits)")
    c.add_argument("--cluster", help=f"COUNTxNAME or NAME, NAME one of {', '.join(PRESETS)} (e.g. 8xH100)")
    c.add_argument("--intra-gbps", type=float, help="intra-node link, gigabits/s per GPU and direction")
    c.add_argument("--inter-gbps", type=float, help="inter-node link, gigabits/s per NIC and direction")
    c.add_argument("--nics-per-node", type=int, default=None, help="with --inter-gbps: NICs per node, shared by "
                   "its ranks (default one per GPU; CPU hosts: usually 1)")
    c.add_argument("--latency-us", type=float, help="latency per algorithm step in microseconds")
    c.add_argument("--gpus-per-node", type=int, default=None, help="with --intra/--inter-gbps (default 8)")
    c.add_argument("--gpu-mem-gb", type=float, help="memory per GPU in GB (1e9 bytes); overrides the preset")
    p.add_argument("--details", action="store_true", help="with several strategies, the full report of each")
    add_step_arguments(p)
    return p


def _model(args):
    shape_given = {k: getattr(args, k) for k in SHAPE_FLAGS if getattr(args, k) is not None}
    traits_given = args.tied or args.no_dropout or args.attention is not None or args.mlp_ratio is not None
    if args.model is not None:
        if args.params is not None or args.ringzero_gpt or args.hf_config is not None or traits_given or \
                set(shape_given) - {"seq"}:
            raise ValueError("--model takes the published shape: give at most --seq, and no --params, --ringzero-gpt, "
                             "--hf-config or other shape flags")
        return known_model(args.model, args.seq)
    if args.hf_config is not None:
        if args.params is not None or args.ringzero_gpt or traits_given or set(shape_given) != {"seq"}:
            raise ValueError("--hf-config takes the shape from the file: give --seq (the sequence length) and no "
                             "--params, --ringzero-gpt or other shape flags")
        import json

        try:
            with open(args.hf_config) as f:
                config = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"--hf-config {args.hf_config}: {e}") from None
        if not isinstance(config, dict):
            raise ValueError(f"--hf-config {args.hf_config}: not a config.json (a JSON object)")
        return ModelShape.from_hf_config(config, args.seq)
    if args.params is not None:
        if shape_given or args.ringzero_gpt or traits_given:
            raise ValueError("give either --params or a shape (--layers --hidden --heads --vocab --seq / "
                             "--ringzero-gpt), not both")
        return args.params
    if args.ringzero_gpt:
        from ..models.gpt import GPTConfig

        d = GPTConfig()
        cfg = dict(n_layer=d.n_layer, d_model=d.d_model, n_head=d.n_head, vocab_size=d.vocab_size,
                   seq_len=d.seq_len, mlp_ratio=d.mlp_ratio, tied_embeddings=False, dropout=False, attention="flash")
    else:
        missing = [f"--{k}" for k in SHAPE_FLAGS if k not in shape_given]
        if missing:
            raise ValueError(f"missing {' '.join(missing)}: give --params N, or all of --layers --hidden --heads "
                             f"--vocab --seq, or --ringzero-gpt")
        cfg = dict(mlp_ratio=4, tied_embeddings=False, dropout=True, attention="eager")
    names = dict(layers="n_layer", hidden="d_model", heads="n_head", vocab="vocab_size", seq="seq_len")
    cfg.update({names[k]: v for k, v in shape_given.items()})
    cfg["tied_embeddings"] = cfg["tied_embeddings"] or args.tied
    cfg["dropout"] = cfg["dropout"] and not args.no_dropout
    if args.attention is not None:
        cfg["attention"] = args.attention
    if args.mlp_ratio is not None:
        cfg["mlp_ratio"] = args.mlp_ratio
    return ModelShape(**cfg)


def _cluster(args):
    custom = [f for f in ("intra_gbps", "inter_gbps", "latency_us") if getattr(args, f) is not None]
    if args.cluster is not None:
        if custom or args.gpus_per_node is not None or args.nics_per_node is not None:
            raise ValueError("--cluster sets the links; leave out --intra-gbps/--inter-gbps/--latency-us/"
                             "--gpus-per-node/--nics-per-node (or leave out --cluster)")
        cluster, count = parse_cluster(args.cluster)
        if args.gpu_mem_gb is not None:
            if not (args.gpu_mem_gb > 0 and math.isfinite(args.gpu_mem_gb)):
                raise ValueError(f"--gpu-mem-gb must be a positive number, got {args.gpu_mem_gb!r}")
            cluster = dataclasses.replace(cluster, gpu_mem_bytes=int(args.gpu_mem_gb * 1e9))
        return cluster, count
    if custom:
        if len(custom) < 3:
            raise ValueError("a custom cluster needs all of --intra-gbps --inter-gbps --latency-us")
        return custom_cluster(args.intra_gbps, args.inter_gbps, args.latency_us, args.gpus_per_node or 8,
                              args.gpu_mem_gb, args.nics_per_node), None
    if args.gpus_per_node is not None or args.gpu_mem_gb is not None or args.nics_per_node is not None:
        raise ValueError("--gpus-per-node, --nics-per-node and --gpu-mem-gb need --cluster or --intra-gbps/--inter-gbps/--latency-us")
    return None, None


def _plans(args, world: int) -> list[Plan]:
    names = list(STRATEGIES) if args.strategy.strip() == "all" else [
        s.strip().lower() for s in args.strategy.split(",") if s.strip()]
    bad = [s for s in names if s not in STRATEGIES]
    if bad or not names:
        raise ValueError(f"--strategy {args.strategy!r}: use one or more of {', '.join(STRATEGIES)} (or 'all')")
    if not (args.bucket_mb > 0 and math.isfinite(args.bucket_mb)):
        raise ValueError(f"--bucket-mb must be a positive number of MiB, got {args.bucket_mb!r}")
    plans = []
    for name in names:
        pp = (args.pp if args.pp is not None else 2) if name.startswith("pp") else 1
        m = args.microbatches if args.microbatches is not None else pp
        plans.append(Plan(strategy=name, world=world, pp=pp, tp=args.tp, sequence_parallel=args.sequence_parallel,
                          microbatches=m, schedule=args.schedule, virtual_stages=args.virtual_stages,
                          recompute=args.recompute, bucket_bytes=max(1, int(args.bucket_mb * 2**20)),
                          zeropp=args.zeropp if name == "zero3" else "", ranks_per_host=args.ranks_per_host,
                          ep=args.ep))
    if args.zeropp and "zero3" not in names:
        raise ValueError(f"--zeropp applies to zero3; add it to --strategy (got {', '.join(names)})")
    if args.pp is not None and args.pp > 1 and not any(n.startswith("pp") for n in names):
        raise ValueError(f"--pp {args.pp} needs a pipeline strategy (pp, pp+zero1, pp+zero2)")
    return plans


def run(args) -> str:
    model = _model(args)
    cluster, count = _cluster(args)
    if args.world is not None and count is not None and args.world != count:
        raise ValueError(f"--world {args.world} disagrees with --cluster {args.cluster} ({count} GPUs); give one")
    world = args.world if args.world is not None else (count or 1)
    if isinstance(world, int) and world < 1:
        raise ValueError(f"--world must be at least 1, got {world}")
    precision = Precision.for_dtype(args.dtype, args.optimizer, args.grad_dtype, {
        k: v for k, v in (("exp_avg", args.exp_avg_dtype), ("exp_avg_sq", args.exp_avg_sq_dtype)) if v},
        args.master)
    if args.search is not None:
        return search_report(args, model, precision, cluster, world)
    estimates = [estimate(model, args.batch, precision, plan, cluster) for plan in _plans(args, world)]
    steps = [step_for(e, args) for e in estimates]
    if args.json:
        import json

        return json.dumps([json_record(e, st) for e, st in zip(estimates, steps)], indent=1)
    out = []
    if len(estimates) == 1 or args.details:
        out += [full_report(e) + ("\n\n" + "\n".join(step_lines(st)) if st else "") for e, st in zip(estimates, steps)]
    if len(estimates) > 1:
        out.append("memory per GPU (fullest stage) and communication per step, by strategy\n"
                   + summary_table(estimates))
        if any(steps):
            out.append(f"step time by strategy\n{'strategy':<10} {'step':>10} {'tokens/s':>14} {'TFLOP/s':>8} "
                       f"{'MFU':>6} {'memory':>10}\n" + "\n".join(summary_line(e, st) for e, st in zip(estimates, steps)))
    if cluster is not None and cluster.gpu_mem_bytes:
        out.append(_largest_lines(model, args.batch, precision, estimates, cluster.gpu_mem_bytes))
    return "\n\n".join(out)


def _largest_lines(model, batch, precision, estimates, capacity) -> str:
    lines = [f"largest model that fits {fmt_bytes(capacity)} per GPU (no allowance for the CUDA context, "
             f"allocator fragmentation or framework buffers)"]
    for e in estimates:
        found = largest_model(model, batch, precision, e.plan, capacity)
        if found is None:
            what = "nothing of this family fits"
        elif isinstance(found[0], ModelShape):
            what = (f"{found[0].n_layer} layers at hidden {found[0].d_model} = {fmt_count(found[1].n_params)} "
                    f"parameters ({fmt_bytes(found[1].total_bytes)})")
        else:
            what = f"{fmt_count(found[0])} parameters, model states only ({fmt_bytes(found[1].total_bytes)})"
        lines.append(f"  {e.plan.strategy:<10} {what}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        print(run(args))
    except ValueError as exc:
        # A rule of the layout or the sizes: one line naming it (argparse's own errors keep the usage).
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    return 0
