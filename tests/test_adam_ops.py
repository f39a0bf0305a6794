"""ringzero.ops.adam_step_ / adam_step_multi_ / sum_squares on the CPU against torch.optim.Adam/AdamW run
in float64 on the same gradients, over 50 steps with fresh random gradients each step, for every option:
Adam/AdamW, weight decay, maximize, AMSGrad, 16-bit gradients, float32 masters writing bfloat16/float16
params, bfloat16 moments, loss-scale unscaling, clipping to a global norm (reference:
torch.nn.utils.clip_grad_norm_ in float64) and found_inf skipping exactly the steps with an inf/NaN.

The reference sees the gradients exactly as stored (after 16-bit rounding), so differences come only from
our float32 arithmetic (and bfloat16 rounding of moments/params): tolerances are stated per case below.
Tensor sizes 0, 1, 13 (prime), 1031 (prime) and 70001 (prime, more than one 65536-element CPU chunk).
"""
import math

import pytest
import torch

from ringzero import ops

SIZES = [0, 1, 13, 1031, 70001]
STEPS = 50
LR, BETAS, EPS = 1e-2, (0.9, 0.99), 1e-8

# name: options. Keys: adamw, wd, maximize, amsgrad, grad (dtype), master (16-bit param_out dtype or None),
# moments (dtype), loss_scale, max_norm, inf_steps, tensor_scalars (lr/step as tensors), atol.
# atol: float32 arithmetic over 50 steps of size ~lr drifts by ~1e-6 (measured 3e-6); bfloat16 moments
# carry 2^-9 relative rounding each step into the update (measured 1.6e-3 at lr 1e-2).
BASE = dict(adamw=True, wd=0.1, maximize=False, amsgrad=False, grad=torch.float32, master=None,
            moments=torch.float32, loss_scale=None, max_norm=None, inf_steps=(), tensor_scalars=False, atol=2e-5)
CASES = {
    "adamw": {},
    "adam_no_wd": dict(adamw=False, wd=0.0),
    "adam_l2": dict(adamw=False, wd=0.1),
    "maximize": dict(maximize=True),
    "amsgrad_adamw": dict(amsgrad=True),
    "amsgrad_adam": dict(amsgrad=True, adamw=False, wd=0.05),
    "grad_bf16": dict(grad=torch.bfloat16),
    "grad_f16": dict(grad=torch.float16),
    "master_bf16": dict(grad=torch.bfloat16, master=torch.bfloat16),
    "master_f16": dict(grad=torch.float16, master=torch.float16),
    "moments_bf16": dict(moments=torch.bfloat16, atol=5e-3),
    "unscale": dict(loss_scale=1024.0),
    "clip": dict(max_norm=5.0),
    "found_inf": dict(loss_scale=256.0, inf_steps=(4, 17, 18, 49)),
    "tensor_lr_step": dict(tensor_scalars=True),
    "mixed_precision": dict(grad=torch.bfloat16, master=torch.bfloat16, loss_scale=4096.0, max_norm=20.0,
                            inf_steps=(9, 30), amsgrad=True),
}


def run_case(opts, seed=0, device="cpu"):
    """Runs one case on `device`; returns (our params, float64 reference params on the CPU, options)."""
    o = {**BASE, **opts}
    gen = torch.Generator().manual_seed(seed)
    init = [torch.randn(n, generator=gen, dtype=torch.float64) for n in SIZES]
    ref = [t.clone().requires_grad_() for t in init]
    ref_cls = torch.optim.AdamW if o["adamw"] else torch.optim.Adam
    ref_opt = ref_cls(ref, lr=LR, betas=BETAS, eps=EPS, weight_decay=o["wd"], amsgrad=o["amsgrad"],
                      maximize=o["maximize"], foreach=False)
    params = [t.float().to(device) for t in init]
    outs = [torch.empty(n, dtype=o["master"], device=device) for n in SIZES] if o["master"] else None
    zeros = lambda: [torch.zeros(n, dtype=o["moments"], device=device) for n in SIZES]  # noqa: E731
    m, v = zeros(), zeros()
    vmax = zeros() if o["amsgrad"] else None
    step = 0
    for k in range(STEPS):
        scale = o["loss_scale"] or 1.0
        grads = [(torch.randn(n, generator=gen, dtype=torch.float64) * scale).to(o["grad"]).to(device) for n in SIZES]
        bad = k in o["inf_steps"]
        if bad:
            grads[3][k % 1031] = float("nan") if k % 2 else float("inf")
        inv = torch.tensor(1.0 / scale, device=device) if o["loss_scale"] else None
        found = torch.zeros(1, device=device) if o["inf_steps"] else None
        coef = None
        if o["max_norm"] is not None or found is not None:
            sumsq = ops.sum_squares(grads, inv_scale=inv, found_inf=found)
            if o["max_norm"] is not None:
                coef = ops.clip_coef(sumsq, o["max_norm"])
        assert found is None or bool(found.item()) == bad, f"step {k}: found_inf={found.item()} but bad={bad}"
        before = [t.clone() for t in params + m + v]
        lr, nxt = ((torch.tensor(LR, device=device), torch.tensor(float(step + 1), device=device))
                   if o["tensor_scalars"] else (LR, step + 1))
        ops.adam_step_multi_(params, grads, m, v, lr=lr, beta1=BETAS[0], beta2=BETAS[1], eps=EPS,
                             weight_decay=o["wd"], step=nxt, adamw=o["adamw"], maximize=o["maximize"],
                             inv_scale=inv, clip_coef=coef, found_inf=found, param_outs=outs,
                             max_exp_avg_sqs=vmax)
        if bad:  # skipped: nothing may have been written, and the reference does not step either
            for b, a in zip(before, params + m + v):
                assert torch.equal(b, a), f"step {k} should have been skipped"
            continue
        step += 1
        for r, g in zip(ref, grads):
            r.grad = g.double().cpu() / scale
        if o["max_norm"] is not None:
            torch.nn.utils.clip_grad_norm_(ref, o["max_norm"])
        ref_opt.step()
        if outs is not None:  # the 16-bit copy is the updated master rounded once, written in the same pass
            for p, q in zip(params, outs):
                assert torch.equal(q, p.to(o["master"])), f"step {k}: param_out is not the master rounded"
    return params, ref, o


@pytest.mark.parametrize("name", list(CASES))
def test_adam_step_matches_float64_reference(name):
    params, ref, o = run_case(CASES[name])
    for n, p, r in zip(SIZES, params, ref):
        err = (p.double().cpu() - r.detach()).abs().max().item() if n else 0.0
        assert err <= o["atol"], f"{name}: size {n}: max |ours - float64 torch| = {err:.3g} > {o['atol']}"


def test_single_flat_call_equals_list_call():
    """adam_step_ on one flat buffer (ZeRO's shard) gives bitwise the list result on the same data."""
    gen = torch.Generator().manual_seed(3)
    p = torch.randn(70001, generator=gen)
    g = torch.randn(70001, generator=gen).bfloat16()
    state = [p.clone(), torch.zeros_like(p), torch.zeros_like(p), torch.empty(70001, dtype=torch.bfloat16)]
    split = [state2.clone() for state2 in state]
    kw = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, step=1)
    ops.adam_step_(state[0], g, state[1], state[2], param_out=state[3], **kw)
    cuts = [0, 13, 1044, 70001]
    pieces = lambda t: [t[a:b] for a, b in zip(cuts, cuts[1:])]  # noqa: E731
    ops.adam_step_multi_(pieces(split[0]), pieces(g), pieces(split[1]), pieces(split[2]),
                         param_outs=pieces(split[3]), **kw)
    for a, b in zip(state, split):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_sum_squares_matches_float64(dtype):
    gen = torch.Generator().manual_seed(5)
    xs = [torch.randn(n, generator=gen).to(dtype) for n in SIZES]
    want = sum((x.double() ** 2).sum() for x in xs) / 9.0
    found = torch.zeros(1)
    got = ops.sum_squares(xs, inv_scale=1.0 / 3.0, found_inf=found)
    assert got.dtype == torch.float32 and found.item() == 0.0
    assert math.isclose(got.item(), want.item(), rel_tol=1e-6)
    xs[2][7] = float("-inf")
    ops.sum_squares(xs, found_inf=found)
    assert found.item() == 1.0


@pytest.mark.parametrize("name", ["adamw", "mixed_precision", "moments_bf16"])
def test_threaded_step_matches_float64_and_is_the_same_for_any_thread_count(name):
    """The CPU step splits every tensor into 65536-element chunks over torch's threads (OpenMP): the
    float64 parity holds at 1, 2 and 3 threads, and the results are bitwise the same for all three."""
    if "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("this torch has no OpenMP thread pool (the step runs on one thread)")
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            params, ref, o = run_case(CASES[name])
            for n, p, r in zip(SIZES, params, ref):
                err = (p.double() - r.detach()).abs().max().item() if n else 0.0
                assert err <= o["atol"], f"{name}, {threads} threads: size {n}: error {err:.3g} > {o['atol']}"
            results.append(params)
    finally:
        torch.set_num_threads(before)
    for threads, params in zip((2, 3), results[1:]):
        for n, a, b in zip(SIZES, results[0], params):
            assert torch.equal(a, b), f"{name}: size {n}: {threads} threads differ from one thread"


def test_cpu_step_uses_torch_threads():
    """With two threads set, a large step runs on two OS threads (the extension is built against torch's
    OpenMP runtime; built without it, at::parallel_for silently runs on the caller's thread)."""
    if "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("this torch has no OpenMP thread pool")
    import os

    def busy_threads():
        ticks = {}
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks[tid] = int(fields[11]) + int(fields[12])  # utime + stime
        return ticks

    before = torch.get_num_threads()
    n = 1 << 22
    p, g, m, v = (torch.randn(n) for _ in range(4))
    v = v.abs()
    try:
        torch.set_num_threads(2)
        kw = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, step=1)
        ops.adam_step_(p, g, m, v, **kw)  # starts the pool
        start = busy_threads()
        for _ in range(40):
            ops.adam_step_(p, g, m, v, **kw)
        end = busy_threads()
    finally:
        torch.set_num_threads(before)
    worked = [tid for tid in end if end[tid] - start.get(tid, 0) >= 5]
    assert len(worked) >= 2, f"only {len(worked)} thread(s) did the work: {end} vs {start}"
