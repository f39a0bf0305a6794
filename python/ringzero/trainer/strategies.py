"""One rank's part of each ringzero strategy: the data-parallel ones (ddp, zero1-3) and the pipeline
ones (pp, pp+zero1, pp+zero2). Every run takes the global batch of a step on its device and returns
the global loss; the optimizer (FusedAdamW, warm-up) and the global-norm clip are the same for all.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

import ringzero

from ..models import Block, lm_loss
from ..parallel.clip import clip_grad_norm_
from ..parallel.layout import Layout
from .device import Autocast

WARMUP_STEPS = 10
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1


@dataclasses.dataclass
class RankEnv:
    """How this rank computes: decided once per rank (device.py), read by every run."""

    device: torch.device
    """This rank's device (cpu, or its GPU)."""
    precision: str
    """'fp32', or 'bf16': autocast compute with float32 weights, masters, gradients and reductions."""
    transport: str
    """Pipeline point-to-point: 'gloo', 'nccl' or 'ipc' (parallel.pipeline.transport)."""
    baseline_group: object = None
    """The group the stock-torch rows run on (None: the default group)."""


def set_lr(opt, lr: float, step: int):
    """Linear warm-up over WARMUP_STEPS steps, then constant."""
    scale = min(1.0, (step + 1) / WARMUP_STEPS)
    for g in opt.param_groups:
        g["lr"] = lr * scale


def compute_module(module: torch.nn.Module, env: RankEnv) -> torch.nn.Module:
    """`module` as it computes on this rank: under bf16 autocast when env says so."""
    return Autocast(module, env.device, env.precision) if env.precision == "bf16" else module


def _slice(t: torch.Tensor, parts: int, index: int) -> torch.Tensor:
    per = t.shape[0] // parts
    return t[index * per:(index + 1) * per]


class DataParallelRun:
    """DDP or ZeRO-1/2/3 over all ranks: each rank takes its slice of the global batch.
    Subclasses change only build() (the stock-torch baselines)."""

    def __init__(self, strategy: str, model, args, env: RankEnv):
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.args, self.strategy, self.env = args, strategy, env
        self.model, self.opt = self.build(strategy, compute_module(model, env))

    def build(self, strategy: str, module):
        """(wrapped model, optimizer on its parameters)."""
        from ..optim import FusedAdamW
        from ..parallel import DistributedDataParallel, ZeroDataParallel

        stage = Layout(strategy, self.world).zero_stage
        if stage == 0:
            model = DistributedDataParallel(module)
        else:
            model = ZeroDataParallel(module, stage=stage, unit=Block if stage == 3 else None)
        return model, FusedAdamW(model.parameters(), lr=self.args.lr, betas=BETAS, weight_decay=WEIGHT_DECAY)

    def clip(self, max_norm: float):
        self.model.clip_grad_norm_(max_norm)

    def train_step(self, x, y, step: int) -> float:
        xs, ys = _slice(x, self.world, self.rank), _slice(y, self.world, self.rank)
        set_lr(self.opt, self.args.lr, step)
        loss = lm_loss(self.model(xs), ys)
        loss.backward()
        if self.args.clip > 0:
            self.clip(self.args.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        out = loss.detach().reshape(1).to("cpu", copy=True)
        ringzero.all_reduce(out, op=ringzero.ReduceOp.AVG)
        return out.item()

    @torch.no_grad()
    def val_loss(self, batches) -> float:
        """Each rank evaluates its slice of every batch (the training micro-batch, so validation never
        needs more memory than a step); the mean over equal slices is the batch mean."""
        losses = [lm_loss(self.model(_slice(x, self.world, self.rank)), _slice(y, self.world, self.rank)).item()
                  for x, y in batches]
        out = torch.tensor([sum(losses) / len(losses)], dtype=torch.float64)
        ringzero.all_reduce(out, op=ringzero.ReduceOp.AVG)
        return out.item()

    def checkpoint_objects(self):
        return self.model, self.opt


class PipelineRun:
    """Pipeline stages over a (pp x dp) mesh; with pp+zeroK each stage is also ZeRO-K over its
    data-parallel replicas. Training and validation both run through the PipelineRunner (validation
    with the schedule's forward-only plan)."""

    def __init__(self, strategy: str, model, args, env: RankEnv):
        from ..optim import FusedAdamW
        from ..parallel import Mesh, ZeroDataParallel
        from ..parallel.pipeline import PipelineRunner, PipelineStage, split

        layout = Layout.of(strategy, dist.get_world_size(), args.pp)
        self.mesh = Mesh(pp=layout.pp)
        parts = split(model.as_sequential(), layout.pp, by="params")
        self.layers_per_stage = [sum(isinstance(m, Block) for m in part) for part in parts]
        self.index = self.mesh.index("pp")
        # A rank keeps only its own stage's weights; the other stages live on their ranks.
        for i, part in enumerate(parts):
            if i != self.index:
                for p in part.parameters():
                    p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        module = compute_module(parts[self.index], env)
        if layout.zero_stage:
            module = ZeroDataParallel(module, stage=layout.zero_stage, process_group=self.mesh.group("dp"))
        self.module, self.args, self.zero = module, args, bool(layout.zero_stage)
        self.opt = FusedAdamW(module.parameters(), lr=args.lr, betas=BETAS, weight_decay=WEIGHT_DECAY)
        stage = PipelineStage(module, self.index, layout.pp, group=self.mesh.group("pp"))
        self.runner = PipelineRunner(stage, args.schedule, args.microbatches, loss_fn=lm_loss, optimizer=None,
                                     transport=env.transport, device=env.device)
        self.is_first, self.is_last = self.index == 0, self.index == layout.pp - 1

    def _replica(self, x, y):
        dp, dpi = self.mesh.size("dp"), self.mesh.index("dp")
        return (_slice(x, dp, dpi) if self.is_first else None), (_slice(y, dp, dpi) if self.is_last else None)

    def _global(self, per_replica_loss: float) -> float:
        """Sum over every rank (only last stages contribute), averaged over the replicas."""
        out = torch.tensor([per_replica_loss if self.is_last else 0.0], dtype=torch.float64)
        ringzero.all_reduce(out)
        return out.item() / self.mesh.size("dp")

    def train_step(self, x, y, step: int) -> float:
        set_lr(self.opt, self.args.lr, step)
        loss = self.runner.step(*self._replica(x, y))
        if self.args.clip > 0:
            # Every stage and replica holds disjoint gradients, except plain stages replicated over dp.
            grads = [p.grad for p in self.module.parameters()]
            clip_grad_norm_(grads, self.args.clip, replicas=1 if self.zero else self.mesh.size("dp"))
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return self._global(float(loss) if self.is_last else 0.0)

    def val_loss(self, batches) -> float:
        """Each replica evaluates its slice of every batch in training-sized micro-batches, forward only."""
        losses = [self.runner.evaluate(*self._replica(x, y)) for x, y in batches]
        return self._global(sum(float(v) for v in losses) / len(losses) if self.is_last else 0.0)

    def checkpoint_objects(self):
        return None, None
