"""The expert-parallel MoE layer: each rank of an `ep` group of P ranks keeps E/P of the E experts and
the token copies travel to their expert's owner and back by all-to-all.

Per forward, on every rank of the group (models/moe.py does every step but the exchange):

  route         the router (replicated) picks top_k experts per local token
  sort          the copies sorted by expert (one stable argsort); rank j's experts are a contiguous run
  counts        all-to-all of the E per-expert counts: each rank learns how many rows come from whom
  dispatch      all-to-all-v of the sorted copies (uneven blocks)
  local experts the received rows regrouped by local expert (another argsort), a loop over the E/P
                local experts, the rows put back in arrival order
  combine       the reverse all-to-all-v; then un-permute and the router-weighted sum (models/moe.py)

Bytes per MoE layer and step, leaving each rank: dispatch and combine each send this rank's copies that
belong to other ranks' experts, about tokens * top_k * d_model * dtype bytes * (P - 1) / P under even
routing, in forward and again in backward (4 exchanges); the counts exchange adds E int64.
Gradients: the experts' are the sum over the group's ranks of each rank's loss (every copy's gradient
comes back to its expert's owner); the router's and the input's are this rank's. Data parallelism over
the replicated parameters, and the scaling of expert gradients to a mean, is expert_data_parallel.py's.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from ...models.moe import MoEFeedForward
from ..data_parallel.ddp import broadcast_module_state
from .all_to_all import all_to_all_v, exchange_counts


class ExpertParallelMoE(MoEFeedForward):
    """The MoE layer `moe` over `group` (P ranks, None: the default group), keeping experts
    [rank * E/P, (rank + 1) * E/P) of it; the router is `moe`'s own module (shared, replicated).

    Every rank of the group must build it from a layer of the same structure; the whole layer (router
    and every expert) is first broadcast from the group's rank 0, so that ranks built from different
    seeds still hold one model. forward(x (..., d_model), experts=None) -> (..., d_model), as
    MoEFeedForward's, on this rank's tokens (any number, zero included); every rank of the group must call
    forward and backward together. ValueError (naming the argument, the rank and the sizes) when P does not
    divide num_experts or when passed `experts` ids are out of range.

    exchange: the all-to-all that moves counts and rows, a function with torch.distributed.all_to_all_single's
    signature (None: ringzero.all_to_all_single); every rank of the group passes the same kind.
    """

    def __init__(self, moe: MoEFeedForward, group=None, exchange=None):
        nn.Module.__init__(self)
        if not isinstance(moe, MoEFeedForward) or isinstance(moe, ExpertParallelMoE):
            raise TypeError(f"ExpertParallelMoE: moe must be a models.moe.MoEFeedForward, got {type(moe).__name__}")
        self.group = dist.group.WORLD if group is None else group
        self.exchange = exchange
        self.ep_size, self.ep_rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        if moe.num_experts % self.ep_size:
            raise ValueError(f"ExpertParallelMoE: num_experts={moe.num_experts} must be divisible by the expert-parallel "
                             f"size {self.ep_size} (rank {self.ep_rank} of {self.ep_size})")
        broadcast_module_state(moe, self.group)
        self.cfg, self.num_experts, self.top_k = moe.cfg, moe.num_experts, moe.top_k
        self.local_count = moe.num_experts // self.ep_size
        self.first_expert = self.ep_rank * self.local_count
        self.router = moe.router
        self.experts = moe.experts.keep(self.first_expert, self.local_count)
        self.aux_loss: torch.Tensor | None = None
        self.last_counts: torch.Tensor | None = None

    def where(self) -> str:
        return f"ep rank {self.ep_rank} of {self.ep_size}"

    def run_experts(self, x_sorted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """x_sorted [M, d] this rank's copies sorted by global expert, counts [E] -> the experts' outputs
        [M, d] in the same order, computed on their owners. Collective over the group."""
        return run_on_owners(x_sorted, counts, self.group, self.local_count, self.experts, self.exchange)


def run_on_owners(x_sorted: torch.Tensor, counts: torch.Tensor, group, local_count: int, run_local,
                  exchange=None) -> torch.Tensor:
    """Dispatch, local experts, combine's exchange: x_sorted [M, d] this rank's copies sorted by global expert,
    counts [E] int64 (copies per expert, E = P * local_count, rank j owning experts [j L, (j + 1) L)) -> the
    experts' outputs [M, d] in the same order, each computed on its expert's owner by
    run_local(rows [R, d] grouped by local expert, per_expert: a list of local_count ints) -> [R, d].
    Differentiable (the exchanges are all_to_all_v). Collective: every rank of `group` calls it together,
    with the same local_count. ExpertParallelMoE and the Hugging Face experts (parallel/hf/hf_expert.py) both
    run their experts through it. exchange: the all-to-all underneath (all_to_all.py; None: ringzero's)."""
    ranks, local = dist.get_world_size(group), local_count
    received_counts = exchange_counts(counts, group, exchange)     # [P, L]: from rank i, for local expert l
    # One host copy of all the sizes (a device sync on a GPU: the split sizes are Python ints).
    sizes = torch.cat([counts.view(ranks, local).sum(1), received_counts.reshape(-1)]).tolist()
    sent, grid = sizes[:ranks], [sizes[ranks + i * local: ranks + (i + 1) * local] for i in range(ranks)]
    per_source = [sum(row) for row in grid]
    per_expert = [sum(col) for col in zip(*grid)]
    received = all_to_all_v(x_sorted, per_source, sent, group, exchange)  # [R, d]: by source rank, then expert
    # The local experts want their rows contiguous: regroup (source, expert) -> (expert, source) with
    # a stable sort on the expert of each row, and undo it on their output.
    expert_of_row = torch.repeat_interleave(torch.arange(local, device=counts.device).repeat(ranks),
                                            received_counts.reshape(-1))
    by_expert = torch.argsort(expert_of_row, stable=True)
    y = run_local(received[by_expert], per_expert)
    arrival = torch.empty_like(by_expert)
    arrival[by_expert] = torch.arange(by_expert.numel(), device=by_expert.device)
    return all_to_all_v(y[arrival], sent, per_source, group, exchange)  # back to the senders, in their order


def expert_parallel(model: nn.Module, group=None, exchange=None) -> nn.Module:
    """Replaces every MoEFeedForward inside `model` (in place) with an ExpertParallelMoE over `group` (and
    `exchange`, None: ringzero's all-to-all) and returns `model`. Every rank of the group calls it on a
    model of the same structure. The experts'
    parameters are new (this rank's slice); every other parameter is the same object as before, so
    build the optimizer afterwards."""
    targets = [(name, m) for name, m in model.named_modules()
               if isinstance(m, MoEFeedForward) and not isinstance(m, ExpertParallelMoE)]
    if not targets:
        raise ValueError(f"expert_parallel: {type(model).__name__} holds no MoEFeedForward layer")
    if targets[0][0] == "":
        raise ValueError("expert_parallel: pass a model that contains the MoE layer; make a bare layer expert "
                         "parallel with ExpertParallelMoE(layer, group)")
    for name, moe in targets:
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name), attr, ExpertParallelMoE(moe, group, exchange))
    return model
