"""One runtime for every valid plan: runs this rank's program of the plan, one step at a time.

Per step: (1) shapes and dtypes are agreed along the pipeline with one small header per stage
boundary (every step, so a new sequence length just works: each stage infers its output on the meta
device); (2) the rank's actions run in order: consecutive SEND/RECV are posted together with
batch_isend_irecv, a compute waits (with a timeout) only for its own input, sends are waited at the
end of the step; (3) gradients, accumulated over the microbatches, are synchronised across data-parallel
replicas if asked, then the optimizer steps. Compute actions are timed (self.timeline).

Loss: microbatch i (n_i of the N samples) contributes loss_fn(output_i, target_i) * n_i / N, so for a
loss that is a mean over samples the gradients and the returned loss equal those of the whole batch.
"""
from __future__ import annotations

import datetime
import time
from typing import Callable

import torch
import torch.distributed as dist

from ...comm.config import DEFAULT_TIMEOUT_S, from_env
from ...comm.errors import CommTimeout
from .plan import COMPUTE, Action, Kind, Plan, forward_plan
from .schedules import make_plan
from .simulate import Timeline, simulate
from .stage import PipelineStage
from .transport import TorchP2P, make_transport
from .validate import validate

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool]
MAX_NDIM = 8
ABORT = -1  # header dtype code: the first stage rejected its input; every rank raises instead of waiting


class PipelineRunner:
    """Runs `schedule` over this rank's `stages` (a PipelineStage, or a list for interleaved schedules).

    schedule: a Plan or a name in schedules.SCHEDULES (then num_microbatches is required and
    stages_per_rank is len(stages)). loss_fn(output, target) -> scalar, used on the last stage.
    grad_sync(): called after the last backward (e.g. a data-parallel reduction); optimizer: stepped
    and zeroed after it. Without an optimizer the gradients stay in .grad for the caller.
    transport: how activations and gradients move (transport.py: 'gloo', 'nccl' or 'ipc'; None:
    torch.distributed point-to-point on the group, i.e. gloo or nccl as its backend says).
    device: where received tensors are placed (None: the device of the first stage's parameters).
    Every rank of the pipeline group builds its runner with the same schedule and microbatch count.
    The plan and its forward-only plan (evaluate) are validated and simulated (deadlock check) here,
    before any communication.
    """

    def __init__(self, stages, schedule: str | Plan, num_microbatches: int | None = None,
                 loss_fn: Callable | None = None, optimizer=None, grad_sync: Callable[[], None] | None = None,
                 timeout_s: float | None = None, transport: str | None = None, device=None):
        stages = [stages] if isinstance(stages, PipelineStage) else list(stages)
        if not stages or not all(isinstance(s, PipelineStage) for s in stages):
            raise TypeError("stages must be a PipelineStage or a non-empty list of them")
        stages.sort(key=lambda s: s.index)
        group = stages[0].group
        if any(s.group is not group or s.num_stages != stages[0].num_stages for s in stages):
            raise ValueError("all stages of a runner must share one group and one num_stages")
        self.group, self.rank = group, dist.get_rank(group)
        if isinstance(schedule, Plan):
            plan = schedule
        elif isinstance(schedule, str):
            if num_microbatches is None:
                raise ValueError("num_microbatches is required when schedule is given by name")
            plan = make_plan(schedule, dist.get_world_size(group), num_microbatches, len(stages))
        else:
            raise TypeError(f"schedule must be a Plan or a schedule name, got {type(schedule).__name__}")
        if plan.num_ranks != dist.get_world_size(group) or plan.num_stages != stages[0].num_stages:
            raise ValueError(f"plan {plan.name} is for {plan.num_ranks} ranks and {plan.num_stages} stages; the "
                             f"group has {dist.get_world_size(group)} ranks and the stages say {stages[0].num_stages}")
        if [s.index for s in stages] != plan.stages_of(self.rank):
            raise ValueError(f"pipeline rank {self.rank} must hold stages {plan.stages_of(self.rank)} for plan "
                             f"{plan.name}, got {[s.index for s in stages]}")
        if stages[-1].is_last and not callable(loss_fn):
            raise ValueError("loss_fn(output, target) is required on the rank holding the last stage")
        self.eval_plan = forward_plan(plan)
        for p in (plan, self.eval_plan):
            validate(p)
            simulate(p)  # raises DeadlockError before anything is sent
        self.plan, self.stages = plan, {s.index: s for s in stages}
        self.p2p = TorchP2P() if transport is None else make_transport(transport)
        if device is None:
            first = next(iter(stages[0].module.parameters()), None)
            device = first.device if first is not None else torch.device("cpu")
        self.device = torch.device(device)
        self.loss_fn, self.optimizer, self.grad_sync = loss_fn, optimizer, grad_sync
        self.timeout = datetime.timedelta(seconds=timeout_s or from_env().timeout_or(DEFAULT_TIMEOUT_S))
        if plan.split_backward:
            from ..data_parallel.ddp import DistributedDataParallel
            from ..data_parallel.zero import ZeroDataParallel

            if any(isinstance(s.module, (DistributedDataParallel, ZeroDataParallel)) for s in stages):
                # W writes Linear weight gradients outside autograd, so the wrappers' reduction hooks
                # would never see them: refuse rather than reduce a partial gradient.
                raise ValueError(f"plan {plan.name} splits the backward into I and W, which ringzero DDP/ZeRO "
                                 "do not support yet: use GPipe or 1F1B with a wrapped stage, or pass an "
                                 "unwrapped stage and reduce gradients in grad_sync")
            for s in stages:
                s.enable_split_backward()
        self.timeline: list[tuple[Action, float, float]] = []
        self.microbatch_losses: list[torch.Tensor] = []
        self._evaluating = False

    # -- communication -------------------------------------------------------------------------------
    def _tag(self, kind: Kind, stage: int, microbatch: int) -> int:
        """Distinct per message within a step (gloo matches receives by source and tag)."""
        m = self.plan.num_microbatches
        lane = {Kind.SEND_F: 0, Kind.RECV_F: 0, Kind.SEND_B: 1, Kind.RECV_B: 1}.get(kind, 2)
        return (lane * self.plan.num_stages + stage) * (m + 1) + microbatch

    def _wait(self, work, what: str):
        try:
            work.wait(timeout=self.timeout)
        except RuntimeError as e:
            raise CommTimeout(f"pipeline rank {self.rank}: {what} did not complete within "
                              f"{self.timeout.total_seconds():.0f} s (RINGZERO_TIMEOUT_S): {e}") from e

    def _agree_shapes(self, inputs) -> None:
        """Header chain along the stages: each learns its input shape/dtype and infers its output's."""
        self._meta, local = {}, {}  # local: headers for a next stage on this same rank
        for st in self.stages.values():
            if st.is_first:
                header = self._first_header(inputs)
            elif st.index in local:
                header = local.pop(st.index)
            else:
                header = torch.zeros(2 + MAX_NDIM, dtype=torch.int64)
                work = dist.irecv(header, src=st.prev_rank, group=self.group, tag=self._tag(Kind.F, st.index, 0))
                self._wait(work, f"shape header for stage {st.index}")
            if header[0] == ABORT:
                # Pass it on only to ranks that have not seen it yet (their first stage is the next one):
                # a send nobody receives would linger into the next step.
                if st.index + 1 < self.plan.num_ranks:
                    self._sends.append(dist.isend(header, dst=st.next_rank, group=self.group,
                                                  tag=self._tag(Kind.F, st.index + 1, 0)))
                    self._wait_sends()
                if st.is_first:
                    raise self._input_error
                raise ValueError(f"pipeline rank {self.rank}: the first stage rejected its input (see its error)")
            shape, dtype = tuple(header[2:2 + int(header[1])].tolist()), DTYPES[int(header[0])]
            self._meta[st.index] = (shape, dtype)
            if not st.is_last:
                out_shape, out_dtype = st.output_meta(shape, dtype)
                if not out_shape or out_shape[0] != shape[0] or len(out_shape) > MAX_NDIM:
                    raise ValueError(f"stage {st.index} maps input {shape} to {out_shape}: stages must keep the "
                                     f"batch dimension first and at most {MAX_NDIM} dims")
                out = torch.zeros(2 + MAX_NDIM, dtype=torch.int64)
                out[0], out[1] = DTYPES.index(out_dtype), len(out_shape)
                out[2:2 + len(out_shape)] = torch.tensor(out_shape)
                if st.index + 1 in self.stages:
                    local[st.index + 1] = out
                    continue
                self._sends.append(dist.isend(out, dst=st.next_rank, group=self.group,
                                              tag=self._tag(Kind.F, st.index + 1, 0)))

    def _first_header(self, inputs) -> torch.Tensor:
        header = torch.zeros(2 + MAX_NDIM, dtype=torch.int64)
        m = self.plan.num_microbatches
        problem = None
        if not isinstance(inputs, torch.Tensor):
            problem = TypeError(f"inputs must be a tensor on the rank holding stage 0, got {type(inputs).__name__}")
        elif inputs.dim() < 1 or inputs.dim() > MAX_NDIM or inputs.dtype not in DTYPES:
            problem = ValueError(f"inputs must have 1 to {MAX_NDIM} dims and a dtype in {DTYPES}, got "
                                 f"{inputs.dtype}{tuple(inputs.shape)}")
        elif inputs.shape[0] < m:
            problem = ValueError(f"inputs has batch size {inputs.shape[0]} < num_microbatches={m}: "
                                 f"use a batch of at least {m} or fewer microbatches")
        if problem is not None:
            self._input_error = problem
            header[0] = ABORT
            return header
        header[0], header[1] = DTYPES.index(inputs.dtype), inputs.dim()
        header[2:2 + inputs.dim()] = torch.tensor(inputs.shape)
        return header

    def _wait_sends(self):
        for i, work in enumerate(self._sends):
            self._wait(work, f"send {i} of this step")
        self._sends = []

    def _buffer(self, a: Action) -> torch.Tensor:
        """Receive buffer for RECV_F (this stage's input) or RECV_B (the gradient of its output)."""
        shape, dtype = self._meta[a.stage]
        if a.kind == Kind.RECV_B:
            shape, dtype = self.stages[a.stage].output_meta(shape, dtype)
        return torch.empty((self._sizes[a.microbatch],) + tuple(shape[1:]), dtype=dtype, device=self.device)

    def _post(self, batch: list[Action]) -> None:
        ops = []  # (is_send, tensor, peer, tag), the transport's format
        for a in batch:
            st = self.stages[a.stage]
            if a.kind == Kind.SEND_F:
                out = self._out[a.stage, a.microbatch]
                if self._evaluating:
                    self._out.pop((a.stage, a.microbatch))  # no backward will come back for it
                # contiguous: point-to-point sends need it, and a stage may return a view (a movedim).
                ops.append((True, out.detach().contiguous(), st.next_rank, self._tag(a.kind, a.stage + 1, a.microbatch)))
            elif a.kind == Kind.SEND_B:
                # The send work keeps the tensor alive until it completes.
                ops.append((True, self._grad_in.pop((a.stage, a.microbatch)).contiguous(), st.prev_rank,
                            self._tag(a.kind, a.stage, a.microbatch)))
            else:
                peer = st.prev_rank if a.kind == Kind.RECV_F else st.next_rank
                tag_stage = a.stage if a.kind == Kind.RECV_F else a.stage + 1
                ops.append((False, self._buffer(a), peer, self._tag(a.kind, tag_stage, a.microbatch)))
        for a, op, work in zip(batch, ops, self.p2p.post(ops, self.group)):
            if op[0]:
                self._sends.append(work)
            else:
                self._recvs[a] = (work, op[1])

    def _received(self, kind: Kind, stage: int, microbatch: int) -> torch.Tensor:
        work, tensor = self._recvs.pop(Action(kind, stage, microbatch))
        self._wait(work, f"{kind.value} for stage {stage} microbatch {microbatch}")
        return tensor

    # -- compute -------------------------------------------------------------------------------------
    def _compute(self, a: Action) -> None:
        st, s, mb = self.stages[a.stage], a.stage, a.microbatch
        if a.kind == Kind.F:
            x = (self._inputs[mb] if st.is_first else
                 self._out.pop((s - 1, mb)) if s - 1 in self.stages else self._received(Kind.RECV_F, s, mb))
            t0 = time.perf_counter()
            out = st.forward(mb, x, self.loss_fn, self._targets[mb] if st.is_last else None, self._weights[mb],
                             keep=not self._evaluating)
            if st.is_last:
                self.microbatch_losses.append(out.detach())
            else:
                self._out[s, mb] = out
        elif a.kind in (Kind.B, Kind.I):
            grad = (None if st.is_last else self._grad_in.pop((s + 1, mb)) if s + 1 in self.stages
                    else self._received(Kind.RECV_B, s, mb))
            t0 = time.perf_counter()
            self._out.pop((s, mb), None)  # the sent copy is no longer needed once its gradient is back
            grad_in = st.backward(mb, grad)
            if grad_in is not None:
                self._grad_in[s, mb] = grad_in
        else:
            t0 = time.perf_counter()
            st.backward_weight(mb)
        self.timeline.append((a, t0, time.perf_counter()))

    def step(self, inputs: torch.Tensor | None = None, targets: torch.Tensor | None = None):
        """One training step over num_microbatches microbatches (split along dim 0 with tensor_split).

        inputs: the whole batch, on the rank holding stage 0 (ignored elsewhere); targets: on the rank
        holding the last stage. Returns the whole-batch loss (0-dim tensor, detached) on the rank holding
        the last stage, None elsewhere; per-microbatch weighted losses are in self.microbatch_losses.
        """
        self._evaluating = False
        self._run(self.plan, inputs, targets)
        if self.grad_sync is not None:
            self.grad_sync()
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return self._batch_loss()

    @torch.no_grad()
    def evaluate(self, inputs: torch.Tensor | None = None, targets: torch.Tensor | None = None):
        """The loss of a batch without training: the forward-only plan of the schedule (eval_plan),
        same microbatches, nothing kept for a backward, no gradient touched. Same arguments and result
        as step(); every rank of the pipeline group must call it."""
        self._evaluating = True
        try:
            self._run(self.eval_plan, inputs, targets)
        finally:
            self._evaluating = False
        return self._batch_loss()

    def _batch_loss(self):
        if self.plan.num_stages - 1 in self.stages:
            return torch.stack(self.microbatch_losses).sum()
        return None

    def _run(self, plan: Plan, inputs, targets) -> None:
        """Runs this rank's program of `plan` (the training plan or its forward-only one)."""
        m = plan.num_microbatches
        self._sends, self._recvs, self._out, self._grad_in = [], {}, {}, {}
        self.timeline, self.microbatch_losses = [], []
        self._agree_shapes(inputs)
        batch = next(iter(self._meta.values()))[0][0]
        self._sizes = [len(c) for c in torch.arange(batch).tensor_split(m)]
        self._weights = [n / batch for n in self._sizes]
        self._inputs = inputs.tensor_split(m) if 0 in self.stages else None
        if plan.num_stages - 1 in self.stages:
            if not isinstance(targets, torch.Tensor) or targets.shape[0] != batch:
                raise ValueError(f"targets must be a tensor with batch size {batch} on the rank holding the last "
                                 f"stage, got {None if targets is None else tuple(targets.shape)}")
            self._targets = targets.tensor_split(m)
        pending: list[Action] = []
        for a in plan.actions[self.rank]:
            if a.kind in COMPUTE:
                if pending:
                    self._post(pending)
                    pending = []
                self._compute(a)
            else:
                pending.append(a)
        if pending:
            self._post(pending)
        self._wait_sends()
        leaks = {s: st.held_microbatches() for s, st in self.stages.items() if st.held_microbatches()}
        if leaks or self._recvs or self._out or self._grad_in:
            raise RuntimeError(f"pipeline rank {self.rank}: plan {plan.name} left state behind: {leaks}")

    def measured_timeline(self) -> list[tuple[Action, float, float]]:
        """This rank's compute actions of the last step: (action, start, end) in perf_counter seconds."""
        return list(self.timeline)


def gather_timeline(runner: PipelineRunner) -> Timeline:
    """All pipeline ranks' measured timelines of the last step, by rank; call on every pipeline rank."""
    rows = [None] * dist.get_world_size(runner.group)
    dist.all_gather_object(rows, runner.measured_timeline(), group=runner.group)
    return rows
