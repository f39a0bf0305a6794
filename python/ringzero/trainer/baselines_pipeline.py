"""torch-pp: torch.distributed.pipelining on ringzero's stages, as the like-for-like row of `pp`.

The stages are those of ringzero's PipelineRun: the --model family's sequential form (embedding,
layers, head) cut by pipeline.split(by="params") into one stage per rank; each rank keeps its own.
torch's PipelineStage runs them under the schedule of the same name (--schedule GPipe:
ScheduleGPipe, 1F1B: Schedule1F1B) with the same --microbatches; its loss is models.lm_loss per
microbatch with the gradients scaled by 1 / microbatches (scale_grads), which for equal microbatches is
the whole batch's mean, as in ringzero's runtime. torch.optim.AdamW on each stage; the clip's norm is
summed over the stages (a weight tied between the first and last stage counted once, its gradients
exchanged by the family's grad_sync as in ringzero's run). ZBH1 has no one-stage-per-rank torch
schedule: refused.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

import ringzero

from ..models import lm_loss
from ..parallel.layout import Layout
from ..parallel.pipeline import split
from .baselines import torch_adamw
from .models import model_family
from .run import RankEnv, Run, compute_module, set_lr

TORCH_SCHEDULES = {"GPipe": "ScheduleGPipe", "1F1B": "Schedule1F1B"}
"""ringzero's --schedule -> the torch.distributed.pipelining schedule class of the same order."""


class TorchPipelineRun(Run):
    """One stage per rank of a torch.distributed.pipelining schedule; see the module docstring."""

    def __init__(self, module, schedule, opt, args, index: int, stages: int, layers_per_stage, shared, grad_sync,
                 group):
        self.module, self.schedule, self.opt, self.args = module, schedule, opt, args
        self.index, self.stages, self.layers_per_stage = index, stages, layers_per_stage
        self.shared, self.grad_sync, self.group = shared, grad_sync, group
        self.is_first, self.is_last = index == 0, index == stages - 1

    @classmethod
    def check(cls, layout: Layout, schedule: str, family=None):
        """Refused: replicas beside the stages, or a schedule torch.distributed.pipelining has no
        one-stage-per-rank form of."""
        if layout.dp != 1:
            raise ValueError(f"torch-pp: --pp {layout.pp} with --nproc {layout.world} leaves replicas; "
                             f"use --pp {layout.world}")
        if schedule not in TORCH_SCHEDULES:
            raise ValueError(f"torch-pp: --schedule {schedule} has no one-stage-per-rank schedule in "
                             f"torch.distributed.pipelining; use {' or '.join(TORCH_SCHEDULES)}")

    @classmethod
    def create(cls, layout: Layout, model, args, env: RankEnv) -> TorchPipelineRun:
        """This rank's stage of `model` (whole on every rank; the other stages' weights are freed)."""
        from torch.distributed import pipelining

        cls.check(layout, args.schedule)
        family = model_family(args)
        parts = split(family.sequential(family.module(model)), layout.pp, by="params")
        index = dist.get_rank(env.baseline_group)
        own = list(parts[index].parameters())
        mine = {id(p) for p in own}
        others = [p for i, part in enumerate(parts) if i != index for p in part.parameters()]
        shared = [p for p in own if id(p) in {id(q) for q in others}]
        for p in others:
            if id(p) not in mine:
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)  # that stage lives on its rank
        stage = pipelining.PipelineStage(compute_module(parts[index], env), index, layout.pp, env.device,
                                         group=env.baseline_group)
        schedule = getattr(pipelining, TORCH_SCHEDULES[args.schedule])(stage, args.microbatches, loss_fn=lm_loss)
        grad_sync = family.grad_sync(model, [stage]) or (lambda: None)
        return cls(parts[index], schedule, torch_adamw(own, args), args, index, layout.pp,
                   [sum(family.is_layer(m) for m in part) for part in parts], shared, grad_sync, env.baseline_group)

    def _run(self, x, y, train: bool) -> float:
        """One schedule over the batch; the batch's mean loss on the last stage (0.0 elsewhere)."""
        losses = []
        step = self.schedule.step if train else self.schedule.eval
        if self.is_first:
            step(x)
        elif self.is_last:
            step(target=y, losses=losses)
        else:
            step()
        return float(torch.stack([loss.detach() for loss in losses]).mean()) if self.is_last else 0.0

    def _global(self, loss: float) -> float:
        out = torch.tensor([loss], dtype=torch.float64)
        ringzero.all_reduce(out)  # only the last stage contributes
        return out.item()

    def clip(self, max_norm: float):
        """Global-norm clip over all stages; a shared (tied) weight's gradient, held by two stages, counted once."""
        shared = {id(p) for p in self.shared}
        params = [p for p in self.module.parameters() if p.grad is not None]
        sq = sum((p.grad.double().pow(2).sum() * (0.5 if id(p) in shared else 1.0) for p in params),
                 torch.zeros((), dtype=torch.float64, device=params[0].grad.device if params else "cpu"))
        total = sq.reshape(1).cpu()
        dist.all_reduce(total, group=self.group)
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total.sqrt().squeeze().float())

    def train_step(self, x, y, step: int) -> float:
        set_lr(self.opt, self.args.lr, step)
        loss = self._run(x, y, train=True)
        self.grad_sync()
        if self.args.clip > 0:
            self.clip(self.args.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return self._global(loss)

    @torch.no_grad()
    def val_loss(self, batches) -> float:
        return self._global(sum(self._run(x, y, train=False) for x, y in batches) / len(batches))
