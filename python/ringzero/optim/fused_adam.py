"""FusedAdam / FusedAdamW: torch.optim.Adam/AdamW with one fused pass per element (ringzero.ops).

Moments (and float32 masters of 16-bit parameters) live in flat buffers, one per (param group,
device, dtype) bucket; each parameter's state entries are views into them, so `state_dict()` has
torch's layout (`step`, `exp_avg`, `exp_avg_sq`, `max_exp_avg_sq`) and loads into torch.optim.AdamW,
and torch.optim.AdamW's state loads here. Parameters and gradients stay the caller's tensors.
"""
from __future__ import annotations

import dataclasses

import torch

from .. import ops

_PARAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclasses.dataclass
class _Bucket:
    """The params of one group on one device with one dtype, and their flat state (# 1D buffers)."""

    params: list
    exp_avg: torch.Tensor  # 1D, moment dtype
    exp_avg_sq: torch.Tensor  # 1D, moment dtype
    max_exp_avg_sq: torch.Tensor | None  # 1D, moment dtype; AMSGrad only
    master: torch.Tensor | None  # 1D float32; master_weights with 16-bit params only
    steps: torch.Tensor  # 1D float32, one step count per param (each state's "step" is a view of it)

    def __post_init__(self):
        self.device = self.exp_avg.device  # read once: each .device makes a new torch.device
        self.on_cpu = self.device.type == "cpu"


class FusedAdam(torch.optim.Optimizer):
    """Adam (decoupled_weight_decay=False) or AdamW, same arguments and semantics as torch.optim.Adam.

    Extra keyword arguments:
      master_weights  keep float32 masters for bfloat16/float16 params; the 16-bit params are written
                      from the masters in the same pass (state key `master_param`)
      moment_dtype    torch.float32 (default, also for 16-bit params) or torch.bfloat16
    foreach, fused and capturable are accepted for compatibility and have no effect: the step is always
    fused, and on CUDA always capturable (step counts live on the device, lr may be a one-element CUDA
    tensor, nothing is read on the host; take one eager step before capturing, which allocates the
    state). On CUDA each bucket (param group x dtype) steps in one call, 32 params per kernel launch.
    differentiable=True is not supported. Params must be dense, contiguous float32, bfloat16
    or float16 tensors on CPU or CUDA. `step(grad_scaler=scaler)` (what torch.amp.GradScaler.step
    passes) unscales and skips steps with inf/NaN gradients inside the fused pass.
    """

    _step_supports_amp_scaling = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None,
                 decoupled_weight_decay=False, master_weights=False, moment_dtype=torch.float32):
        if isinstance(lr, torch.Tensor) and lr.numel() != 1:
            raise ValueError(f"lr must be a number or a one-element tensor, got shape {tuple(lr.shape)}")
        if not 0.0 <= float(lr):
            raise ValueError(f"Invalid learning rate: {lr} (must be >= 0)")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps} (must be >= 0)")
        if not (len(betas) == 2 and 0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"Invalid betas: {betas} (each must be in [0, 1))")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay} (must be >= 0)")
        if differentiable:
            raise ValueError("differentiable=True is not supported by the fused step; use torch.optim.Adam")
        if moment_dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"moment_dtype={moment_dtype} is not supported; use torch.float32 or torch.bfloat16")
        self.master_weights = bool(master_weights)
        self.moment_dtype = moment_dtype
        self._buckets: dict[int, list[_Bucket]] = {}  # id(param group) -> its buckets
        self._loaded_state: dict = {}  # param -> state as given to load_state_dict (full precision)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
                        foreach=foreach, capturable=capturable, differentiable=differentiable, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(params, defaults)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        for p in self.param_groups[-1]["params"]:
            if p.dtype not in _PARAM_DTYPES:
                raise TypeError(f"FusedAdam: a parameter has dtype {p.dtype}; use float32, bfloat16 or float16")
            if p.is_sparse or not p.is_contiguous():
                raise ValueError("FusedAdam: parameters must be dense and contiguous; call .contiguous() on the "
                                 "module's parameters before making the optimizer")

    # ---- state: flat buckets whose views are the per-param state entries ---------------------------
    def _build_buckets(self, group):
        by_key: dict = {}
        for p in group["params"]:
            by_key.setdefault((p.device, p.dtype), []).append(p)
        buckets = []
        for (device, dtype), params in by_key.items():
            total = sum(p.numel() for p in params)
            with_master = self.master_weights and dtype != torch.float32
            flat = lambda dt, k: ops.flat_buffer(total, dt, device, k)  # noqa: E731
            # The step counts of a bucket sit side by side (on the device for CUDA params, where torch's
            # fused AdamW keeps them too): one add_ advances them all, and on CUDA one launch reads each
            # param's own count (no host sync: capturable in a CUDA graph).
            steps = torch.zeros(len(params), dtype=torch.float32,
                                device=device if device.type == "cuda" else torch.device("cpu"))
            b = _Bucket(params, flat(self.moment_dtype, 0), flat(self.moment_dtype, 1),
                        flat(self.moment_dtype, 2) if group["amsgrad"] else None,
                        flat(torch.float32, 3) if with_master else None, steps)
            offset = 0
            for k, p in enumerate(params):
                n = p.numel()
                view = lambda t: t[offset:offset + n].view_as(p)  # noqa: E731
                old = self._loaded_state.pop(p, None) or self.state.get(p, {})
                steps[k] = self._step_tensor(old.get("step"), device)
                state = {"step": steps[k]}
                for key, buf in (("exp_avg", b.exp_avg), ("exp_avg_sq", b.exp_avg_sq),
                                 ("max_exp_avg_sq", b.max_exp_avg_sq), ("master_param", b.master)):
                    if buf is None:
                        continue
                    state[key] = view(buf)
                    if key in old:
                        state[key].copy_(old[key])
                    elif key == "master_param":
                        state[key].copy_(p.detach())
                self.state[p] = state
                offset += n
            buckets.append(b)
        self._buckets[id(group)] = buckets

    @staticmethod
    def _step_tensor(step, device):
        # CPU params: a CPU step, as torch.optim.AdamW keeps it. CUDA params: on the device, so the skip
        # on found_inf (step -= found_inf) needs no host sync.
        where = device if device.type == "cuda" else torch.device("cpu")
        if isinstance(step, torch.Tensor):
            return step.detach().to(dtype=torch.float32, device=where).reshape(()).clone()
        return torch.tensor(float(step or 0.0), dtype=torch.float32, device=where)

    def _ensure_state(self):
        for group in self.param_groups:
            if id(group) not in self._buckets:
                self._build_buckets(group)

    def load_state_dict(self, state_dict):
        """Loads a state_dict of this class or of torch.optim.Adam/AdamW (same layout). Moments keep their
        saved precision (torch's loader would cast them to the parameter dtype first)."""
        ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        saved = state_dict["state"]
        super().load_state_dict(state_dict)
        params = [p for g in self.param_groups for p in g["params"]]
        self._loaded_state = {p: saved[i] for i, p in zip(ids, params) if i in saved}
        self._buckets = {}
        self.state.clear()
        if self._loaded_state:
            self._ensure_state()

    # ---- the step -------------------------------------------------------------------------------
    def _scaler_inputs(self, grad_scaler):
        """(inv_scale, found_inf) per device from a GradScaler (or the attributes it sets), or ({}, {})."""
        if grad_scaler is None:
            scale = getattr(self, "grad_scale", None)
            found = getattr(self, "found_inf", None)
            if scale is None and found is None:
                return {}, {}
            devices = {p.device for g in self.param_groups for p in g["params"]}
            inv = {d: (1.0 / scale.double()).float().to(d) for d in devices} if scale is not None else {}
            return inv, ({d: found.float().to(d) for d in devices} if found is not None else {})
        from torch.amp.grad_scaler import OptState

        opt_state = grad_scaler._per_optimizer_states[id(self)]
        if opt_state["stage"] is OptState.UNSCALED:  # the user called scaler.unscale_(optimizer) already
            return {}, {d: f.float() for d, f in opt_state["found_inf_per_device"].items()}
        inv_all = grad_scaler._scale.double().reciprocal().float()
        inv, found = {}, {}
        by_device: dict = {}
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    by_device.setdefault(p.grad.device, []).append(p.grad)
        for device, grads in by_device.items():
            # One read of the gradients to learn, before any write, whether the step must be skipped.
            found[device] = torch.zeros(1, dtype=torch.float32, device=device)
            ops.sum_squares(grads, found_inf=found[device])
            inv[device] = inv_all.to(device)
            opt_state["found_inf_per_device"][device] = found[device]
        return inv, found

    @torch.no_grad()
    def step(self, closure=None, grad_scaler=None):
        """One optimizer step over every param with a gradient. closure: re-evaluates the loss (as in
        torch). grad_scaler: a torch.amp.GradScaler whose scale is divided out and whose inf check skips
        the step (and is recorded for grad_scaler.update())."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._ensure_state()
        inv_scale, found_inf = self._scaler_inputs(grad_scaler)
        for group in self.param_groups:
            for bucket in self._buckets[id(group)]:
                self._step_bucket(group, bucket, inv_scale.get(bucket.device), found_inf.get(bucket.device))
        return loss

    def _step_bucket(self, group, bucket, inv_scale, found_inf):
        live = [k for k, p in enumerate(bucket.params) if p.grad is not None]
        if not live:
            return
        for k in live:
            if bucket.params[k].grad.is_sparse:
                raise RuntimeError("FusedAdam does not support sparse gradients")
        if bucket.on_cpu:
            if found_inf is not None and float(found_inf) != 0.0:
                return  # skipped step: nothing written, step counts unchanged (as torch's fused AdamW)
            # One call: each param's step comes from its own count in bucket.steps (params that missed
            # steps have lower counts), which the call then advances (a torch op here would cost more
            # than a small step: see adam_launch_).
            self._call_kernel(group, bucket, live, 1.0, inv_scale, None, counts=bucket.steps)
            return
        # CUDA: the whole bucket in one call (one launch per 32 params), each param with its own device
        # step count; a step skipped on found_inf leaves the counts as they were, without a host sync.
        self._advance(bucket, live, 1)
        self._call_kernel(group, bucket, live, [bucket.steps[k] for k in live], inv_scale, found_inf)
        if found_inf is not None:
            self._advance(bucket, live, -found_inf.reshape(()))

    @staticmethod
    def _advance(bucket, live, delta):
        if len(live) == len(bucket.params):
            bucket.steps.add_(delta)
        else:
            for k in live:
                bucket.steps[k].add_(delta)

    def _call_kernel(self, group, bucket, ks, step, inv_scale, found_inf, counts=None):
        """The fused pass over the params `ks` (indices into the bucket). Arguments are this optimizer's
        own, checked when the params joined (and hard-checked again in C++), so the kernel is called
        without ops.adam_step_multi_'s per-tensor checks."""
        ps = [bucket.params[k] for k in ks]
        states = [self.state[p] for p in ps]
        with_master = bucket.master is not None
        beta1, beta2 = group["betas"]
        ops.adam_launch_(
            [s["master_param"] if with_master else p for s, p in zip(states, ps)], [p.grad for p in ps],
            [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
            [s["max_exp_avg_sq"] for s in states] if group["amsgrad"] else [], ps if with_master else [],
            lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"],
            adamw=group["decoupled_weight_decay"], maximize=group["maximize"], step=step, inv_scale=inv_scale,
            found_inf=found_inf, counts=counts, count_idx=ks if counts is not None else ())


class FusedAdamW(FusedAdam):
    """AdamW (decoupled weight decay, default 1e-2), same arguments as torch.optim.AdamW; see FusedAdam."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None,
                 master_weights=False, moment_dtype=torch.float32):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize, foreach=foreach,
                         capturable=capturable, differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True, master_weights=master_weights, moment_dtype=moment_dtype)
