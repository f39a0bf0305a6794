"""The CUDA fused Adam kernel and sum-of-squares pass, when a GPU is present: the same 50-step cases as
test_adam_ops.py (reference: torch.optim.Adam/AdamW in float64 on the CPU, fed the same gradients),
with lr/step/inv_scale/clip_coef/found_inf as device tensors where the case says so, and
FusedAdamW on CUDA parameters against torch.optim.AdamW in float64. The multi-tensor path (32 tensors per
launch, 16384-element chunks): more tensors than one launch holds, sizes 0, 1, primes and chunk
boundaries, params that miss steps (their own step counts), mixed dtypes in one optimizer, and a step
captured in a CUDA graph and replayed against the same step run eagerly (bitwise). Skipped without CUDA:
on a CPU-only machine the kernels are compiled by nvcc (CMake) but never run.
"""
import warnings

import pytest
import torch

import ringzero
from adam_cases import CASES, SIZES, run_case

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# The GPU computes the bias corrections in float32 (powf) and sums squares in float32: a little more
# drift than the CPU's double coefficients; measured drift must stay under these.
CUDA_ATOL = {"moments_bf16": 5e-3}


@pytest.mark.parametrize("name", list(CASES))
def test_cuda_adam_step_matches_float64_reference(name):
    params, ref, o = run_case(CASES[name], device="cuda")
    atol = CUDA_ATOL.get(name, 3e-5)
    for n, p, r in zip(SIZES, params, ref):
        err = (p.double().cpu() - r.detach()).abs().max().item() if n else 0.0
        assert err <= atol, f"{name}: size {n}: max |ours - float64 torch| = {err:.3g} > {atol}"


def test_cuda_fused_adamw_with_grad_scaler_matches_torch():
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(s, generator=gen) for s in [(7, 13), (1031,), (1,)]]
    ours = [t.cuda().requires_grad_() for t in init]
    ref = [t.double().requires_grad_() for t in init]
    opt = ringzero.optim.FusedAdamW(ours, lr=1e-2, amsgrad=True)
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, amsgrad=True, foreach=False)
    scaler = torch.amp.GradScaler("cuda", init_scale=256.0)
    for k in range(30):
        targets = [torch.randn(t.shape, generator=gen) for t in init]
        if k == 7:
            targets[1][3] = float("inf")
        for p in ours:
            p.grad = None
        scaler.scale(sum((p * t.cuda()).sum() for p, t in zip(ours, targets))).backward()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # GradScaler's notice about a future convention
            scaler.step(opt)
        scaler.update()
        if k != 7:
            for r, t in zip(ref, targets):
                r.grad = t.double()
            ref_opt.step()
    for p, r in zip(ours, ref):
        assert (p.double().cpu() - r.detach()).abs().max().item() <= 3e-5


# Sizes around the 16384-element chunk and the 4-element packed loads, primes, and empty tensors; 75 of
# them, so one bucket needs three launches of 32.
ODD_SIZES = [0, 1, 3, 13, 1031, 16383, 16384, 16385, 32771, 100003, 4, 5, 0, 65537, 7]
MANY = (ODD_SIZES * 5)[:75]


def _reference_run(sizes, steps, seed, skip, opt_kwargs, dtype=torch.float32):
    """FusedAdamW on CUDA params of `dtype` and torch.optim.AdamW in float64 on the CPU, fed the same
    gradients (as stored in `dtype`); param k gets no gradient on the steps where skip(k, step)."""
    print(f"seed {seed}")
    gen = torch.Generator().manual_seed(seed)
    init = [torch.randn(n, generator=gen).to(dtype) for n in sizes]
    ours = [t.cuda().requires_grad_() for t in init]
    ref = [t.double().requires_grad_() for t in init]
    opt = ringzero.optim.FusedAdamW(ours, **opt_kwargs)
    ref_opt = torch.optim.AdamW(ref, foreach=False, **{k: v for k, v in opt_kwargs.items() if k != "master_weights"})
    for step in range(steps):
        for k, (p, r) in enumerate(zip(ours, ref)):
            g = None if skip(k, step) else torch.randn(p.shape, generator=gen).to(dtype)
            p.grad = None if g is None else g.cuda()
            r.grad = None if g is None else g.double()
        opt.step()
        ref_opt.step()
    return opt, ref_opt, ours, ref


def test_cuda_multi_tensor_step_many_odd_tensors_with_own_step_counts():
    # Every third param misses steps 2 and 5, so its step count (and bias correction) differs.
    opt, ref_opt, ours, ref = _reference_run(MANY, 12, 1, lambda k, s: k % 3 == 0 and s in (2, 5),
                                    dict(lr=1e-2, weight_decay=0.1, amsgrad=True))
    for k, (p, r) in enumerate(zip(ours, ref)):
        err = (p.detach().double().cpu() - r.detach()).abs().max().item() if p.numel() else 0.0
        assert err <= 3e-5, f"param {k} (size {p.numel()}): max |ours - float64 torch| = {err:.3g}"
        assert float(opt.state[p]["step"]) == float(ref_opt.state[r]["step"]), f"param {k}: step count differs"


def test_cuda_multi_tensor_mixed_dtypes_with_master_weights():
    sizes = [16385, 1, 0, 100003, 13]
    for dtype in (torch.bfloat16, torch.float16):
        opt, _, ours, ref = _reference_run(sizes, 10, 2, lambda k, s: False,
                                        dict(lr=1e-2, weight_decay=0.1, master_weights=True), dtype=dtype)
        for p, r in zip(ours, ref):
            if not p.numel():
                continue
            master = opt.state[p]["master_param"].double().cpu()
            assert (master - r.detach()).abs().max().item() <= 3e-5, f"{dtype}: master drifted"
            assert torch.equal(p.detach(), opt.state[p]["master_param"].to(dtype)), f"{dtype}: param is not the rounded master"


def test_multi_tensor_op_equals_one_call_per_tensor():
    """ops.adam_step_multi_ over 75 tensors (three launches) with per-tensor device steps gives the same
    bits as one call per tensor (the same element arithmetic, only the launch geometry differs)."""
    gen = torch.Generator().manual_seed(3)
    make = lambda: [torch.randn(n, generator=gen).cuda() for n in MANY]  # noqa: E731
    params, grads, m, v = make(), make(), make(), [x.abs() for x in make()]
    steps = [torch.tensor(float(1 + k % 4), device="cuda") for k in range(len(MANY))]
    copies = [[x.clone() for x in xs] for xs in (params, m, v)]
    hyper = dict(lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1)
    ringzero.ops.adam_step_multi_(params, grads, m, v, step=steps, **hyper)
    for k in range(len(MANY)):
        ringzero.ops.adam_step_(copies[0][k], grads[k], copies[1][k], copies[2][k], step=steps[k], **hyper)
    for name, got, want in zip(("param", "exp_avg", "exp_avg_sq"), (params, m, v), copies):
        for k, (a, b) in enumerate(zip(got, want)):
            assert torch.equal(a, b), f"{name} {k} (size {MANY[k]}) differs between the multi and the single call"


def test_multi_tensor_sum_squares_and_found_inf():
    gen = torch.Generator().manual_seed(4)
    xs = [torch.randn(n, generator=gen).cuda().to(torch.bfloat16 if k % 2 else torch.float32)
          for k, n in enumerate(MANY)]
    want = sum(float((x.double() ** 2).sum()) for x in xs)
    found = torch.zeros(1, device="cuda")
    got = float(ringzero.ops.sum_squares(xs, found_inf=found))
    assert abs(got - want) <= 1e-5 * want and float(found) == 0.0
    xs[70][3] = float("nan")  # in the third launch
    ringzero.ops.sum_squares(xs, found_inf=found)
    assert float(found) == 1.0, "a NaN in the 71st tensor was not seen"


def test_cuda_graph_capture_replays_like_eager():
    """The same FusedAdamW step, eager on one copy of the params and captured once in a CUDA graph then
    replayed on another, with new gradients and a new lr (a CUDA tensor) each step: identical bits."""
    gen = torch.Generator().manual_seed(5)
    init = [torch.randn(n, generator=gen) for n in MANY if n]
    eager = [t.cuda().requires_grad_() for t in init]
    graphed = [t.cuda().requires_grad_() for t in init]
    lr_e, lr_g = torch.tensor(1e-2, device="cuda"), torch.tensor(1e-2, device="cuda")
    opt_e = ringzero.optim.FusedAdamW(eager, lr=lr_e, weight_decay=0.1, amsgrad=True)
    opt_g = ringzero.optim.FusedAdamW(graphed, lr=lr_g, weight_decay=0.1, amsgrad=True)
    for p in graphed:
        p.grad = torch.zeros_like(p)
    grads = [[torch.randn(t.shape, generator=gen).cuda() for t in init] for _ in range(6)]
    # Step 0 eagerly on both (allocates the state), then capture step 1 on a side stream.
    for ps, opt in ((eager, opt_e), (graphed, opt_g)):
        for p, g in zip(ps, grads[0]):
            p.grad = g.clone()
        opt.step()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        with torch.cuda.graph(graph, stream=side):
            opt_g.step()
    torch.cuda.current_stream().wait_stream(side)
    # Capture does not run the step; every replay below is one step.
    for k in range(1, 6):
        lr = 1e-2 / k
        lr_e.fill_(lr)
        lr_g.fill_(lr)
        for p, q, g in zip(eager, graphed, grads[k]):
            p.grad = g.clone()
            q.grad.copy_(g)
        opt_e.step()
        graph.replay()
    torch.cuda.synchronize()
    for k, (a, b) in enumerate(zip(eager, graphed)):
        assert torch.equal(a, b), f"param {k}: graph replay differs from eager"
        assert torch.equal(opt_e.state[a]["step"], opt_g.state[b]["step"])
