"""One rank's part of each ringzero strategy, as run.Run classes: the data-parallel ones (ddp, zero1-3), the
tensor-parallel ones (tp, tp+zero1), the expert-parallel ones (ep, ep+zero1: a mixture-of-experts model) and
the pipeline ones (pp, pp+zero1, pp+zero2, and 3d: pipeline stages cut from a tensor-parallel model). Every
run takes the global batch of a step on its device and returns the global loss; the optimizer (FusedAdamW, warm-up) and the global-norm clip are the same for all.
Each run class's create() builds what it needs from the run's Layout (wrapping, sharding, the optimizer);
registry.py says which class runs which strategy.
"""
from __future__ import annotations

import functools
import time

import torch
import torch.distributed as dist

import ringzero

from ..models import lm_loss
from ..optim import FusedAdamW
from ..parallel import DistributedDataParallel, Mesh, ZeroDataParallel, vocab_parallel_cross_entropy
from ..parallel.data_parallel.clip import clip_grad_norm_
from ..parallel.expert import ExpertDataParallel, expert_parallel
from ..parallel.layout import Layout
from ..parallel.pipeline import PipelineRunner, PipelineStage, split
from ..parallel.tensor_parallel.tensor_state import clip_tensor_parallel_grad_norm_
from .models import free_parameters, model_family
from .run import BETAS, WEIGHT_DECAY, RankEnv, Run, RunCheckpoint, compute_module, replica_slice, set_lr


def fused_adamw(params, args) -> FusedAdamW:
    """The optimizer of every ringzero run: FusedAdamW at --lr with BETAS and WEIGHT_DECAY."""
    return FusedAdamW(params, lr=args.lr, betas=BETAS, weight_decay=WEIGHT_DECAY)


class DataParallelRun(Run):
    """Trains `model` (a data-parallel wrapper over this rank's module) with `opt`: the global batch is
    cut into `replicas` equal slices and this rank takes slice `replica` (ranks of a replica share it).
    create() builds ddp and zero1-3 over all ranks; subclasses change the loss, the clip and how
    create() wraps the model (TensorParallelRun, and the stock rows of baselines*.py)."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, args, replicas: int, replica: int):
        if not 0 <= replica < replicas:
            raise ValueError(f"replica {replica} must be in [0, {replicas})")
        self.model, self.opt, self.args = model, opt, args
        self.replicas, self.replica = replicas, replica

    @classmethod
    def create(cls, layout: Layout, model, args, env: RankEnv) -> DataParallelRun:
        """ddp or zero1-3 (layout.zero_stage) over the world of `model` (built by the family of --model;
        zero3 with one unit per layer of that family); every rank calls it."""
        family = model_family(args)
        module = compute_module(family.module(model), env)
        stage = layout.zero_stage
        if stage == 0:
            wrapped = DistributedDataParallel(module)
        else:
            wrapped = ZeroDataParallel(module, stage=stage, unit=family.block if stage == 3 else None,
                                       zeropp=getattr(args, "zeropp", None) if stage == 3 else None)
        return cls(wrapped, fused_adamw(wrapped.parameters(), args), args, dist.get_world_size(), dist.get_rank())

    def loss(self, xs, ys):
        """This replica's mean loss on its slice."""
        return lm_loss(self.model(xs), ys)

    def clip(self, max_norm: float):
        self.model.clip_grad_norm_(max_norm)

    def objective(self, loss: torch.Tensor) -> torch.Tensor:
        """What backward runs from, given this replica's loss right after its forward (the loss that
        train_step reports): the loss itself; ExpertParallelRun adds the load-balancing loss."""
        return loss

    def train_step(self, x, y, step: int) -> float:
        xs, ys = replica_slice(x, self.replicas, self.replica), replica_slice(y, self.replicas, self.replica)
        set_lr(self.opt, self.args.lr, step)
        loss = self.loss(xs, ys)
        self.objective(loss).backward()
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
        losses = [self.loss(replica_slice(x, self.replicas, self.replica),
                            replica_slice(y, self.replicas, self.replica)).item() for x, y in batches]
        out = torch.tensor([sum(losses) / len(losses)], dtype=torch.float64)
        ringzero.all_reduce(out, op=ringzero.ReduceOp.AVG)
        return out.item()

    def checkpoint(self) -> RunCheckpoint | None:
        return RunCheckpoint(self.model, self.opt)


class TensorParallelRun(DataParallelRun):
    """tp: the model sharded over the --tp ranks of each replica (its family's tensor_parallel: the GPT's
    parallel.tensor_parallel.tensor_gpt, or parallelize for an hf model), DDP over the replicas; tp+zero1:
    ZeRO-1 over the replicas instead. The tensor ranks of a replica take the same slice of the batch; the loss is the
    vocabulary-parallel cross-entropy (no full logits).

    mesh: the (dp x tp) mesh; tp_model: the tensor-parallel module inside `model`; layout: the run's Layout."""

    def __init__(self, model, opt, args, mesh: Mesh, tp_model, layout: Layout):
        super().__init__(model, opt, args, replicas=mesh.size("dp"), replica=mesh.index("dp"))
        self.mesh, self.tp_model, self.layout = mesh, tp_model, layout

    @classmethod
    def create(cls, layout: Layout, model, args, env: RankEnv) -> TensorParallelRun:
        """Shards `model` over the tensor group (freeing this rank's full copy), then wraps it in DDP or
        ZeRO-1 over the replicas; every rank calls it."""
        mesh = Mesh(tp=layout.tp)
        tp_model = model_family(args).tensor_parallel(model, mesh, args.sequence_parallel)  # frees the full copy
        module, dp = compute_module(tp_model, env), mesh.group("dp")
        if layout.zero_stage:
            wrapped = ZeroDataParallel(module, stage=layout.zero_stage, process_group=dp)
        else:
            wrapped = DistributedDataParallel(module, process_group=dp)
        return cls(wrapped, fused_adamw(wrapped.parameters(), args), args, mesh, tp_model, layout)

    def loss(self, xs, ys):
        return vocab_parallel_cross_entropy(self.model(xs), ys, self.mesh.group("tp"))

    def clip(self, max_norm: float):
        if self.layout.zero_stage:  # master shards over the replicas mix tensor shards and replicated parameters
            clip_tensor_parallel_grad_norm_(self.model, max_norm, self.layout.tp)
        else:  # DDP: the replicas' gradients are equal, so the tensor group's norm is the global one
            clip_tensor_parallel_grad_norm_(self.tp_model, max_norm, self.layout.tp, group=self.mesh.group("tp"))


class TimedExchange:
    """An all-to-all (torch.distributed.all_to_all_single's signature; ringzero's or torch's) that adds the
    wall time of each call to `seconds`: the a2a column, measured the same way around either function (on a
    GPU the device is synchronised before and after each call, so that the time is the exchange's)."""

    def __init__(self, fn):
        self.fn, self.seconds = fn, 0.0

    def __call__(self, output, input, output_split_sizes=None, input_split_sizes=None, group=None):
        sync = output.is_cuda
        if sync:
            torch.cuda.synchronize(output.device)
        t0 = time.perf_counter()
        self.fn(output, input, output_split_sizes, input_split_sizes, group=group)
        if sync:
            torch.cuda.synchronize(output.device)
        self.seconds += time.perf_counter() - t0


class ExpertParallelRun(DataParallelRun):
    """ep: a mixture-of-experts model (--model moe) with the experts of every MoE block sharded over all
    ranks (parallel.expert.expert_parallel: E / world experts per rank; the token copies dispatched to their
    expert's rank and combined back by ringzero.all_to_all_single) and the other parameters under ringzero's
    DDP (parallel.expert.ExpertDataParallel); ep+zero1: under ZeRO-1. Each rank takes its slice of the batch.
    Backward runs from the language-model loss plus the model's load-balancing loss (MoEGPT.aux_loss, over
    the rank's own tokens); train_step returns, and the table shows, the language-model loss, and summary()
    adds the load-balancing loss of every step. torch-ep (baselines_expert.py) changes the class methods
    exchange_function, process_group, dense_wrapper and optimizer, and the clip.

    moe_model: the MoEGPT inside `model`; exchange: the timed all-to-all its MoE layers call; group: the
    process group of the experts and of data parallelism (None: the default group)."""

    def __init__(self, model, opt, args, moe_model, exchange: TimedExchange, group=None):
        super().__init__(model, opt, args, dist.get_world_size(group), dist.get_rank(group))
        self.moe_model, self.exchange, self.group = moe_model, exchange, group
        self.aux_losses: list[torch.Tensor] = []

    @classmethod
    def exchange_function(cls, env: RankEnv):
        """The all-to-all under dispatch and combine: ringzero's."""
        return ringzero.all_to_all_single

    @classmethod
    def process_group(cls, env: RankEnv):
        """The group the experts are sharded over (and the other parameters data parallel over): the default."""
        return None

    @classmethod
    def dense_wrapper(cls, layout: Layout, env: RankEnv):
        """ExpertDataParallel's wrap of the replicated parameters: ringzero's DDP, or ZeRO at layout.zero_stage."""
        if layout.zero_stage:
            return functools.partial(ZeroDataParallel, stage=layout.zero_stage)
        return DistributedDataParallel

    @classmethod
    def optimizer(cls, params, args):
        return fused_adamw(params, args)

    @classmethod
    def create(cls, layout: Layout, model, args, env: RankEnv) -> ExpertParallelRun:
        """Shards the experts of `model` (a models.MoEGPT) over the group, keeping this rank's, then wraps the
        rest; every rank calls it."""
        exchange, group = TimedExchange(cls.exchange_function(env)), cls.process_group(env)
        expert_parallel(model, group, exchange)
        wrapped = ExpertDataParallel(compute_module(model, env), group, wrap=cls.dense_wrapper(layout, env))
        return cls(wrapped, cls.optimizer(wrapped.parameters(), args), args, model, exchange, group)

    def objective(self, loss):
        aux = self.moe_model.aux_loss()  # of the forward that gave `loss`
        self.aux_losses.append(aux.detach())
        return loss + aux

    def exchange_seconds(self) -> float:
        return self.exchange.seconds

    def summary(self) -> dict:
        """train_aux_losses: the load-balancing loss of each step (its mean over the ranks), in the order of
        train_losses; backward ran from their sum. Every rank trained the same steps, so all reduce or none."""
        if not self.aux_losses:
            return {"train_aux_losses": []}
        aux = torch.stack(self.aux_losses).to("cpu", torch.float64)
        ringzero.all_reduce(aux, op=ringzero.ReduceOp.AVG)
        return {"train_aux_losses": aux.tolist()}

    def checkpoint(self) -> RunCheckpoint | None:
        return None  # ExpertDataParallel has no checkpoint form yet (docs/expert-parallel.md)


class PipelineRun(Run):
    """Pipeline stages over a (pp x dp x tp) mesh; with pp+zeroK each stage is also ZeRO-K over its
    data-parallel replicas. 3d cuts the stages from the tensor-parallel model (each stage's tp ranks
    hold its shards, stage s's tensor rank t talks to stage s + 1's tensor rank t) and is ZeRO-1 over
    the replicas. Stages are cut from the family's sequential form (embedding, layers, head); an
    embedding tied to the head lives on the first and the last stage, kept equal by the family's
    grad_sync. Training and validation both run through the PipelineRunner (validation with the
    schedule's forward-only plan)."""

    @classmethod
    def create(cls, layout: Layout, model, args, env: RankEnv) -> PipelineRun:
        """This rank's stage of `model` (the other stages' weights are freed); every rank calls it."""
        return cls(layout, model, args, env)

    def __init__(self, layout: Layout, model, args, env: RankEnv):
        self.layout, self.mesh = layout, Mesh(pp=layout.pp, tp=layout.tp)
        family = model_family(args)
        loss_fn = lm_loss
        if layout.tensor_parallel:
            tp_group = self.mesh.group("tp")
            whole = family.tensor_parallel(model, self.mesh, args.sequence_parallel)

            def loss_fn(local_logits, y):
                return vocab_parallel_cross_entropy(local_logits, y, tp_group)
        else:
            whole = family.module(model)
        parts = split(family.sequential(whole), layout.pp, by="params")
        self.layers_per_stage = [sum(family.is_layer(m) for m in part) for part in parts]
        self.index = self.mesh.index("pp")
        # A rank keeps only its own stage's weights; the other stages live on their ranks.
        own = list(parts[self.index].parameters())
        for i, part in enumerate(parts):
            if i != self.index:
                free_parameters(part, keep=own)
        # Parameters this stage shares with others (a tied embedding): counted once in the clip's norm.
        others = {id(p) for i, part in enumerate(parts) if i != self.index for p in part.parameters()}
        module = compute_module(parts[self.index], env)
        self.shared = [p for p in module.parameters() if id(p) in others]
        if layout.zero_stage:
            # A shared weight gets a bucket of its own, so that its shard is the same on both stages (the
            # family's grad_sync adds the two stages' reduced shards).
            module = ZeroDataParallel(module, stage=layout.zero_stage, process_group=self.mesh.group("dp"),
                                      own_bucket=self.shared)
            self.shared = [module.group_of(p).master for p in self.shared]
        self.module, self.args, self.zero = module, args, bool(layout.zero_stage)
        self.opt = fused_adamw(module.parameters(), args)
        stage = PipelineStage(module, self.index, layout.pp, group=self.mesh.group("pp"))
        self.runner = PipelineRunner(stage, args.schedule, args.microbatches, loss_fn=loss_fn, optimizer=None,
                                     grad_sync=family.grad_sync(model, [stage]), transport=env.transport,
                                     device=env.device)
        self.is_first, self.is_last = self.index == 0, self.index == layout.pp - 1

    def _replica(self, x, y):
        dp, dpi = self.mesh.size("dp"), self.mesh.index("dp")
        return ((replica_slice(x, dp, dpi) if self.is_first else None),
                (replica_slice(y, dp, dpi) if self.is_last else None))

    def _global(self, per_replica_loss: float) -> float:
        """Sum over every rank (only last stages contribute, each of their tp ranks the same value),
        averaged over the replicas."""
        out = torch.tensor([per_replica_loss if self.is_last else 0.0], dtype=torch.float64)
        ringzero.all_reduce(out)
        return out.item() / (self.mesh.size("dp") * self.mesh.size("tp"))

    def train_step(self, x, y, step: int) -> float:
        set_lr(self.opt, self.args.lr, step)
        loss = self.runner.step(*self._replica(x, y))
        if self.args.clip > 0 and self.layout.tensor_parallel:
            # Stages and ZeRO shards are disjoint; the stage's replicated parameters repeat on its tp ranks.
            clip_tensor_parallel_grad_norm_(self.module, self.args.clip, self.layout.tp, shared=self.shared)
        elif self.args.clip > 0:
            # Every stage and replica holds disjoint gradients, except plain stages replicated over dp and a
            # tied embedding, whose summed gradient the first and the last stage both hold (under ZeRO: its
            # bucket's master shard, the same elements on both).
            shared = {id(p) for p in self.shared}
            grads = [p.grad for p in self.module.parameters() if id(p) not in shared]
            clip_grad_norm_(grads, self.args.clip, replicas=1 if self.zero else self.mesh.size("dp"),
                            replicated=[p.grad for p in self.shared], replicated_copies=2)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return self._global(float(loss) if self.is_last else 0.0)

    def val_loss(self, batches) -> float:
        """Each replica evaluates its slice of every batch in training-sized micro-batches, forward only."""
        losses = [self.runner.evaluate(*self._replica(x, y)) for x, y in batches]
        return self._global(sum(float(v) for v in losses) / len(losses) if self.is_last else 0.0)
