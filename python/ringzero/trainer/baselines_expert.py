"""torch-ep: the like-for-like row of `ep` and `ep+zero1` (--model moe), torchtitan's way of running expert
parallelism on stock torch: the same model, the same sharding of the experts over all ranks and the same
dispatch and combine (parallel.expert's sort, counts, all-to-all-v), but every exchange is
torch.distributed.all_to_all_single on the rows' group (env.baseline_group: the gloo default group on the
CPU), the replicated parameters are under torch.nn.parallel.DistributedDataParallel, the optimizer is
torch.optim.AdamW and the clip is torch's norm over every gradient, the experts' summed over the ranks.
The expert gradients' scaling to the mean over the ranks is ExpertDataParallel's rule, shared (it is
arithmetic, no communication, with one rank per expert). Its a2a column is timed as ep's (TimedExchange
around torch's call instead of ringzero's).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..parallel.layout import Layout
from .baselines import torch_adamw
from .run import RankEnv, RunCheckpoint
from .strategies import ExpertParallelRun


class TorchExpertParallelRun(ExpertParallelRun):
    """torch-ep (see the module docstring); no checkpoints, as the other stock rows."""

    @classmethod
    def exchange_function(cls, env: RankEnv):
        return dist.all_to_all_single

    @classmethod
    def process_group(cls, env: RankEnv):
        return env.baseline_group

    @classmethod
    def dense_wrapper(cls, layout: Layout, env: RankEnv):
        ids = [env.device.index] if env.device.type == "cuda" else None

        def torch_ddp(module, process_group):
            return torch.nn.parallel.DistributedDataParallel(module, device_ids=ids, process_group=process_group)
        return torch_ddp

    @classmethod
    def optimizer(cls, params, args):
        return torch_adamw(params, args)

    def clip(self, max_norm: float):
        """torch's clip on the global norm: the replicated gradients' norm (equal on every rank after DDP)
        and the experts' squared norm summed over the group (each rank holds different experts)."""
        dense = [p for p in self.model.dense.module.parameters() if p.grad is not None]
        experts = [p for p in self.model.expert_params if p.grad is not None]
        expert_sq = torch.nn.utils.get_total_norm([p.grad for p in experts]).square().reshape(1)
        dist.all_reduce(expert_sq, group=self.group)
        total = (torch.nn.utils.get_total_norm([p.grad for p in dense]).square() + expert_sq[0]).sqrt()
        torch.nn.utils.clip_grads_with_norm_(dense + experts, max_norm, total)

    def checkpoint(self) -> RunCheckpoint | None:
        return None
