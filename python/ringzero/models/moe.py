"""A mixture-of-experts feed-forward layer in plain torch: a softmax router picks top_k of num_experts
MLPs for every token, the token's copies are sorted by expert, each expert runs on its contiguous run
of copies, and the outputs are summed back weighted by the router. Dropless by default; with a
capacity factor the copies past an expert's capacity are dropped (in a fixed order).

The experts' weights are stacked tensors with the expert first ([E, d, h], [E, h, d]), so that a rank
can hold a contiguous slice of them (parallel/expert/ does: each rank of an expert-parallel group keeps
E/P experts and the sorted copies travel to their owner by all-to-all). Routing, sorting and combining
are free functions here so that the expert-parallel layer runs exactly the same steps around its
communication: a one-process model and the parallel one then differ only in where experts run.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

ACTIVATIONS = ("gelu", "swiglu")
"""Expert MLPs: gelu, out(gelu(x @ w_in)); swiglu, out(silu(x @ w_gate) * (x @ w_up)) (Mixtral's)."""


@dataclasses.dataclass
class MoEConfig:
    experts: int = 8
    """Number of experts E in each MoE layer."""
    top_k: int = 2
    """Experts each token is sent to (1: Switch, 2: Mixtral); at most `experts`."""
    every: int = 1
    """Which blocks of a MoEGPT are MoE: block i when (i + 1) % every == 0 (1: all, 2: every other, as Switch)."""
    hidden: int | None = None
    """Hidden width of one expert MLP; None: the dense MLP's (GPTConfig.mlp_ratio * d_model)."""
    activation: str = "gelu"
    """One of ACTIVATIONS."""
    capacity_factor: float | None = None
    """None: dropless (every routed copy is computed). A number: an expert takes at most
    ceil(capacity_factor * tokens * top_k / experts) copies of one forward call's tokens; the rest are dropped
    (first choices before second choices, then by token position) and add nothing to their token."""
    aux_loss_coef: float = 0.01
    """Weight of the load-balancing loss (see load_balancing_loss) in the layer's `aux_loss`."""
    renormalize: bool = True
    """Weights of the chosen experts renormalised to sum to 1 (Mixtral); False keeps the router's
    probabilities (Switch's top-1 form, where the router also learns through the main loss)."""

    def __post_init__(self):
        for name in ("experts", "top_k", "every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"MoEConfig.{name} must be a positive int, got {v!r}")
        if self.top_k > self.experts:
            raise ValueError(f"MoEConfig.top_k={self.top_k} must be at most experts={self.experts}")
        if self.hidden is not None and (isinstance(self.hidden, bool) or not isinstance(self.hidden, int)
                                        or self.hidden < 1):
            raise ValueError(f"MoEConfig.hidden must be a positive int or None, got {self.hidden!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"MoEConfig.activation={self.activation!r}: use one of {', '.join(ACTIVATIONS)}")
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise ValueError(f"MoEConfig.capacity_factor must be > 0 or None (dropless), got {self.capacity_factor!r}")
        if self.aux_loss_coef < 0:
            raise ValueError(f"MoEConfig.aux_loss_coef must be >= 0, got {self.aux_loss_coef!r}")

    def is_moe_layer(self, index: int) -> bool:
        """Whether block `index` (from 0) of a MoEGPT holds a MoE layer."""
        return (index + 1) % self.every == 0


# ---- routing ---------------------------------------------------------------------------------------

@dataclasses.dataclass
class Routing:
    """Where each of N tokens goes: experts [N, k] int64, weights [N, k] float32, probs [N, E] float32
    (the router's softmax, which the load-balancing loss reads)."""

    experts: torch.Tensor
    weights: torch.Tensor
    probs: torch.Tensor


def check_expert_indices(experts: torch.Tensor, n_tokens: int, top_k: int, num_experts: int, where: str = ""):
    """ValueError naming `experts`, `where` (e.g. the rank) and the sizes unless `experts` is an integer
    [n_tokens, top_k] tensor of ids in [0, num_experts). Reads the values (a device sync on a GPU): it runs
    only on indices a caller passed in, never on the router's own."""
    at = f" on {where}" if where else ""
    if not isinstance(experts, torch.Tensor) or experts.dtype.is_floating_point or experts.dtype == torch.bool:
        raise ValueError(f"experts{at} must be an integer tensor of expert ids, got "
                         f"{experts.dtype if isinstance(experts, torch.Tensor) else type(experts).__name__}")
    if tuple(experts.shape) != (n_tokens, top_k):
        raise ValueError(f"experts{at} must have shape (tokens, top_k) = ({n_tokens}, {top_k}), got {tuple(experts.shape)}")
    if experts.numel():
        lo, hi = int(experts.min()), int(experts.max())
        if lo < 0 or hi >= num_experts:
            raise ValueError(f"experts{at}: ids must lie in [0, {num_experts}) (num_experts={num_experts}), "
                             f"got ids from {lo} to {hi}")


def route(logits: torch.Tensor, top_k: int, renormalize: bool = True, experts: torch.Tensor | None = None) -> Routing:
    """Routing of N tokens from the router's logits [N, E]: softmax in float32, then the top_k experts
    (or the given `experts` [N, k], already checked) and their probabilities as weights, renormalised to
    sum to 1 when `renormalize`."""
    probs = torch.softmax(logits.float(), dim=-1)
    if experts is None:
        weights, experts = probs.topk(top_k, dim=-1)
    else:
        experts = experts.long()
        weights = probs.gather(1, experts)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return Routing(experts, weights, probs)


def load_balancing_loss(routing: Routing, num_experts: int) -> torch.Tensor:
    """Switch/Mixtral's auxiliary loss: num_experts * sum_e f_e * P_e, with f_e the fraction of the N * k
    routed copies that chose expert e (before any capacity drop; no gradient) and P_e the mean router
    probability of e. 1.0 when routing is uniform; larger the more it concentrates. float32 scalar;
    0 for no tokens."""
    n = routing.experts.shape[0]
    if n == 0:
        return routing.probs.sum() * 0.0  # keeps the router in the graph with a zero gradient
    chosen = torch.bincount(routing.experts.reshape(-1), minlength=num_experts).float()
    fraction = chosen / routing.experts.numel()
    return num_experts * (fraction * routing.probs.mean(dim=0)).sum()


# ---- sorting copies by expert, and combining them back ----------------------------------------------

@dataclasses.dataclass
class SortedCopies:
    """The kept copies of N tokens, sorted by expert (stable): token [M] int64 (which token each copy
    is of), weight [M] float32, counts [E] int64 (copies per expert; sums to M)."""

    token: torch.Tensor
    weight: torch.Tensor
    counts: torch.Tensor


def capacity(n_tokens: int, top_k: int, num_experts: int, capacity_factor: float | None) -> int | None:
    """Copies one expert takes from n_tokens tokens: ceil(capacity_factor * n_tokens * top_k / num_experts);
    None (dropless) when capacity_factor is None."""
    if capacity_factor is None:
        return None
    return math.ceil(capacity_factor * n_tokens * top_k / num_experts)


def sort_by_expert(routing: Routing, num_experts: int, expert_capacity: int | None = None) -> SortedCopies:
    """Sorts the N * k copies by expert with one stable argsort (no loop over tokens). Copies are
    ranked k-major (every token's first choice before any second choice, then by token position)
    before the sort, so that under a capacity the first choices are kept first and the order, and so
    the dropped copies, depend on the routing alone."""
    n, k = routing.experts.shape
    flat_expert = routing.experts.t().reshape(-1)          # [k * N], k-major
    order = torch.argsort(flat_expert, stable=True)         # [k * N] positions in k-major order
    counts = torch.bincount(flat_expert, minlength=num_experts)
    if expert_capacity is not None:
        starts = torch.cumsum(counts, 0) - counts
        rank_in_expert = torch.arange(order.numel(), device=order.device) - starts[flat_expert[order]]
        order = order[rank_in_expert < expert_capacity]
        counts = counts.clamp(max=expert_capacity)
    token = order % n if n else order
    weight = routing.weights.t().reshape(-1)[order]
    return SortedCopies(token, weight, counts)


def combine(y_sorted: torch.Tensor, copies: SortedCopies, n_tokens: int) -> torch.Tensor:
    """out[t] = sum over t's kept copies of weight * expert output: y_sorted [M, d] -> [n_tokens, d]
    (a token whose copies were all dropped gets zeros)."""
    out = y_sorted.new_zeros((n_tokens, y_sorted.shape[1]))
    return out.index_add(0, copies.token, y_sorted * copies.weight.to(y_sorted.dtype).unsqueeze(1))


# ---- the experts --------------------------------------------------------------------------------------

class Experts(nn.Module):
    """`count` expert MLPs (d -> hidden -> d, no biases) as stacked weights: gelu: w_in [count, d, hidden],
    swiglu: w_gate and w_up [count, d, hidden]; both: w_out [count, hidden, d].
    forward(x [M, d] sorted by expert, counts: list of `count` ints summing to M) -> [M, d]."""

    def __init__(self, count: int, d_model: int, hidden: int, activation: str = "gelu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"Experts: activation={activation!r}: use one of {', '.join(ACTIVATIONS)}")
        self.count, self.activation = count, activation
        names = ("w_gate", "w_up") if activation == "swiglu" else ("w_in",)
        for name in names:
            setattr(self, name, nn.Parameter(torch.empty(count, d_model, hidden)))
        self.w_out = nn.Parameter(torch.empty(count, hidden, d_model))
        for p in self.parameters():
            nn.init.normal_(p, std=0.02)

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        if len(counts) != self.count or sum(counts) != x.shape[0]:
            raise ValueError(f"Experts: counts {counts} must be {self.count} numbers summing to the {x.shape[0]} rows of x")
        # unbind, not w[e]: one backward node stacks every expert's gradient once, where indexing would
        # make a full-size zero gradient per expert. Every expert runs, even on no rows, so that each
        # weight gets a gradient (zeros) in every backward.
        w_out = self.w_out.unbind(0)
        if self.activation == "swiglu":
            ins = zip(self.w_gate.unbind(0), self.w_up.unbind(0))
            hidden = [F.silu(xe @ wg) * (xe @ wu) for xe, (wg, wu) in zip(x.split(counts), ins)]
        else:
            hidden = [F.gelu(xe @ w) for xe, w in zip(x.split(counts), self.w_in.unbind(0))]
        return torch.cat([h @ w for h, w in zip(hidden, w_out)])

    def keep(self, first: int, count: int) -> "Experts":
        """A new Experts holding copies of experts [first, first + count) of this one."""
        part = Experts(count, self.w_out.shape[2], self.w_out.shape[1], self.activation)
        with torch.no_grad():
            for name, p in part.named_parameters():
                p.copy_(getattr(self, name)[first:first + count])
        return part


class MoEFeedForward(nn.Module):
    """The MoE layer: (..., d_model) -> (..., d_model), every expert in this process.

    forward(x, experts=None): `experts` optionally fixes the routing ([tokens, top_k] integer ids, tokens =
    x.numel() // d_model; checked, ValueError naming it); the router still weighs the chosen experts.
    After each forward, `aux_loss` holds aux_loss_coef * load_balancing_loss of that call's tokens (a
    scalar in the autograd graph: add it to the training loss), and `last_counts` the copies each expert
    computed ([E] int64, after capacity).
    """

    def __init__(self, d_model: int, hidden: int, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        self.num_experts, self.top_k = cfg.experts, cfg.top_k
        self.router = nn.Linear(d_model, cfg.experts, bias=False)
        self.experts = Experts(cfg.experts, d_model, hidden, cfg.activation)
        self.aux_loss: torch.Tensor | None = None
        self.last_counts: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, experts: torch.Tensor | None = None) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        n = x2.shape[0]
        if experts is not None:
            check_expert_indices(experts, n, self.top_k, self.num_experts, self.where())
        routing = route(self.router(x2), self.top_k, self.cfg.renormalize, experts)
        self.aux_loss = self.cfg.aux_loss_coef * load_balancing_loss(routing, self.num_experts)
        copies = sort_by_expert(routing, self.num_experts,
                                capacity(n, self.top_k, self.num_experts, self.cfg.capacity_factor))
        self.last_counts = copies.counts
        y_sorted = self.run_experts(x2[copies.token], copies.counts)
        return combine(y_sorted, copies, n).view(shape)

    def run_experts(self, x_sorted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Every expert on its run of the sorted copies: x_sorted [M, d], counts [E] -> [M, d]. The
        expert-parallel layer replaces this step (and only this one) with its all-to-alls."""
        return self.experts(x_sorted, counts.tolist())

    def where(self) -> str:
        """Where this layer runs, for error messages ('' in one process)."""
        return ""
