"""ringzero.ops.adam_step_ / adam_step_multi_ / sum_squares on the CPU against torch.optim.Adam/AdamW run
in float64 on the same gradients, over 50 steps with fresh random gradients each step, for every option:
Adam/AdamW, weight decay, maximize, AMSGrad, 16-bit gradients, float32 masters writing bfloat16/float16
params, bfloat16 moments, loss-scale unscaling, clipping to a global norm (reference:
torch.nn.utils.clip_grad_norm_ in float64) and found_inf skipping exactly the steps with an inf/NaN.

The reference sees the gradients exactly as stored (after 16-bit rounding), so differences come only from
our float32 arithmetic (and bfloat16 rounding of moments/params): tolerances are stated per case below.
Tensor sizes 0, 1, 13 (prime), 1031 (prime) and 70001 (prime, more than four 16384-element CPU chunks).
"""
import math
import time

import pytest
import torch

from adam_cases import CASES, SIZES, run_case
import ringzero
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sum_squares_of_huge_finite_values_does_not_set_found_inf(dtype):
    """Squares of |x| > 1.8e19 overflow the kernel's float32 lanes; it must then sum again in double, so
    found_inf (any element inf or NaN) stays 0. The float32 result is inf, as float(want) is."""
    x = torch.full((70001,), 1e3, dtype=dtype)
    x[[5, 37, 600, 65536 + 17]] = 1e20  # squares 1e40: beyond float32, finite in double
    want = (x.double() ** 2).sum()
    found = torch.zeros(1)
    got = ops.sum_squares([x], found_inf=found)
    assert found.item() == 0.0
    assert got.item() == want.float().item() == float("inf")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("where", [0, 31, 32, 511, 512, 513, 16383, 16384, 65536, 70000])
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_sum_squares_flags_one_non_finite_element_anywhere(dtype, where, bad):
    """One inf or NaN at a lane, block or chunk edge (or in a tail) makes the sum non-finite and sets
    found_inf; the other elements are ordinary."""
    x = torch.linspace(-2, 2, 70001).to(dtype)
    x[where] = bad
    found = torch.zeros(1)
    got = ops.sum_squares([x], found_inf=found).item()
    assert found.item() == 1.0 and not math.isfinite(got)


def test_sum_squares_is_the_same_for_any_thread_count():
    """Partial sums are per 16384-element chunk and added in order: bitwise the same at 1, 2 and 3
    threads, for sizes around the 512-element block and the chunk."""
    if "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("this torch has no OpenMP thread pool (the sum runs on one thread)")
    gen = torch.Generator().manual_seed(11)
    xs = [torch.randn(n, generator=gen).to(dt) for n in (0, 1, 31, 511, 513, 16385, 65537, 200003)
          for dt in (torch.float32, torch.bfloat16, torch.float16)]
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append([ops.sum_squares([x]).item() for x in xs])
    finally:
        torch.set_num_threads(before)
    assert results[0] == results[1] == results[2]
    want = [(x.double() ** 2).sum().item() for x in xs]
    for got, w, x in zip(results[0], want, xs):
        assert math.isclose(got, w, rel_tol=1e-6, abs_tol=1e-30), (x.numel(), x.dtype, got, w)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_param_out_rounds_like_torch(out_dtype):
    """param_out is the updated float32 param rounded to nearest even, as torch's .to() rounds: ties,
    values just under a tie, subnormals, overflow to inf and NaN, through the vector loop and its tail
    (lr = 0 and zero gradients leave the param as it was; an infinite param is not among them: the kernel
    adds weight_decay * param to the gradient unconditionally, so 0 * inf makes it NaN, where torch's
    AdamW would keep it inf)."""
    gen = torch.Generator().manual_seed(8)
    bits = torch.randint(-2**31, 2**31 - 1, (2000,), generator=gen, dtype=torch.int64).to(torch.int32)
    bits = bits[~bits.view(torch.float32).isinf()]
    special = torch.tensor([0.0, -0.0, 1.0, 1.00390625, 1.005859375, 1.0039062, 3.3895314e38, 3.4e38, -3.4e38,
                            65504.0, 65520.0, 1e-40, -1e-40, 6e-8, float("nan")])
    p = torch.cat([special, bits.view(torch.float32), special[:5]])  # ~2020 elements: vector blocks and a tail
    want = p.to(out_dtype)
    out = torch.empty_like(want)
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    ops.adam_step_(p.clone(), torch.zeros(p.numel(), dtype=out_dtype), m, v, lr=0.0, beta1=0.9, beta2=0.999,
                   eps=1e-8, weight_decay=0.0, step=1, param_out=out)
    nan = p.isnan()
    assert torch.equal(out[~nan].view(torch.int16), want[~nan].view(torch.int16))
    assert out[nan].isnan().all()


def test_clip_coef_on_the_cpu_is_the_float64_formula_rounded_once():
    """The CPU clip coefficient is min(1, max_norm / (sqrt(s) + eps)) in double, rounded to the dtype of
    s; within an ulp of torch's float32 tensor formula; inf -> 0, NaN -> NaN, 0 with eps=0 -> 1."""
    gen = torch.Generator().manual_seed(21)
    values = (torch.rand(500, generator=gen, dtype=torch.float64) * 80 - 40).exp2().tolist() + [0.0, 1.0, 3.4e38]
    for v in values:
        for max_norm in (1.0, 0.5, 7.3, 1e-3):
            s = torch.tensor(v, dtype=torch.float32)
            got = ops.clip_coef(s, max_norm)
            want = min(1.0, max_norm / (math.sqrt(s.item()) + 1e-6))
            assert got.dtype == torch.float32 and got.shape == () and got.item() == torch.tensor(want).float().item()
            torch_formula = torch.clamp(max_norm / (s.sqrt() + 1e-6), max=1.0)
            assert math.isclose(got.item(), torch_formula.item(), rel_tol=3e-7), (v, max_norm)
    assert ops.clip_coef(torch.tensor(float("inf")), 1.0).item() == 0.0
    assert math.isnan(ops.clip_coef(torch.tensor(float("nan")), 1.0).item())
    assert ops.clip_coef(torch.tensor(0.0), 1.0, eps=0.0).item() == 1.0
    assert ops.clip_coef(torch.tensor(4.0, dtype=torch.float64), 1.0).dtype == torch.float64


@pytest.mark.parametrize("name", ["adamw", "mixed_precision", "moments_bf16"])
def test_threaded_step_matches_float64_and_is_the_same_for_any_thread_count(name):
    """The CPU step splits every tensor into 16384-element chunks over torch's threads (OpenMP): the
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
        # Steps until the process has used 40 ticks of CPU (a fixed count of steps took under 5 ticks per
        # thread on a fast machine), so that each of two working threads shows at least 5.
        deadline = time.monotonic() + 30
        while True:
            for _ in range(10):
                ops.adam_step_(p, g, m, v, **kw)
            end = busy_threads()
            if sum(end[t] - start.get(t, 0) for t in end) >= 40 or time.monotonic() > deadline:
                break
    finally:
        torch.set_num_threads(before)
    worked = [tid for tid in end if end[tid] - start.get(tid, 0) >= 5]
    assert len(worked) >= 2, f"only {len(worked)} thread(s) did the work: {end} vs {start}"


def test_adam_traffic_adds_the_gradient_to_the_three_state_buffers():
    """The benchmarks' memory floor (_C.adam_traffic_: p, m, v += g) does what it says, over sizes around
    the chunk, so the bytes it is credited with are really moved."""
    gen = torch.Generator().manual_seed(4)
    for n in (1, 16383, 16385, 70001):
        p, g, m, v = (torch.randint(-100, 100, (n,), generator=gen).float() for _ in range(4))
        want = [p + g, m + g, v + g]
        ringzero._C.adam_traffic_(p, g, m, v)
        assert all(torch.equal(a, b) for a, b in zip((p, m, v), want))
    with pytest.raises(ValueError, match="four contiguous float32 CPU tensors"):
        ringzero._C.adam_traffic_(torch.zeros(3), torch.zeros(4), torch.zeros(3), torch.zeros(3))
