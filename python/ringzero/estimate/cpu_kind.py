"""The CPU as a "GPU kind" of the step-time model: what one rank of `ringzero train --device cpu` computes per
second, calibrated at run time by timing torch's float32 matmuls, attention and elementwise kernels of the
job's own shapes, and the links of one host (shared memory) or of the host lab (shaped links between hosts).

A rank of `ringzero train` on CPU is bound to its share of the cores and runs torch with that many threads
(cli/launch.py), so the calibration times the same calls on the calling thread; run inside every rank at
once, it also sees the memory bandwidth the ranks share. GEMMs follow GpuKind's size correction,
rate(n) = peak x n / (n + half_width), fitted through two measured points: the MLP's first GEMM (width h)
and the attention's core (width = the head size). The achieved fractions are 1: the measured rates are
what the model charges.
"""
from __future__ import annotations

import functools
import time

from .flops import BACKWARD_PER_FORWARD
from .gpus import GpuKind
from .network import Cluster, Link

CALIBRATION_REPEATS = 7
"""Timed calls per measurement; the median is kept (other work shares the cores and caches)."""
MIN_HALF_WIDTH = 1.0
"""The fitted half width never goes below this (a narrow GEMM measured no slower than a wide one)."""

SHM_BYTES_PER_S = 4.2e9
"""ringzero's shared-memory all-reduce between the 2 ranks of one host on the 2-core machine, per direction:
13.2 MB (the default GPT's gradients) in 3.0-3.3 ms, busbw 4.05-4.38 GB/s (benchmarks/RESULTS.md, the
`ringzero bench` training rows); a ring step moves M / n per rank, so this is the model's link bandwidth."""
GLOO_BYTES_PER_S = 1.1e9
"""gloo's all-reduce of the same 13.2 MB between the same 2 ranks: 11.4-12.2 ms, busbw 1.08-1.15 GB/s (the same
RESULTS.md rows): the link of the torch rows, whose collectives run on gloo."""
SHM_LATENCY_S = 20e-6
"""Per algorithm step through shared memory: a flag round trip between the two cores plus the call's own
overhead (RESULTS.md: small collectives of a few KiB take tens of microseconds on this VM)."""


class CpuProbe:
    """Times one rank's kernels at the job's shapes (float32, the calling thread; see measure_cpu_kind for
    what each probe is): sample() times each once, kind() makes the GpuKind of the medians so far. The
    training loop samples once after each timed step, so that the rates come from the same minutes as the
    steps they predict (this VM's cores change speed from minute to minute). One thread: the clock is the
    thread's CPU time, which leaves out the time other processes held the core (the model predicts the step
    on the ranks' cores); several threads: wall time."""

    def __init__(self, d_model: int, width: int, tokens: int, head_size: int, seq_len: int, heads: int,
                 attention: str = "flash"):
        import torch
        import torch.nn.functional as F

        g = torch.Generator().manual_seed(0)
        x = torch.randn(tokens, d_model, generator=g)
        w = torch.randn(width, d_model, generator=g)
        q = torch.randn(max(1, tokens // seq_len), heads, seq_len, head_size, generator=g)
        hidden = F.linear(x, w)
        ln_w, ln_b = torch.ones(d_model), torch.zeros(d_model)
        x_grad, hidden_grad = x.clone().requires_grad_(), hidden.clone().requires_grad_()
        dy, dh = torch.ones_like(x), torch.ones_like(hidden)

        def elementwise():  # forward and backward, as a step runs them (backward kernels are the slower on CPU)
            y = F.layer_norm(x_grad, (d_model,), ln_w, ln_b) + x_grad
            torch.autograd.backward((y, F.gelu(hidden_grad)), (dy, dh))
            x_grad.grad = hidden_grad.grad = None
        if attention == "flash":
            attend = lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True)  # noqa: E731
            attn_flops = 4.0 * q.shape[0] * seq_len * seq_len * heads * head_size  # QK^T and PV, whole square
        else:
            flat = q.flatten(0, 1)
            attend = lambda: torch.bmm(flat, flat.transpose(1, 2))  # noqa: E731
            attn_flops = 2.0 * flat.shape[0] * seq_len * seq_len * head_size
        # The MLP's first GEMM as a step runs it: forward x w^T, then the backward's input gradient dy w and
        # weight gradient dy^T x (with dy the forward's output): two thirds of a step's GEMM FLOPs are backward.
        self._kernels = (lambda: (F.linear(x, w), hidden @ w, hidden.t() @ x), attend,
                         elementwise)
        self._widths = (d_model, head_size)
        self._gemm_flops = (3 * 2.0 * tokens * d_model * width, attn_flops)
        # flops.py's passes: a norm reads and writes h (1), an addition reads 2 and writes 1 (1.5), GeLU w (1);
        # step_time charges a forward's bytes 1 + BACKWARD_PER_FORWARD times for its forward and backward.
        self._charged_bytes = (1 + BACKWARD_PER_FORWARD) * 2 * 4 * tokens * (2.5 * d_model + width)
        self._threads = torch.get_num_threads()
        self._clock = time.thread_time if self._threads == 1 else time.perf_counter
        self.samples: list[tuple[float, float, float]] = []
        """Seconds of (block GEMM, attention core, memory-bound kernels), one tuple per sample()."""
        for kernel in self._kernels:
            kernel()  # warm: allocations, the BLAS library's first-call set-up

    def sample(self):
        """Times each kernel once and keeps the seconds."""
        times = []
        for kernel in self._kernels:
            t0 = self._clock()
            kernel()
            times.append(self._clock() - t0)
        self.samples.append(tuple(times))

    def kind(self) -> GpuKind:
        """The GpuKind of the median of each kernel's samples (ValueError before the first sample)."""
        if not self.samples:
            raise ValueError("CpuProbe.kind() needs at least one sample()")
        block_s, attn_s, elementwise_s = (sorted(col)[len(col) // 2] for col in zip(*self.samples))
        peak, half = fit_gemm_rate((self._widths[0], self._gemm_flops[0] / block_s),
                                   (self._widths[1], self._gemm_flops[1] / attn_s))
        return GpuKind(f"CPU, {self._threads} thread(s) per rank, measured", peak_flops_per_s=peak,
                       hbm_bytes_per_s=self._charged_bytes / elementwise_s, gemm_fraction=1.0, gemm_half_width=half,
                       memory_fraction=1.0)


@functools.lru_cache(maxsize=None)
def measure_cpu_kind(d_model: int, width: int, tokens: int, head_size: int, seq_len: int, heads: int,
                     attention: str = "flash") -> GpuKind:
    """A GpuKind for this process's CPU threads, measured on one rank's shapes of the job (float32, torch's
    current thread count; cached per process and shape; about 0.2 s at the default GPT), CALIBRATION_REPEATS
    samples of a CpuProbe:

    - GEMMs: `tokens` x d_model times d_model x `width` (the MLP's first GEMM of one micro-batch) with its
      backward's two GEMMs, and the
      attention's core on `heads` heads of head_size (attention 'flash': torch's causal
      scaled_dot_product_attention, which the GPT runs; 'eager': one batched QK^T), each charged the FLOPs
      flops.py counts for it; the two rates fit GpuKind's size correction (fit_gemm_rate).
    - memory-bound kernels: a layer norm and a residual addition over d_model and a GeLU over `width`, forward
      and backward timed together; hbm_bytes_per_s is the bytes step_time charges for them over that time
      (on a CPU these kernels are partly compute-bound: exp, erf and the norm's reductions run slower than a
      copy, and their backward slower than their forward)."""
    probe = CpuProbe(d_model, width, tokens, head_size, seq_len, heads, attention)
    for _ in range(CALIBRATION_REPEATS):
        probe.sample()
    return probe.kind()


def describe_cpu(kind: GpuKind) -> str:
    """One line for a measured CPU kind (GpuKind.describe speaks of GPUs' TFLOP/s and HBM)."""
    return (f"{kind.name}: GEMMs {kind.peak_flops_per_s / 1e9:.1f} GFLOP/s (half that at width "
            f"{kind.gemm_half_width:.0f}), memory-bound kernels {kind.hbm_bytes_per_s / 1e9:.1f} GB/s")


def fit_gemm_rate(wide: tuple[float, float], narrow: tuple[float, float]) -> tuple[float, float]:
    """(peak, half_width) of rate(n) = peak x n / (n + half_width) through two (width, FLOP/s) points:
    1 / rate = 1 / peak + (half_width / peak) / n is a line in 1 / n. Where the narrow point is no slower
    than the wide one, half_width is MIN_HALF_WIDTH and the wide point sets the peak."""
    (w1, r1), (w2, r2) = wide, narrow
    if w1 <= w2:
        raise ValueError(f"the wide GEMM's width {w1} must exceed the narrow one's {w2}")
    slope = (1 / r2 - 1 / r1) / (1 / w2 - 1 / w1)  # = half_width / peak
    inv_peak = 1 / r1 - slope / w1
    if slope <= 0 or inv_peak <= 0:
        return r1 * (w1 + MIN_HALF_WIDTH) / w1, MIN_HALF_WIDTH
    return 1 / inv_peak, max(MIN_HALF_WIDTH, slope / inv_peak)


def cpu_cluster(ranks_per_host: int, hosts: int = 1, link_gbps: float | None = None,
                latency_us: float | None = None, in_host_bytes_per_s: float = SHM_BYTES_PER_S) -> Cluster:
    """The links of `ringzero train` on CPU: `ranks_per_host` ranks per host talking through shared memory
    (in_host_bytes_per_s: SHM_BYTES_PER_S for ringzero's collectives, GLOO_BYTES_PER_S for the torch rows',
    with SHM_LATENCY_S), and with hosts > 1 one shared network card per host at `link_gbps`
    gigabits per second per direction (the host lab's shaped link at its TCP goodput; required then)."""
    if hosts > 1 and not link_gbps:
        raise ValueError("a CPU cluster of several hosts needs the link's speed (link_gbps)")
    intra = Link(in_host_bytes_per_s, SHM_LATENCY_S)
    inter = Link(link_gbps / 8 * 1e9, (latency_us or 50.0) * 1e-6) if hosts > 1 else intra
    return Cluster(f"{hosts}x{ranks_per_host} CPU ranks", ranks_per_host, intra, inter, nics_per_node=1)
