"""Low-level fused optimizer ops on flat tensors (CPU and CUDA): the Adam/AdamW step and the
sum-of-squares pass behind gradient clipping and the inf check.

Each call is one pass over memory. Eligibility and argument checks live here (ValueError/TypeError
naming the argument); the native code repeats the essential checks as hard errors. ZeRO calls
`adam_step_` on flat shard views.
"""
from __future__ import annotations

import math
import numbers
from typing import Sequence

import torch

from . import _C

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_MOMENTS = (torch.float32, torch.bfloat16)


# Large allocations start at the same offset within a 4 KiB page. Buffers read and written in the same
# loop at equal page offsets make the CPU mistake loads for dependants of earlier stores ("4K aliasing");
# measured on the 2-core AVX-512 machine, 16M float32 params single-threaded: 11.4 ms aligned vs 9.6 ms
# skewed. So the k-th flat buffer starts k KiB into its allocation.
_SKEW_BYTES = 1024


def flat_buffer(numel: int, dtype: torch.dtype, device, index: int) -> torch.Tensor:
    """A zeroed 1D buffer of `numel` elements for the `index`-th (0, 1, 2, ...) of several buffers that
    one adam_step_ reads together; on the CPU its start is skewed by index KiB so that the buffers do not
    alias modulo 4 KiB (see above). Used by FusedAdam for its state; ZeRO can use it for its shards."""
    device = torch.device(device)
    skew = index * _SKEW_BYTES // torch.empty((), dtype=dtype).element_size() if device.type == "cpu" else 0
    return torch.zeros(numel + skew, dtype=dtype, device=device)[skew:]


def _check_tensors(ts, arg, op, dtypes, device, numels=None):
    # Called on every step: the messages are built only on failure, each tensor's device read once.
    name = lambda k: f"{arg}[{k}]" if len(ts) > 1 else arg  # noqa: E731
    for k, t in enumerate(ts):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"ringzero.ops.{op}: {name(k)} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in dtypes:
            raise TypeError(f"ringzero.ops.{op}: {name(k)} has dtype {t.dtype}; use one of "
                            + ", ".join(str(d) for d in dtypes))
        t_device = t.device
        if t_device != device:
            raise ValueError(f"ringzero.ops.{op}: {name(k)} is on {t_device} but the params are on {device}; move it")
        if not t.is_contiguous():
            raise ValueError(f"ringzero.ops.{op}: {name(k)} must be contiguous; pass a flat view or call .contiguous()")
        if numels is not None and t.numel() != numels[k]:
            raise ValueError(f"ringzero.ops.{op}: {name(k)} has {t.numel()} elements but its param has {numels[k]}")
        if t_device.type not in ("cpu", "cuda"):
            raise ValueError(f"ringzero.ops.{op}: {name(k)} is on {t_device}; only CPU and CUDA tensors are supported")


def _scalar(value, arg, op, device, lo=None, hi=None):
    """A hyperparameter given as a number or a one-element tensor. Returns (host_value, device_tensor).

    CPU tensors are read on the host (free); CUDA tensors are passed to the kernel (no sync)."""
    if type(value) is float or type(value) is int:  # the common case, without numbers.Real's slow check
        value = float(value)
    elif isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"ringzero.ops.{op}: {arg} must be a number or a one-element tensor, got shape "
                             f"{tuple(value.shape)}")
        if device.type == "cuda" and value.device.type == "cuda":
            if value.device != device:
                raise ValueError(f"ringzero.ops.{op}: {arg} is on {value.device} but the params are on {device}")
            return 0.0, value.reshape(()).to(torch.float32) if value.dtype != torch.float32 else value
        if device.type == "cuda":
            raise ValueError(f"ringzero.ops.{op}: {arg} is a CPU tensor but the params are on {device}; "
                             f"pass a number or a tensor on {device}")
        if value.device.type != "cpu":
            raise ValueError(f"ringzero.ops.{op}: {arg} is on {value.device} but the params are on the CPU")
        value = float(value)
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = float(value)
    else:
        raise TypeError(f"ringzero.ops.{op}: {arg} must be a number or a one-element tensor, got {type(value).__name__}")
    if lo is not None and not value >= lo:
        raise ValueError(f"ringzero.ops.{op}: {arg}={value} must be >= {lo}")
    if hi is not None and not value < hi:
        raise ValueError(f"ringzero.ops.{op}: {arg}={value} must be < {hi}")
    return value, None


def adam_step_(param, grad, exp_avg, exp_avg_sq, *, lr, beta1, beta2, eps, weight_decay, step, adamw=True,
               maximize=False, inv_scale=None, clip_coef=None, found_inf=None, param_out=None, max_exp_avg_sq=None):
    """One fused Adam (adamw=False) or AdamW step, in place, in one pass per element.

    Tensors: contiguous, same numel, same device (CPU or CUDA); any shape (flat views are the usual case).
      param       float32 master (or a 16-bit parameter updated without a master); updated in place
      grad        float32, bfloat16 or float16; read only; multiplied by inv_scale * clip_coef
      exp_avg, exp_avg_sq, max_exp_avg_sq (AMSGrad when given)   float32 or bfloat16, one dtype
      param_out   optional float32/bfloat16/float16 buffer that receives the updated param (ZeRO's
                  all-gather input), written in the same pass
    Scalars: lr, step (the count after incrementing, >= 1), inv_scale, clip_coef and found_inf may be
    numbers or one-element tensors; CUDA tensors are read by the kernel (no host sync, graph-capturable).
    found_inf non-zero skips the whole step (nothing is written). Semantics match torch.optim.Adam/AdamW
    (maximize negates the gradient, Adam's weight_decay is added to it, AdamW's decays the param).
    Called by any single process; no communication. CPU speed: buffers whose addresses are equal modulo
    4 KiB slow the loop (4K aliasing); FusedAdam skews its flat buffers, callers owning theirs should too.
    """
    adam_step_multi_([param], [grad], [exp_avg], [exp_avg_sq], lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                     weight_decay=weight_decay, step=step, adamw=adamw, maximize=maximize, inv_scale=inv_scale,
                     clip_coef=clip_coef, found_inf=found_inf,
                     param_outs=None if param_out is None else [param_out],
                     max_exp_avg_sqs=None if max_exp_avg_sq is None else [max_exp_avg_sq])


def adam_step_multi_(params: Sequence[torch.Tensor], grads, exp_avgs, exp_avg_sqs, *, lr, beta1, beta2, eps,
                     weight_decay, step, adamw=True, maximize=False, inv_scale=None, clip_coef=None, found_inf=None,
                     param_outs=None, max_exp_avg_sqs=None):
    """`adam_step_` over lists of tensors (entry k of every list belongs together), in one call: the CPU
    splits all of them into chunks over its threads (torch.get_num_threads()); CUDA covers up to 32
    entries per kernel launch. Same scalars for every entry, except that on CUDA `step` may also be a
    list of one-element float32 CUDA tensors, one per entry (each parameter's own step count, as
    torch's per-parameter optimizer state keeps it)."""
    op = "adam_step_"
    params, grads, exp_avgs, exp_avg_sqs = list(params), list(grads), list(exp_avgs), list(exp_avg_sqs)
    n = len(params)
    for arg, ts in (("grads", grads), ("exp_avgs", exp_avgs), ("exp_avg_sqs", exp_avg_sqs),
                    ("param_outs", param_outs), ("max_exp_avg_sqs", max_exp_avg_sqs)):
        if ts is not None and len(ts) != n:
            raise ValueError(f"ringzero.ops.{op}: {arg} has {len(ts)} entries but params has {n}")
    if n == 0:
        return
    if not isinstance(params[0], torch.Tensor):
        raise TypeError(f"ringzero.ops.{op}: param must be a torch.Tensor, got {type(params[0]).__name__}")
    device = params[0].device
    numels = [p.numel() for p in params]
    _check_tensors(params, "param", op, _FLOATS, device)
    _check_tensors(grads, "grad", op, _FLOATS, device, numels)
    _check_tensors(exp_avgs, "exp_avg", op, _MOMENTS, device, numels)
    _check_tensors(exp_avg_sqs, "exp_avg_sq", op, _MOMENTS, device, numels)
    _check_tensors(param_outs or [], "param_out", op, _FLOATS, device, numels)
    _check_tensors(max_exp_avg_sqs or [], "max_exp_avg_sq", op, _MOMENTS, device, numels)
    for k in range(n):
        if exp_avg_sqs[k].dtype != exp_avgs[k].dtype or (max_exp_avg_sqs and max_exp_avg_sqs[k].dtype != exp_avgs[k].dtype):
            raise TypeError(f"ringzero.ops.{op}: exp_avg, exp_avg_sq and max_exp_avg_sq must share one dtype")
    cpu = torch.device("cpu")
    for name, v in (("beta1", beta1), ("beta2", beta2), ("eps", eps), ("weight_decay", weight_decay)):
        if isinstance(v, torch.Tensor):
            raise TypeError(f"ringzero.ops.{op}: {name} must be a number (only lr, step, inv_scale, clip_coef and "
                            "found_inf may be tensors)")
    _scalar(beta1, "beta1", op, cpu, lo=0.0, hi=1.0)
    _scalar(beta2, "beta2", op, cpu, lo=0.0, hi=1.0)
    eps_v, _ = _scalar(eps, "eps", op, cpu, lo=0.0)
    wd_v, _ = _scalar(weight_decay, "weight_decay", op, cpu, lo=0.0)
    lr_v, lr_t = _scalar(lr, "lr", op, device, lo=0.0)
    step_ts = []
    if isinstance(step, (list, tuple)):
        if device.type != "cuda":
            raise TypeError(f"ringzero.ops.{op}: a list of steps is for CUDA params; on {device} pass one number "
                            "(call once per distinct step count)")
        if len(step) != n or not all(isinstance(s, torch.Tensor) and s.numel() == 1 and s.device == device
                                     and s.dtype == torch.float32 for s in step):
            raise ValueError(f"ringzero.ops.{op}: step as a list needs {n} one-element float32 tensors on {device}")
        step_ts, step = list(step), 1.0
    step_v, step_t = _scalar(step, "step", op, device, lo=1.0)
    inv_v, inv_t = _scalar(1.0 if inv_scale is None else inv_scale, "inv_scale", op, device)
    clip_v, clip_t = _scalar(1.0 if clip_coef is None else clip_coef, "clip_coef", op, device)
    found_t = None
    if found_inf is not None:
        if not isinstance(found_inf, torch.Tensor) or found_inf.numel() != 1:
            raise TypeError(f"ringzero.ops.{op}: found_inf must be a one-element tensor")
        if found_inf.device != device:
            raise ValueError(f"ringzero.ops.{op}: found_inf is on {found_inf.device} but the params are on {device}")
        if device.type == "cpu":
            if float(found_inf) != 0.0:
                return  # GradScaler semantics: an inf/NaN anywhere skips the whole step
        else:
            found_t = found_inf if found_inf.dtype == torch.float32 else found_inf.float()
    _C.adam_step_list_(params, grads, exp_avgs, exp_avg_sqs, list(max_exp_avg_sqs or []), list(param_outs or []),
                       lr_v, float(beta1), float(beta2), eps_v, wd_v, step_v, bool(adamw), bool(maximize), inv_v,
                       clip_v, lr_t, step_t, inv_t, clip_t, found_t, step_ts)


def adam_launch_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, param_outs, *, lr, beta1, beta2, eps,
                 weight_decay, adamw, maximize, step, inv_scale=None, found_inf=None, counts=None, count_idx=()):
    """The fused kernel call of adam_step_multi_ without its per-tensor checks, for callers whose tensors
    are their own (FusedAdam's state buffers; C++ still checks every tensor hard). lr, inv_scale: numbers
    or one-element tensors (CUDA ones are read on the device); step: a number, or on CUDA a list of
    one-element float32 tensors, one per entry; found_inf: a CUDA tensor, or None (on the CPU the caller
    skips the step itself). CPU only, counts (a float32 CPU tensor: FusedAdam's step counts) with
    count_idx (one index per entry): entry k steps with count counts[count_idx[k]] + 1 instead of `step`,
    and the call then advances those counts (separate torch ops, or even numpy ones, cost 10-15 us each
    inside the profiler scope torch.optim wraps every step() in: as much as the step of a 16K-element
    tensor)."""
    if not params:
        return
    lr_v, lr_t = _host_or_device(lr)
    inv_v, inv_t = _host_or_device(1.0 if inv_scale is None else inv_scale)
    step_ts = list(step) if isinstance(step, (list, tuple)) else []
    _C.adam_step_list_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, param_outs, lr_v, float(beta1),
                       float(beta2), float(eps), float(weight_decay), 1.0 if step_ts else float(step), bool(adamw),
                       bool(maximize), inv_v, 1.0, lr_t, None, inv_t, None, found_inf, step_ts, counts, list(count_idx))


def _host_or_device(value):
    """(host number, None) for a number or a CPU tensor; (0.0, float32 scalar tensor) for a CUDA tensor."""
    if isinstance(value, torch.Tensor):
        if value.is_cuda:
            return 0.0, value.reshape(()).float() if value.dtype != torch.float32 else value.reshape(())
        return float(value), None
    return float(value), None


def sum_squares(tensors: Sequence[torch.Tensor], *, inv_scale=None, found_inf=None) -> torch.Tensor:
    """Sum of squares of every element of `tensors` (float32/bfloat16/float16, contiguous, one device),
    times inv_scale**2 when given: the squared global gradient norm of unscaled gradients, in one read.

    Returns a float32 0-d tensor on the tensors' device (no host sync on CUDA). found_inf, when given (a
    one-element float32 tensor on that device), is set to 1 if any element is inf or NaN and is left
    unchanged otherwise (so it accumulates over calls, as GradScaler's does)."""
    op = "sum_squares"
    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"ringzero.ops.{op}: tensors is empty; pass at least one tensor")
    if not isinstance(tensors[0], torch.Tensor):
        raise TypeError(f"ringzero.ops.{op}: tensors must hold torch.Tensors, got {type(tensors[0]).__name__}")
    device = tensors[0].device
    _check_tensors(tensors, "tensors", op, _FLOATS, device)
    if found_inf is not None:
        if not isinstance(found_inf, torch.Tensor) or found_inf.numel() != 1 or found_inf.dtype != torch.float32:
            raise TypeError(f"ringzero.ops.{op}: found_inf must be a one-element float32 tensor")
        if found_inf.device != device:
            raise ValueError(f"ringzero.ops.{op}: found_inf is on {found_inf.device} but the tensors are on {device}")
    out = torch.zeros((), dtype=torch.float32, device=device)
    if device.type == "cpu" and (inv_scale is None or not isinstance(inv_scale, torch.Tensor) or not inv_scale.is_cuda):
        # CPU: scaled inside the call (torch ops on one element cost more than summing a small tensor).
        _C.sum_squares_list_(out, tensors, found_inf, 1.0 if inv_scale is None else float(inv_scale) ** 2)
        return out
    _C.sum_squares_list_(out, tensors, found_inf)
    if inv_scale is not None:
        inv = inv_scale.reshape(()) if isinstance(inv_scale, torch.Tensor) else inv_scale
        out.mul_(inv * inv)
    return out


def clip_coef(sum_sq: torch.Tensor, max_norm: float, eps: float = 1e-6) -> torch.Tensor:
    """min(1, max_norm / (sqrt(sum_sq) + eps)) as a tensor on sum_sq's device (no host sync), the
    coefficient torch.nn.utils.clip_grad_norm_ applies; pass it to adam_step_(clip_coef=...). A CPU
    sum_sq is computed on the host in double and rounded once (torch's float32 ops may differ by an
    ulp); inf gives 0, NaN gives NaN, as torch's."""
    if not (type(max_norm) is float or isinstance(max_norm, numbers.Real)) or not max_norm > 0:
        raise ValueError(f"ringzero.ops.clip_coef: max_norm={max_norm!r} must be a number > 0")
    if sum_sq.device.type == "cpu" and sum_sq.numel() == 1:
        # On the host in double, rounded once to float32 (torch's four float32 ops round three times, so
        # the two can differ in the last bit; they also cost ~25 us, a third of a small mixed step).
        s = sum_sq.item()
        norm = math.sqrt(s) + eps if s >= 0 else math.nan  # sqrt of inf is inf; of NaN (or < 0), NaN
        coef = max_norm / norm if norm != 0 else math.inf
        return torch.full(sum_sq.shape, coef if not coef > 1.0 else 1.0, dtype=sum_sq.dtype)
    return torch.clamp(max_norm / (sum_sq.sqrt() + eps), max=1.0)
