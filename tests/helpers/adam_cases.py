"""The Adam cases the CPU and CUDA Adam tests share (never imported from another test file): every option
of ringzero.ops.adam_step_multi_ run for 50 steps against torch.optim.Adam/AdamW in float64 on the same
gradients (see tests/optim/test_adam_ops.py for what each compares)."""
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
