"""ringzero.optim.FusedAdam/FusedAdamW as drop-in torch.optim.Adam/AdamW, single process on the CPU.

References: torch.optim.Adam/AdamW run in float64 on copies of the same parameters, fed the same
gradients (fresh random each step), over 50 steps: param groups with their own hyperparameters, a
parameter that gets no gradient on some steps (its step count lags, as in torch), float32 masters for
bfloat16/float16 parameters, bfloat16 moments. state_dict round trips in both directions with
torch.optim.AdamW (float32, continuing 10 steps after the load). torch.amp.GradScaler: against
torch.optim.AdamW driven by its own GradScaler, with inf gradients on chosen steps (both must skip the
same steps and end with the same scale). Tolerances as in test_adam_ops.py (measured drift ~4e-6).
"""
import copy
import warnings

import pytest
import torch

from ringzero.optim import FusedAdam, FusedAdamW

SHAPES = [(7, 13), (1,), (1031,), (0,), (3, 5, 2)]
STEPS = 50


def make_params(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    init = [torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]
    return [t.to(dtype).requires_grad_() for t in init], [t.to(dtype).double().requires_grad_() for t in init]


def groups(ps, wd2):
    return [{"params": ps[:2]}, {"params": ps[2:], "lr": 3e-3, "weight_decay": wd2, "betas": (0.8, 0.95)}]


def feed(ours, ref, gen, k, skip_param=None):
    for i, (p, r) in enumerate(zip(ours, ref)):
        if skip_param is not None and i == skip_param and k % 3 == 0:
            p.grad, r.grad = None, None  # no gradient this step: torch skips the param, so must we
            continue
        g = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype)
        p.grad, r.grad = g, g.double()


@pytest.mark.parametrize("cls,ref_cls,kw", [
    (FusedAdamW, torch.optim.AdamW, dict(weight_decay=0.1)),
    (FusedAdamW, torch.optim.AdamW, dict(amsgrad=True, maximize=True)),
    (FusedAdam, torch.optim.Adam, dict(weight_decay=0.0)),
    (FusedAdam, torch.optim.Adam, dict(weight_decay=0.05, amsgrad=True)),
])
def test_optimizer_matches_torch_float64(cls, ref_cls, kw):
    ours, ref = make_params(torch.float32)
    opt = cls(groups(ours, 0.2), lr=1e-2, **kw)
    ref_opt = ref_cls(groups(ref, 0.2), lr=1e-2, foreach=False, **kw)
    gen = torch.Generator().manual_seed(1)
    for k in range(STEPS):
        feed(ours, ref, gen, k, skip_param=2)
        opt.step()
        ref_opt.step()
    for p, r in zip(ours, ref):
        assert (p.double() - r).abs().max().item() <= 2e-5 if p.numel() else True
    for p, r in zip(ours, ref):
        assert opt.state[p]["step"].item() == ref_opt.state[r]["step"].item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("moments", [torch.float32, torch.bfloat16])
def test_master_weights(dtype, moments):
    """16-bit params with float32 masters: the masters follow float64 torch on the same (16-bit)
    gradients; each 16-bit param equals its master rounded once."""
    ours, ref = make_params(dtype)
    opt = FusedAdamW(ours, lr=1e-2, weight_decay=0.1, master_weights=True, moment_dtype=moments)
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1, foreach=False)
    gen = torch.Generator().manual_seed(2)
    for k in range(STEPS):
        feed(ours, ref, gen, k)
        opt.step()
        ref_opt.step()
    atol = 2e-5 if moments == torch.float32 else 5e-3
    for p, r in zip(ours, ref):
        master = opt.state[p]["master_param"]
        assert master.dtype == torch.float32 and opt.state[p]["exp_avg"].dtype == moments
        assert torch.equal(p.detach(), master.to(dtype))
        if p.numel():
            assert (master.double() - r).abs().max().item() <= atol


def run_steps(opt, params, gen, n):
    for _ in range(n):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()


@pytest.mark.parametrize("amsgrad", [False, True])
def test_state_dict_round_trips_with_torch_adamw(amsgrad):
    kw = dict(lr=1e-2, weight_decay=0.1, amsgrad=amsgrad)
    # torch -> ours: both continue from torch's state; ours must track torch continuing alone.
    a, _ = make_params(torch.float32, seed=4)
    b = [p.detach().clone().requires_grad_() for p in a]
    torch_opt = torch.optim.AdamW(a, **kw)
    run_steps(torch_opt, a, torch.Generator().manual_seed(5), 5)
    for p, q in zip(a, b):
        q.data.copy_(p.data)
    ours = FusedAdamW(b, **kw)
    ours.load_state_dict(torch_opt.state_dict())
    run_steps(torch_opt, a, torch.Generator().manual_seed(6), 10)
    run_steps(ours, b, torch.Generator().manual_seed(6), 10)
    for p, q in zip(a, b):
        torch.testing.assert_close(q, p, atol=2e-5, rtol=0)
    # ours -> torch: a fresh torch optimizer loads our state and continues like ours.
    c = [p.detach().clone().requires_grad_() for p in b]
    torch_opt2 = torch.optim.AdamW(c, **kw)
    # deepcopy as torch.save would: state_dict() returns references, and the two must not share moments.
    torch_opt2.load_state_dict(copy.deepcopy(ours.state_dict()))
    run_steps(ours, b, torch.Generator().manual_seed(7), 10)
    run_steps(torch_opt2, c, torch.Generator().manual_seed(7), 10)
    for p, q in zip(b, c):
        torch.testing.assert_close(p, q, atol=2e-5, rtol=0)
    assert torch_opt2.state_dict()["state"].keys() == ours.state_dict()["state"].keys()


@pytest.mark.parametrize("unscale_first", [False, True])
def test_grad_scaler_skips_and_unscales_like_torch(unscale_first):
    """unscale_first: the user calls scaler.unscale_(opt) before step (as for clipping), so the step gets
    unscaled gradients and the inf check recorded by GradScaler."""
    ours, _ = make_params(torch.float32, seed=8)
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    opt = FusedAdamW(ours, lr=1e-2)
    ref_opt = torch.optim.AdamW(theirs, lr=1e-2, foreach=False)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=3)
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=3)
    gen = torch.Generator().manual_seed(9)
    inf_steps = {3, 11, 12}
    for k in range(20):
        targets = [torch.randn(p.shape, generator=gen) for p in ours]
        if k in inf_steps:
            targets[2][5] = float("inf")
        for params, sc in ((ours, scaler), (theirs, ref_scaler)):
            for p in params:
                p.grad = None
            loss = sum((p * t).sum() for p, t in zip(params, targets))
            sc.scale(loss).backward()  # grads = targets * scale
        if unscale_first:
            scaler.unscale_(opt)
            ref_scaler.unscale_(ref_opt)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # GradScaler announces a future calling convention
            scaler.step(opt)
        ref_scaler.step(ref_opt)
        scaler.update()
        ref_scaler.update()
        assert scaler.get_scale() == ref_scaler.get_scale(), f"step {k}"
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p, q, atol=2e-5, rtol=0)
        assert opt.state[p]["step"].item() == 20 - len(inf_steps)


def test_bad_arguments_raise_clear_errors():
    p = torch.zeros(4, requires_grad=True)
    with pytest.raises(ValueError, match="learning rate"):
        FusedAdamW([p], lr=-1.0)
    with pytest.raises(ValueError, match="betas"):
        FusedAdamW([p], betas=(1.0, 0.9))
    with pytest.raises(TypeError, match="moment_dtype"):
        FusedAdamW([p], moment_dtype=torch.float16)
    with pytest.raises(TypeError, match="float64"):
        FusedAdamW([torch.zeros(3, dtype=torch.float64, requires_grad=True)])
    with pytest.raises(ValueError, match="contiguous"):
        FusedAdamW([torch.zeros(4, 4).t().requires_grad_()])
    from ringzero import ops
    m = torch.zeros(4)
    kw = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, step=1)
    with pytest.raises(ValueError, match="grad has 3 elements"):
        ops.adam_step_(p.detach(), torch.zeros(3), m, m.clone(), **kw)
    with pytest.raises(TypeError, match="exp_avg has dtype torch.float16"):
        ops.adam_step_(p.detach(), m, m.half(), m.half(), **kw)
    with pytest.raises(ValueError, match="step=0.0 must be >= 1"):
        ops.adam_step_(p.detach(), m, m.clone(), m.clone(), **{**kw, "step": 0})
    with pytest.raises(ValueError, match="beta2=1.0 must be < 1"):
        ops.adam_step_(p.detach(), m, m.clone(), m.clone(), **{**kw, "beta2": 1.0})
    with pytest.raises(ValueError, match="must be contiguous"):
        ops.adam_step_(torch.zeros(2, 2).t(), torch.zeros(4), m, m.clone(), **kw)
    with pytest.raises(ValueError, match="tensors is empty"):
        ops.sum_squares([])
