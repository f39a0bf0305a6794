"""Expert parallelism (python/ringzero/parallel/expert/) against one process holding every expert, on 2 and
3 CPU ranks (gloo default group, one spawn per world size for every case).

Layer cases: each rank runs ExpertParallelMoE on its own tokens (an uneven number per rank: 5, 8, 11 ...;
a rank with none in one case); the reference is models/moe.py's MoEFeedForward, every expert in one
process, run on every rank's tokens with the same routing, summing the ranks' losses. Compared: each
rank's output and loss (the same), its input gradient, the router gradient summed over ranks, and each
rank's expert gradients against the matching slice of the reference's (the sum over all ranks' tokens).
Routing by the router (top-1 and top-2, gelu and swiglu, renormalised or not), forced onto a few experts
(a rank that receives no token, experts that get none), and with a capacity factor that drops copies.

Training cases: a 2-block MoEGPT, expert parallel over the world (and, on 4 ranks, Mesh(ep=2): two ep
groups whose experts are data parallel over edp), wrapped by ExpertDataParallel around ringzero's DDP,
ZeRO-1 and ZeRO-2 (4 ranks: DDP and ZeRO-1), three AdamW steps with gradient clipping; the reference is one float32
process on the whole batch (the mean over ranks' slices of cross-entropy plus aux loss, the aux loss and
capacity being per forward call, as each rank's is). Compared: the mean loss of every step, the clip
norms, and the final parameters (experts against the reference's slice).

Tolerances (float32 rounding; the largest errors measured on this machine in brackets): layer values and
gradients within 2e-5 of the largest reference value [2.6e-7]; training losses and clip norms within
1e-5 relative [1.2e-7, 1.1e-7], final parameters within 1e-4 absolute [1.5e-5]. Expert gradients left unscaled under
data parallelism (off by the ep size) move the clip norms by 4e-4 and the parameters by 3e-3 (Adam hides
most of a scale from the losses); a wrong un-permutation moves the outputs far outside the bounds.
Bad input: ValueErrors that name the argument, the rank and the sizes.
"""
import copy
import functools

import pytest
import torch
import torch.distributed as dist

from harness import run_ranks
from parallel_cases import CFG, batches, local

D_MODEL, HIDDEN = 12, 16
LR, WD, CLIP, STEPS = 1e-2, 0.1, 0.5, 3
LAYER_RTOL = 2e-5


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| over the largest |want| (0 when both are all zero)."""
    scale = float(want.detach().abs().max()) if want.numel() else 0.0
    err = float((got.detach() - want.detach()).abs().max()) if want.numel() else 0.0
    return err / scale if scale else err


def tokens(world: int, case: str) -> list[int]:
    if case == "no-tokens-on-rank-1":
        return [6] + [0] + [7] * (world - 2)
    return [5 + 3 * r for r in range(world)]


def forced_experts(case: str, n: int, top_k: int, experts: int):
    """Routing a test fixes by hand (None: the router's). 'skewed': every copy to experts 0 and 1 (both on
    rank 0): the other ranks receive nothing and experts 2.. get no token. 'last-expert': top-1, every token
    to the last expert (the last rank computes everything)."""
    if case.startswith("skewed"):
        return torch.tensor([[0, 1] if t % 3 else [1, 0] for t in range(n)], dtype=torch.long)[:, :top_k]
    if case == "last-expert":
        return torch.full((n, 1), experts - 1, dtype=torch.long)
    return None


LAYER_CASES = {
    # name: MoEConfig arguments
    "top1-gelu": dict(top_k=1),
    "top2-swiglu": dict(top_k=2, activation="swiglu"),
    "top1-switch-weights": dict(top_k=1, renormalize=False),
    "top2-capacity": dict(top_k=2, capacity_factor=0.6),
    "skewed-top2": dict(top_k=2),
    "skewed-top2-capacity": dict(top_k=2, capacity_factor=1.0, activation="swiglu"),
    "last-expert": dict(top_k=1, renormalize=False),
    "no-tokens-on-rank-1": dict(top_k=2),
}


def layer_case(rank, world, name, kwargs) -> float:
    from ringzero.models import MoEConfig, MoEFeedForward
    from ringzero.parallel.expert import ExpertParallelMoE
    experts = 2 * world
    torch.manual_seed(0)
    full = MoEFeedForward(D_MODEL, HIDDEN, MoEConfig(experts=experts, **kwargs))
    g = torch.Generator().manual_seed(1)
    counts = tokens(world, name)
    xs = [torch.randn(n, D_MODEL, generator=g) for n in counts]
    weights = [torch.randn(n, D_MODEL, generator=g) for n in counts]
    forced = [forced_experts(name, n, full.top_k, experts) for n in counts]

    # One process, every expert: each rank's tokens in turn, the losses summed.
    ref = copy.deepcopy(full)
    ref_x, ref_y, ref_loss, total = [], [], [], 0.0
    for x, w, f in zip(xs, weights, forced):
        x = x.clone().requires_grad_()
        y = ref(x, experts=f)
        loss = (y * w).sum() + ref.aux_loss
        ref_x.append(x), ref_y.append(y), ref_loss.append(loss)
        total = total + loss
    total.backward()
    # last_counts: the copies each expert computed for the last rank's tokens
    if name.startswith("skewed"):
        assert int(ref.last_counts[2:].sum()) == 0, "experts 2.. should get no token"
    if "capacity" in name:
        assert int(ref.last_counts.sum()) < counts[-1] * full.top_k, f"{name}: the capacity should drop copies"

    ep = ExpertParallelMoE(copy.deepcopy(full))
    assert ep.local_count == 2 and ep.first_expert == 2 * rank
    x = xs[rank].clone().requires_grad_()
    y = ep(x, experts=forced[rank])
    loss = (y * weights[rank]).sum() + ep.aux_loss
    loss.backward()

    errors = {"output": rel_error(y, ref_y[rank]), "loss": rel_error(loss, ref_loss[rank]),
              "input grad": rel_error(x.grad, ref_x[rank].grad)}
    router_grad = ep.router.weight.grad.clone()
    dist.all_reduce(router_grad)  # gloo: the sum over ranks of each rank's router gradient
    errors["router grad"] = rel_error(router_grad, ref.router.weight.grad)
    lo, hi = ep.first_expert, ep.first_expert + ep.local_count
    for n, p in ep.experts.named_parameters():
        errors[f"experts.{n} grad"] = rel_error(p.grad, getattr(ref.experts, n).grad[lo:hi])
        errors[f"experts.{n}"] = rel_error(p, getattr(ref.experts, n)[lo:hi])
    worst = max(errors.values())
    assert worst <= LAYER_RTOL, f"{name} on rank {rank} of {world}: {errors}"
    return worst


def training_case(rank, world, wrap, mesh) -> tuple[float, float, float]:
    from ringzero.models import MoEConfig, MoEGPT, lm_loss
    from ringzero.parallel.expert import ExpertDataParallel, expert_parallel
    ep = mesh.size("ep")
    torch.manual_seed(0)
    base = MoEGPT(CFG, MoEConfig(experts=2 * ep, top_k=2, hidden=24, activation="swiglu"))
    data = batches(world, STEPS)

    ref = copy.deepcopy(base)
    opt = torch.optim.AdamW(ref.parameters(), lr=LR, weight_decay=WD)
    ref_losses, ref_norms = [], []
    for step in data:
        total = 0.0
        for s in range(world):
            x, y = local(step[0], s)
            total = total + (lm_loss(ref(x), y) + ref.aux_loss()) / world
        total.backward()
        ref_losses.append(float(total))
        ref_norms.append(float(torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP)))
        opt.step()
        opt.zero_grad()

    model = expert_parallel(copy.deepcopy(base), mesh.group("ep"))
    wrapped = ExpertDataParallel(model, mesh.group("dp"), mesh.group("edp"), wrap=wrap)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=LR, weight_decay=WD)
    losses, norms = [], []
    for step in data:
        x, y = local(step[0], rank)
        loss = lm_loss(wrapped(x), y) + model.aux_loss()
        loss.backward()
        norms.append(float(wrapped.clip_grad_norm_(CLIP)))
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / world)
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    norm_err = max(abs(a - b) / abs(b) for a, b in zip(norms, ref_norms))

    if hasattr(wrapped.dense, "gather_params"):
        wrapped.dense.gather_params()  # ZeRO: the last step's shards into the module's weights
    want = dict(ref.named_parameters())
    param_err = 0.0
    for n, p in model.named_parameters():
        w = want[n]
        if ".experts." in n:
            lo = 2 * mesh.index("ep")  # two experts per rank
            w = w[lo:lo + 2]
        param_err = max(param_err, float((p.detach() - w.detach()).abs().max()))
    assert loss_err <= 1e-5 and norm_err <= 1e-5 and param_err <= 1e-4, \
        f"rank {rank} of {world}: losses {losses} vs {ref_losses}, norms {norms} vs {ref_norms}, param error {param_err}"
    return loss_err, norm_err, param_err


def bad_input(rank, world):
    from ringzero.models import MoEConfig, MoEFeedForward
    from ringzero.parallel import Mesh
    from ringzero.parallel.expert import ExpertParallelMoE, all_to_all_v
    moe = MoEFeedForward(D_MODEL, HIDDEN, MoEConfig(experts=2 * world, top_k=2))
    with pytest.raises(ValueError, match=rf"num_experts={world + 1} must be divisible by the expert-parallel size "
                                         rf"{world} \(rank {rank} of {world}\)"):
        ExpertParallelMoE(MoEFeedForward(D_MODEL, HIDDEN, MoEConfig(experts=world + 1, top_k=1)))
    ep = ExpertParallelMoE(moe)
    bad = torch.tensor([[0, 2 * world]] * 3)
    with pytest.raises(ValueError, match=rf"experts on ep rank {rank} of {world}: ids must lie in \[0, {2 * world}\).*"
                                         rf"from 0 to {2 * world}"):
        ep(torch.randn(3, D_MODEL), experts=bad)
    with pytest.raises(ValueError, match=r"experts on ep rank .* must have shape \(tokens, top_k\) = \(3, 2\)"):
        ep(torch.randn(3, D_MODEL), experts=torch.zeros(3, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=rf"^experts: ids must lie in \[0, {2 * world}\)"):
        moe(torch.randn(3, D_MODEL), experts=bad)  # one process: no rank to name
    with pytest.raises(ValueError, match="experts on ep rank .* must be an integer tensor"):
        ep(torch.randn(3, D_MODEL), experts=bad.float())
    with pytest.raises(ValueError, match="MoEConfig.top_k=3 must be at most experts=2"):
        MoEConfig(experts=2, top_k=3)
    x = torch.randn(4, D_MODEL)
    with pytest.raises(ValueError, match=rf"input_split_sizes=\[5, 0.*summing to the 4 rows .*rank {rank} of {world}"):
        all_to_all_v(x, [4] + [0] * (world - 1), [5] + [0] * (world - 1))
    with pytest.raises(ValueError, match=rf"output_split_sizes=\[4\] must hold {world} .*rank {rank} of {world}"):
        all_to_all_v(x, [4], [4] + [0] * (world - 1))
    with pytest.raises(ValueError, match=rf"ep={world + 1} must divide dp={world}"):
        Mesh(ep=world + 1)
    with pytest.raises(ValueError, match="built with ep=1"):
        Mesh().group("ep")
    mesh = Mesh(ep=world)
    assert mesh.ranks("ep") == list(range(world)) and mesh.ranks("edp") == [rank]
    assert (mesh.index("ep"), mesh.size("edp")) == (rank, 1)


def run_all(rank, world, ep, layer_cases, wrappers):
    from ringzero.parallel import DistributedDataParallel, Mesh, ZeroDataParallel
    results = {name: layer_case(rank, world, name, LAYER_CASES[name]) for name in layer_cases}
    wraps = {"ddp": DistributedDataParallel, "zero1": functools.partial(ZeroDataParallel, stage=1),
             "zero2": functools.partial(ZeroDataParallel, stage=2)}
    mesh = Mesh(ep=ep)
    for name in wrappers:
        results[name] = training_case(rank, world, wraps[name], mesh)
    if layer_cases:
        bad_input(rank, world)
    return results


def show(results):
    print({k: (f"{v:.1e}" if isinstance(v, float) else [f"{e:.1e}" for e in v]) for k, v in results.items()})


@pytest.mark.parametrize("world", [2, 3])
def test_expert_parallel_matches_one_process_with_every_expert(world):
    """Pure expert parallelism: the ep group is the world (each expert lives once)."""
    show(run_ranks(world, run_all, world, list(LAYER_CASES), ["ddp", "zero1", "zero2"], timeout_s=300)[0])


def test_data_parallel_times_expert_parallel_on_four_ranks():
    """Mesh(ep=2) on 4 ranks: two ep groups, each expert on two ranks (its edp group) that average its
    gradient; the replicated parameters averaged over all 4."""
    show(run_ranks(4, run_all, 2, [], ["ddp", "zero1"], timeout_s=300)[0])
