"""The CUDA fused Adam kernel and sum-of-squares pass, when a GPU is present: the same 50-step cases as
test_adam_ops.py (reference: torch.optim.Adam/AdamW in float64 on the CPU, fed the same gradients),
with lr/step/inv_scale/clip_coef/found_inf as device tensors where the case says so, and
FusedAdamW on CUDA parameters against torch.optim.AdamW in float64. Skipped without CUDA: on a CPU-only
machine the kernels are compiled by nvcc (CMake) but never run.
"""
import warnings

import pytest
import torch

import ringzero
from test_adam_ops import CASES, SIZES, run_case

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
