"""The training loop behind `ringzero train`: one rank's run of one strategy, and the comparison plot.

Strategies share the model (ringzero.models.GPT, same seed), the data (ringzero.data, same batches for
the same step), the optimizer (ringzero.optim.FusedAdamW, AdamW with a short warm-up) and a global
gradient-norm clip, so that their losses can be compared line by line.
"""
from __future__ import annotations

import resource
import time

import torch
import torch.distributed as dist

import ringzero

from .data import batch as make_batch
from .data import corpus_info, stdlib_corpus
from .models import GPT, Block, GPTConfig, lm_loss

WARMUP_STEPS = 10
METERED_STEPS = 3
"""Steps counted by the memory meter (see train_rank)."""
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1


def pipeline_stages(strategy: str, nproc: int, pp: int | None) -> int:
    if not strategy.startswith("pp"):
        return 1
    return pp or (nproc if strategy == "pp" else max(1, nproc // 2))


def check_layout(strategy: str, nproc: int, pp: int | None, batch: int, microbatches: int, layers: int):
    """Raises ValueError, before any rank starts, for a layout that cannot run."""
    stages = pipeline_stages(strategy, nproc, pp)
    if nproc % stages:
        raise ValueError(f"{strategy}: --pp {stages} must divide --nproc {nproc}")
    dp = nproc // stages
    if strategy == "pp" and dp != 1:
        raise ValueError(f"pp: --pp {stages} with --nproc {nproc} leaves {dp} data-parallel replicas; use pp+zero1 or "
                         "pp+zero2 for that, or --pp equal to --nproc")
    if stages > layers + 2:
        raise ValueError(f"{strategy}: {stages} stages for {layers + 2} blocks (embedding, {layers} layers, head); "
                         "use fewer stages or more --layers")
    if batch % dp:
        raise ValueError(f"{strategy}: --batch {batch} must divide among {dp} data-parallel replicas")
    if strategy.startswith("pp") and (batch // dp) % microbatches:
        raise ValueError(f"{strategy}: the per-replica batch {batch // dp} must divide into --microbatches {microbatches}")


def _maybe_fault(step: int):
    """Fault injection for the restart test: RINGZERO_FAULT=kill:rank=R:step=S kills rank R with SIGKILL
    when it reaches step S, on the first attempt only (torchrun counts restarts in TORCHELASTIC_RESTART_COUNT)."""
    import os
    import signal

    spec = os.environ.get("RINGZERO_FAULT")
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    try:
        kind, *fields = spec.split(":")
        kv = dict(f.split("=", 1) for f in fields)
        rank, at = int(kv["rank"]), int(kv["step"])
    except (ValueError, KeyError):
        raise ValueError(f"RINGZERO_FAULT={spec!r}: expected kill:rank=R:step=S") from None
    if kind != "kill":
        raise ValueError(f"RINGZERO_FAULT={spec!r}: the only fault is 'kill'")
    if dist.get_rank() == rank and step == at:
        os.kill(os.getpid(), signal.SIGKILL)


def _rss_bytes() -> int:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _optimizer(params, lr):
    from .optim import FusedAdamW

    return FusedAdamW(params, lr=lr, betas=BETAS, weight_decay=WEIGHT_DECAY)


def _set_lr(opt, lr: float, step: int):
    scale = min(1.0, (step + 1) / WARMUP_STEPS)
    for g in opt.param_groups:
        g["lr"] = lr * scale


class DataParallelRun:
    """DDP or ZeRO-1/2/3 over all ranks: each rank takes its slice of the global batch."""

    def __init__(self, strategy: str, model: GPT, args):
        from .parallel import DistributedDataParallel, ZeroDataParallel

        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        if strategy == "ddp":
            self.model = DistributedDataParallel(model)
        else:
            stage = int(strategy[-1])
            self.model = ZeroDataParallel(model, stage=stage, unit=Block if stage == 3 else None)
        self.opt = _optimizer(self.model.parameters(), args.lr)
        self.args = args
        self.strategy = strategy

    def train_step(self, x, y, step: int) -> float:
        per = x.shape[0] // self.world
        xs, ys = x[self.rank * per:(self.rank + 1) * per], y[self.rank * per:(self.rank + 1) * per]
        _set_lr(self.opt, self.args.lr, step)
        loss = lm_loss(self.model(xs), ys)
        loss.backward()
        if self.args.clip > 0:
            if self.strategy == "ddp":
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.clip)
            else:
                self.model.clip_grad_norm_(self.args.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        out = loss.detach().reshape(1).clone()
        ringzero.all_reduce(out, op=ringzero.ReduceOp.AVG)
        return out.item()

    @torch.no_grad()
    def val_loss(self, batches) -> float:
        """Each rank evaluates its slice of every batch (the training micro-batch, so validation never
        needs more memory than a step); the mean over equal slices is the batch mean."""
        losses = []
        for x, y in batches:
            per = x.shape[0] // self.world
            sl = slice(self.rank * per, (self.rank + 1) * per)
            losses.append(lm_loss(self.model(x[sl]), y[sl]).item())
        out = torch.tensor([sum(losses) / len(losses)], dtype=torch.float64)
        ringzero.all_reduce(out, op=ringzero.ReduceOp.AVG)
        return out.item()

    def checkpoint_objects(self):
        return self.model, self.opt


class PipelineRun:
    """Pipeline stages over a (pp x dp) mesh; with pp+zeroK each stage is also ZeRO-K over its
    data-parallel replicas."""

    def __init__(self, strategy: str, model: GPT, args):
        from .parallel import Mesh, ZeroDataParallel
        from .parallel.pipeline import PipelineRunner, PipelineStage, split

        stages = pipeline_stages(strategy, dist.get_world_size(), args.pp)
        self.mesh = Mesh(pp=stages)
        parts = split(model.as_sequential(), stages, by="params")
        self.layers_per_stage = [sum(isinstance(m, Block) for m in part) for part in parts]
        self.index = self.mesh.index("pp")
        self.stages = stages
        # A rank keeps only its own stage's weights; the other stages live on their ranks.
        for i, part in enumerate(parts):
            if i != self.index:
                for p in part.parameters():
                    p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        module = parts[self.index]
        if strategy != "pp":
            module = ZeroDataParallel(module, stage=int(strategy[-1]), process_group=self.mesh.group("dp"))
        self.module = module
        self.opt = _optimizer(module.parameters(), args.lr)
        self.args = args
        stage = PipelineStage(module, self.index, stages, group=self.mesh.group("pp"))
        self.runner = PipelineRunner(stage, args.schedule, args.microbatches, loss_fn=lm_loss, optimizer=None)
        self.is_last = self.index == stages - 1

    def _clip(self):
        """Global norm over every stage and replica: each rank's parameters (or shards) are disjoint."""
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        sq = torch.zeros(1, dtype=torch.float64)
        for g in grads:
            sq += torch.linalg.vector_norm(g, dtype=torch.float64).square()
        ringzero.all_reduce(sq)
        if not isinstance(self.module, torch.nn.Sequential):
            pass  # ZeRO shards: disjoint across dp too, summed above
        else:
            sq /= self.mesh.size("dp")  # plain stages are replicated across dp (dp is 1 for "pp")
        norm = sq.sqrt().item()
        scale = self.args.clip / (norm + 1e-6)
        if scale < 1:
            for g in grads:
                g.mul_(scale)

    def train_step(self, x, y, step: int) -> float:
        dp, dpi = self.mesh.size("dp"), self.mesh.index("dp")
        per = x.shape[0] // dp
        xs, ys = x[dpi * per:(dpi + 1) * per], y[dpi * per:(dpi + 1) * per]
        _set_lr(self.opt, self.args.lr, step)
        loss = self.runner.step(xs if self.index == 0 else None, ys if self.is_last else None)
        if self.args.clip > 0:
            self._clip()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        out = torch.tensor([float(loss) if self.is_last else 0.0], dtype=torch.float64)
        ringzero.all_reduce(out)
        return out.item() / dp

    @torch.no_grad()
    def val_loss(self, batches) -> float:
        """Forward only, stage to stage: each stage receives its input from the previous stage's rank of
        the same data-parallel replica, the last one computes the loss. Each replica takes its slice of
        every batch, in training-sized micro-batches."""
        group = self.mesh.group("pp")
        prev = dist.get_global_rank(group, self.index - 1) if self.index > 0 else None
        nxt = dist.get_global_rank(group, self.index + 1) if not self.is_last else None
        dp, dpi = self.mesh.size("dp"), self.mesh.index("dp")
        losses = []
        for xb, yb in batches:
            per = xb.shape[0] // dp
            micro = per // self.args.microbatches  # the training micro-batch: no more memory than a step
            for k in range(self.args.microbatches):
                sl = slice(dpi * per + k * micro, dpi * per + (k + 1) * micro)
                x, y = xb[sl], yb[sl]
                if prev is None:
                    h = x
                else:
                    h = torch.empty(*x.shape, self.args.d_model, dtype=torch.float32)
                    dist.recv(h, src=prev, group=group)
                out = self.module(h)
                if nxt is not None:
                    dist.send(out.contiguous(), dst=nxt, group=group)
                else:
                    losses.append(lm_loss(out, y).item())
        total = torch.tensor([sum(losses) / len(losses) if losses else 0.0], dtype=torch.float64)
        ringzero.all_reduce(total)
        return total.item() / dp

    def checkpoint_objects(self):
        return None, None


def train_rank(args, strategy: str) -> dict:
    """Trains on this rank; returns the run's summary (meaningful on rank 0). Peak memory per rank is
    counted twice: the tensor bytes alive at the peak (ringzero.memory; what the estimator predicts and
    what torch.cuda.max_memory_allocated reports on a GPU) and the resident set above the process's
    start (which adds the allocator's slack, the staging segment, the corpus and torch's own buffers).
    The meter runs from before the model is built through the first METERED_STEPS steps (after the
    first step's optimizer state exists, every step repeats the same allocations) and is then stopped,
    as counting costs about 7% of a step; the metered steps are left out of the step time."""
    import contextlib

    from .memory import TensorMemoryMeter

    rss0 = _rss_bytes()
    meter = TensorMemoryMeter()
    with contextlib.ExitStack() as metering:
        metering.enter_context(meter)
        summary, run = _train(args, strategy, stop_meter=metering.close)
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0
    stats = torch.tensor([meter.peak_bytes(args.device), rss_peak], dtype=torch.float64)
    world = dist.get_world_size()
    table = torch.empty(world * 2, dtype=torch.float64)
    ringzero.all_gather_single(table, stats)
    table = table.view(world, 2) / 2**20
    summary.update(peak_mib_per_rank=float(table[:, 0].max()), peak_mib_by_rank=table[:, 0].tolist(),
                   rss_mib_per_rank=float(table[:, 1].max()))
    summary.update(estimate_for_run(args, strategy, world, getattr(run, "layers_per_stage", None)))
    return summary


def estimate_for_run(args, strategy: str, world: int, layers_per_stage=None) -> dict:
    """ringzero.estimate's prediction for this run (float32 AdamW, the same model, batch and layout):
    the fullest rank's total, each rank's total (rank r is stage r // dp) and the terms of the fullest."""
    from .estimate import Plan, estimate

    stages = pipeline_stages(strategy, world, args.pp)
    plan = Plan(strategy=strategy, world=world, pp=stages,
                microbatches=args.microbatches if strategy.startswith("pp") else 1,
                schedule="gpipe" if args.schedule == "GPipe" else "1f1b",
                layers_per_stage=tuple(layers_per_stage) if layers_per_stage else None)
    cfg = GPTConfig(seq_len=args.seq, n_layer=args.layers, n_head=args.heads, d_model=args.d_model)
    e = estimate(cfg, batch=args.batch, plan=plan)
    mib = 2**20
    return {"estimate_mib_per_rank": e.total_bytes / mib,
            "estimate_mib_by_rank": [e.stages[r // plan.dp].total_bytes / mib for r in range(world)],
            "estimate_terms_mib": {"parameters": e.params_bytes / mib, "gradients": e.grads_bytes / mib,
                                   "optimizer": e.optimizer_bytes / mib,
                                   "activations": (e.activation_bytes or 0) / mib,
                                   "transient": e.peak.transient_bytes / mib}}


def _train(args, strategy: str, stop_meter=lambda: None):
    """The run itself: returns (summary without memory figures, the strategy's run object)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    cfg = GPTConfig(seq_len=args.seq, n_layer=args.layers, n_head=args.heads, d_model=args.d_model)
    model = GPT(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    if args.device == "cuda":
        model = model.cuda()
    train_data, val_data = stdlib_corpus()
    run = PipelineRun(strategy, model, args) if strategy.startswith("pp") else DataParallelRun(strategy, model, args)
    val_batches = [make_batch(val_data, args.batch, args.seq, args.seed + 1, i) for i in range(args.val_batches)]

    start = 0
    if args.resume:
        from . import checkpoint

        obj, opt = run.checkpoint_objects()
        if obj is None:
            raise ValueError(f"--resume is not supported for {strategy}: checkpoints cover DDP and ZeRO runs")
        try:
            path = checkpoint.latest(args.checkpoint_dir)
        except FileNotFoundError:
            path = None  # nothing saved yet: a restart before the first checkpoint starts over
        if path is not None:
            start = checkpoint.load(path, obj, opt)["step"]

    bar = None
    if rank == 0 and not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=args.steps, initial=start, desc=strategy, unit="step", dynamic_ncols=True)
    losses, vals, step_times = [], [], []
    initial_val = run.val_loss(val_batches) if start == 0 else float("nan")
    comm0 = ringzero.comm_seconds()
    for step in range(start, args.steps):
        if step == start + METERED_STEPS:
            stop_meter()
        _maybe_fault(step)
        x, y = make_batch(train_data, args.batch, args.seq, args.seed, step)
        t0 = time.perf_counter()
        loss = run.train_step(x, y, step)
        step_times.append(time.perf_counter() - t0)
        losses.append((step, loss))
        if (args.val_every and (step + 1) % args.val_every == 0) or step + 1 == args.steps:
            vals.append((step, run.val_loss(val_batches)))
        if args.save_every and (step + 1) % args.save_every == 0:
            from . import checkpoint

            obj, opt = run.checkpoint_objects()
            if obj is None:
                raise ValueError(f"--save-every is not supported for {strategy}: checkpoints cover DDP and ZeRO runs")
            checkpoint.save(args.checkpoint_dir, obj, opt, step=step + 1)
        if bar is not None:
            tokens_s = args.batch * args.seq / step_times[-1]
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens_s:.0f}", refresh=False)
            bar.update(1)
    if bar is not None:
        bar.close()

    comm_s = torch.tensor([ringzero.comm_seconds() - comm0], dtype=torch.float64)
    ringzero.all_reduce(comm_s, op=ringzero.ReduceOp.MAX)
    # The first step includes one-time setup; the metered ones pay for counting.
    timed = step_times[METERED_STEPS:] or step_times[1:] or step_times
    step_s = sum(timed) / max(1, len(timed))
    return {
        "strategy": strategy, "ranks": world, "steps": args.steps, "start_step": start,
        "params": n_params,
        "corpus": corpus_info(),
        "train_losses": losses, "val_losses": vals,
        "final_train_loss": losses[-1][1] if losses else float("nan"),
        "final_val_loss": vals[-1][1] if vals else float("nan"),
        "initial_val_loss": initial_val,
        "step_ms": step_s * 1e3, "tokens_per_s": args.batch * args.seq / step_s,
        "comm_s": float(comm_s),
    }, run


def plot_compare(results: list[dict], path: str) -> str:
    """Loss curves, peak memory per rank and tokens/s of the compared strategies, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_mem, ax_tok) = plt.subplots(1, 3, figsize=(15, 4.2))
    for r in results:
        steps, loss = zip(*r["train_losses"])
        line, = ax_loss.plot(steps, loss, label=f"{r['strategy']} train", linewidth=1)
        if r["val_losses"]:
            vs, vl = zip(*r["val_losses"])
            ax_loss.plot(vs, vl, "o--", color=line.get_color(), label=f"{r['strategy']} val", markersize=4)
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss (nats/byte)")
    ax_loss.legend(fontsize=7)
    names = [r["strategy"] for r in results]
    pos = range(len(names))
    ax_mem.bar([i - 0.2 for i in pos], [r["peak_mib_per_rank"] for r in results], width=0.4, color="tab:orange",
               label="measured (live tensors)")
    ax_mem.bar([i + 0.2 for i in pos], [r["estimate_mib_per_rank"] for r in results], width=0.4, color="tab:gray",
               label="ringzero.estimate")
    ax_mem.set_xticks(list(pos), names)
    ax_mem.set_ylabel("peak MiB, fullest rank")
    ax_mem.legend(fontsize=7)
    ax_tok.bar(names, [r["tokens_per_s"] for r in results], color="tab:green")
    ax_tok.set_ylabel("tokens/s")
    fig.suptitle(f"ringzero train: {results[0]['ranks']} ranks, {results[0]['steps']} steps, "
                 f"{results[0]['params'] / 1e6:.2f}M params")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
