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

from adam_cases import CASES, SIZES, run_case
from ringzero import ops

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
