"""`ringzero train`: trains the byte-level GPT (its mixture-of-experts form, --model moe, or a small random
Hugging Face model, --model hf:llama, hf:gpt2, hf:qwen2) on the standard library's sources with one
strategy, or several in turn (`--compare`) on the same data and seed, and prints one table (and a PNG).

    ringzero train --strategy zero2 --nproc 2
    ringzero train --compare ddp,zero1,zero2,zero3,pp --nproc 2 --out runs/compare
    ringzero train --compare torch-ddp,ddp,torch-fsdp2,zero3 --device cuda --steps 20
    ringzero train --compare ddp,tp,tp+zero1 --nproc 4 --tp 2 --sequence-parallel
    ringzero train --strategy 3d --nproc 4 --tp 2 --pp 2
    ringzero train --model hf:llama --kv-heads 2 --compare ddp,zero3,pp,tp --nproc 2
    ringzero train --model moe --compare ep,ep+zero1,torch-ep --nproc 2

Each strategy runs in fresh processes (so peak memory is its own); rank 0 writes a JSON summary that
the parent collects. Under torchrun, only --strategy is accepted and the current processes train.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist

from ..parallel.layout import ALL_STRATEGIES, is_tensor_parallel
from ..parallel.pipeline.schedules import SCHEDULES
from ..trainer.layout import BASELINES, RUNS, SCHEDULE_NOTES
from ..trainer.models import MOE_EXPERTS, MOE_TOP_K, MODELS


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="ringzero train", description=__doc__.split("\n\n")[0])
    how = p.add_mutually_exclusive_group()
    how.add_argument("--strategy", choices=ALL_STRATEGIES, default=None, help="one strategy (default ddp)")
    how.add_argument("--compare", default=None, help="comma-separated strategies to run in turn on the same data; "
                     f"also the stock-torch rows {', '.join(BASELINES)}")
    p.add_argument("--nproc", type=int, default=2,
                   help="ranks to start when not under torchrun (default 2; on the CPU forked from a fork server)")
    p.add_argument("--pp", type=int, default=None, help="pipeline stages for pp strategies (default: all ranks for "
                   "pp, half of them for pp+zero*)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel ranks for tp, tp+zero1 and 3d (default: all "
                   "ranks for tp and tp+zero1, 2 for 3d); the rest are data-parallel replicas")
    p.add_argument("--sequence-parallel", action="store_true", help="tp strategies: shard the activations between "
                   "tensor-parallel regions along the sequence (--seq must divide by --tp)")
    p.add_argument("--microbatches", type=int, default=4, help="pipeline microbatches per step (default 4)")
    p.add_argument("--schedule", default="1F1B", help="pipeline schedule: "
                   f"{', '.join(s for s in SCHEDULES if s not in SCHEDULE_NOTES)} (default 1F1B)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=16, help="global batch in sequences")
    p.add_argument("--seq", type=int, default=128, help="tokens (bytes) per sequence")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--model", default="gpt", help=f"{', '.join(MODELS)}: ringzero's byte GPT (default), or a "
                   "transformers model of that family built from a random config of the sizes above (vocabulary "
                   "256, no download; needs pip install ringzero[hf])")
    p.add_argument("--kv-heads", type=int, default=None, help="hf:llama, hf:qwen2: key/value heads for grouped-query "
                   "attention (default: --heads)")
    p.add_argument("--experts", type=int, default=None, help=f"moe: experts per MoE block (default {MOE_EXPERTS}); "
                   "--nproc must divide it for ep, ep+zero1, torch-ep")
    p.add_argument("--top-k", type=int, default=None, help=f"moe: experts each token goes to (default {MOE_TOP_K})")
    p.add_argument("--recompute", default="none", help="activation recomputation: none, selective (the attention "
                   "core between qkv and proj), full (each transformer block from its input); default none")
    p.add_argument("--zeropp", default=None, help="zero3 across hosts: ZeRO++'s options, comma-separated: hpz (backward's "
                   "gathers stay in the host), qw (int8 weight gathers), qg / qg8 (int4 / int8 gradients across hosts), "
                   "ef (error feedback for qg); docs/data-parallel.md")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--clip", type=float, default=1.0, help="global gradient-norm clip (0: off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--val-every", type=int, default=20, help="validation loss every K steps (and at the end)")
    p.add_argument("--val-batches", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: rank r on GPU LOCAL_RANK %% "
                   "device count (several ranks share a GPU when there are fewer GPUs than ranks)")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"], help="bf16: autocast compute "
                   "with float32 weights, optimizer and reductions; auto: bf16 on cuda, fp32 on cpu")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--save-every", type=int, default=0, help="save a checkpoint every K steps (needs --checkpoint-dir)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir")
    p.add_argument("--out", default=None, help="folder for results.json and compare.png")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    args.strategies = ([s.strip() for s in args.compare.split(",") if s.strip()] if args.compare
                       else [args.strategy or "ddp"])
    bad = [s for s in args.strategies if s not in RUNS]
    if bad:
        p.error(f"unknown strategy {bad}; choose from {', '.join(RUNS)}")
    if args.tp is not None and args.tp < 1:
        p.error("--tp must be at least 1")
    if (args.tp or 1) > 1 and not any(is_tensor_parallel(s) for s in args.strategies):
        # --compare ignores --tp in its other rows (as --pp), but a --tp that no row uses is a mistake
        p.error(f"--tp {args.tp} needs a tensor-parallel strategy (tp, tp+zero1, 3d) among the runs")
    for name in ("nproc", "steps", "batch", "seq", "layers", "d_model", "heads", "microbatches", "val_batches",
                 "kv_heads", "experts", "top_k"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if (args.experts or args.top_k) and args.model != "moe":
        p.error(f"--experts and --top-k shape --model moe's experts; --model {args.model} has none")
    if args.val_every < 0 or args.save_every < 0:
        p.error("--val-every and --save-every must be >= 0")
    if args.zeropp is not None:
        from ..parallel.data_parallel.zeropp import parse as parse_zeropp

        try:
            args.zeropp = parse_zeropp(args.zeropp, "--zeropp").names()
        except ValueError as e:
            p.error(str(e))
        if not {"zero3", "deepspeed-zero3"} & set(args.strategies):
            p.error(f"--zeropp applies to zero3 and deepspeed-zero3; add one to the runs (got {', '.join(args.strategies)})")
    if (args.save_every or args.resume) and not args.checkpoint_dir:
        p.error("--save-every and --resume need --checkpoint-dir")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available")
    from ..trainer import check_recompute, check_run, check_schedule
    from ..trainer.device import precision_of
    from ..trainer.models import model_family

    try:  # everything a rank would refuse, refused here, before any rank is spawned
        check_schedule(args.schedule)
        check_recompute(args.recompute)
        precision = precision_of(args.precision, args.device)
        cfg = model_family(args)
        for s in args.strategies:
            check_run(s, args.nproc, args.pp, args.batch, args.microbatches, args.layers, args.schedule, precision,
                      tp=args.tp, model=cfg, sequence_parallel=args.sequence_parallel, recompute=args.recompute)
    except (ValueError, ImportError) as e:  # ImportError: an hf model without transformers, and how to get it
        p.error(str(e))
    if args.resume or args.save_every:
        torch_rows = [s for s in args.strategies if s in BASELINES]
        if torch_rows:
            p.error(f"--save-every and --resume cover ringzero's strategies, not {', '.join(torch_rows)}")
    return args


def _rank_main(args, strategy: str, result_path: str):
    from ..trainer import train_rank

    summary = train_rank(args, strategy)
    if dist.get_rank() == 0:
        with open(result_path, "w") as f:
            json.dump(summary, f)


def _device_note(args) -> str:
    """The header's device part: nothing on CPU (as before), the GPUs and precision on CUDA."""
    if args.device != "cuda":
        return ""
    from ..trainer.device import gpu_shared, precision_of

    count = torch.cuda.device_count()
    share = f", {args.nproc} ranks sharing them (CUDA IPC)" if gpu_shared(args.nproc, count) else ""
    return f" | {count} x {torch.cuda.get_device_name(0)}{share} | {precision_of(args.precision, 'cuda')}"


def _model_note(args) -> str:
    """The header's model name: nothing for the byte GPT (as before), the family and its shape for hf and moe."""
    if args.model == "gpt":
        return ""
    if args.model == "moe":
        from ..trainer.models import model_family

        moe = model_family(args).moe_config
        return (f"moe ({args.layers} layers, d {args.d_model}, {args.heads} heads; {moe.experts} experts of width "
                f"{moe.hidden}, top-{moe.top_k}, every {moe.every}nd block) ")
    kv = f", {args.kv_heads} kv heads" if args.kv_heads not in (None, args.heads) else ""
    return f"{args.model} ({args.layers} layers, d {args.d_model}, {args.heads} heads{kv}) "


def main(argv=None):
    args = parse_args(argv)
    from .launch import launch, under_torchrun

    if under_torchrun():
        if len(args.strategies) != 1:
            raise SystemExit("ringzero train: under torchrun pass --strategy, not --compare")
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            launch(_rank_main, args.nproc, args, args.strategies[0], os.path.join(args.out, "results.json"),
                   device=args.device)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                launch(_rank_main, args.nproc, args, args.strategies[0], os.path.join(tmp, "r.json"),
                       device=args.device)
        return 0
    results, failed = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for s in args.strategies:
            path = os.path.join(tmp, f"{s}.json")
            t0 = time.time()
            try:
                launch(_rank_main, args.nproc, args, s, path, device=args.device)
            except Exception as e:
                if s not in BASELINES:
                    raise
                # A torch row that cannot run here (e.g. its backend on this machine) leaves the
                # comparison standing: the table says so instead of losing ringzero's rows.
                failed.append((s, str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__))
                continue
            with open(path) as f:
                r = json.load(f)
            r["wall_s"] = time.time() - t0
            results.append(r)
    if not results:
        raise SystemExit("ringzero train: no run finished: " + "; ".join(f"{s}: {why}" for s, why in failed))
    print()
    print(f"# ringzero train | {args.nproc} ranks | {args.steps} steps | global batch {args.batch} x {args.seq} bytes | "
          f"model {_model_note(args)}{results[0]['params'] / 1e6:.2f}M params | {results[0]['corpus']}" + _device_note(args))
    from ..trainer import table

    print(table(results))
    notes = {r.get("estimate_note") for r in results} - {None}
    for note in sorted(notes):
        print(f"estimate: {note}")
    if any("train_aux_losses" in r for r in results):
        print("train loss and val loss: the language-model cross-entropy; training also adds the load-balancing "
              "loss (results.json: train_aux_losses). a2a s: seconds in the all-to-alls of dispatch and combine "
              "(in comm s too for a ringzero row)")
    for s, why in failed:
        print(f"{s}: did not run: {why}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(results + [{"strategy": s, "error": why} for s, why in failed], f, indent=1)
        if len(results) > 1:
            from .compare_plot import plot_compare

            path = plot_compare(results, os.path.join(args.out, "compare.png"))
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
