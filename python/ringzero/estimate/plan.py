"""What is being estimated, apart from the model: the number formats (Precision) and the parallel
layout (Plan: data parallel with DDP or ZeRO 1/2/3, pipeline stages, tensor and sequence parallelism,
micro-batches, recomputation).
"""
from __future__ import annotations

import dataclasses

from ..parallel.layout import STRATEGIES, Layout
from .checks import positive_ints
from .model import RECOMPUTE_KINDS

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "float64": 8,
               "fp8": 1, "float8": 1}
OPTIMIZER_STATES = {"adam": ("exp_avg", "exp_avg_sq"), "adamw": ("exp_avg", "exp_avg_sq"),
                    "momentum": ("momentum",), "sgd": ()}
SCHEDULES = ("1f1b", "gpipe", "interleaved", "zb-h1")
"""Pipeline schedules: GPipe (all forwards, then all backwards), 1F1B (PipeDream-Flush), Megatron's
interleaved 1F1B over virtual_stages chunks per rank (Narayanan et al. 2021), and zero-bubble ZB-H1 (Qi et al.
2023: 1F1B's memory, the weight gradients moved into the bubble)."""


def dtype_bytes(name: str, what: str) -> int:
    """Bytes of one element of dtype `name` (float32, bfloat16, float16, ...); `what` names the argument."""
    try:
        return DTYPE_BYTES[str(name).lower()]
    except KeyError:
        raise ValueError(f"{what}={name!r} is not a known dtype; use one of {sorted(DTYPE_BYTES)}") from None


@dataclasses.dataclass(frozen=True)
class Precision:
    """Bytes per parameter of each model state, and per activation element."""

    param_bytes: int = 4
    """The parameters the forward and backward use."""
    grad_bytes: int = 4
    """Gradients, as reduced between ranks."""
    master_bytes: int = 0
    """A separate float32 copy of the parameters that the optimizer updates (mixed precision); 0 if none."""
    state_bytes: tuple = (("exp_avg", 4), ("exp_avg_sq", 4))
    """Optimizer state per parameter, by name (Adam: first and second moment)."""
    act_bytes: int = 4
    """One activation element (the paper's 2 for 16-bit training)."""

    def __post_init__(self):
        positive_ints("Precision.", param_bytes=self.param_bytes, grad_bytes=self.grad_bytes,
                      act_bytes=self.act_bytes)
        if isinstance(self.master_bytes, bool) or not isinstance(self.master_bytes, int) or self.master_bytes < 0:
            raise ValueError(f"Precision.master_bytes must be an int >= 0, got {self.master_bytes!r}")

    @property
    def optimizer_bytes(self) -> int:
        """K of the ZeRO paper: master copy plus optimizer states, bytes per parameter."""
        return self.master_bytes + sum(b for _, b in self.state_bytes)

    @property
    def model_state_bytes(self) -> int:
        """Bytes per parameter of parameters, gradients and optimizer together (16 for float32 Adam)."""
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    @classmethod
    def for_dtype(cls, dtype: str = "float32", optimizer: str = "adam", grad_dtype: str | None = None,
                  state_dtypes: dict | None = None, master: bool | None = None) -> "Precision":
        """The usual recipes. float32: everything 4 bytes (16 bytes per parameter with Adam).
        bfloat16/float16: mixed precision as in the ZeRO paper, 16-bit parameters, gradients and
        activations with a float32 master copy and float32 moments (2 + 2 + 12 bytes). grad_dtype,
        state_dtypes ({'exp_avg': 'bfloat16'}) and master override a part of the recipe."""
        opt = str(optimizer).lower()
        if opt not in OPTIMIZER_STATES:
            raise ValueError(f"optimizer={optimizer!r}: use one of {sorted(OPTIMIZER_STATES)}")
        work = dtype_bytes(dtype, "dtype")
        if master is None:
            master = work < 4
        states = {name: 4 for name in OPTIMIZER_STATES[opt]}
        for name, dt in (state_dtypes or {}).items():
            if name not in states:
                raise ValueError(f"optimizer {opt} has no state {name!r}; it has {list(states) or 'none'}")
            states[name] = dtype_bytes(dt, f"{name} dtype")
        grad = work if grad_dtype is None else dtype_bytes(grad_dtype, "grad_dtype")
        return cls(param_bytes=work, grad_bytes=grad, master_bytes=4 if master else 0,
                   state_bytes=tuple(states.items()), act_bytes=work)

    def describe(self) -> str:
        states = ", ".join(f"{n} {b}" for n, b in self.state_bytes) or "no optimizer state"
        master = f"master copy {self.master_bytes}, " if self.master_bytes else ""
        return (f"bytes per parameter: parameters {self.param_bytes}, gradients {self.grad_bytes}, {master}{states}"
                f" (= {self.model_state_bytes}); activations {self.act_bytes} bytes per element")


@dataclasses.dataclass(frozen=True)
class Plan:
    """How the world is used: pp pipeline stages times dp = world/(pp*tp) data-parallel replicas per
    stage times tp tensor-parallel ranks per replica (ranks pipeline-major, tensor innermost, as in
    ringzero.parallel.Mesh: a replica's tensor-parallel ranks are neighbours)."""

    strategy: str = "ddp"
    """One of STRATEGIES: ddp, zero1, zero2, zero3 (data parallel only), pp, pp+zero1, pp+zero2."""
    world: int = 1
    """All ranks (GPUs)."""
    pp: int = 1
    """Pipeline stages; must divide world. Strategies without 'pp' need pp=1."""
    tp: int = 1
    """Tensor-parallel ranks (Megatron: heads, MLP units and vocabulary split over them); pp * tp must
    divide world. ZeRO then shards each rank's part over the dp ranks holding the same part."""
    sequence_parallel: bool = False
    """Megatron's sequence parallelism over the tp ranks (Korthikanti et al. 2022): the layer norms and
    dropouts run on s/tp tokens, and the all-reduces become reduce-scatters and all-gathers. Needs tp > 1."""
    microbatches: int = 1
    """Micro-batches per step and data-parallel rank (the pipeline's m; gradient accumulation steps)."""
    schedule: str = "1f1b"
    """Pipeline schedule, one of SCHEDULES: '1f1b', 'zb-h1' keep at most pp micro-batches in flight on stage 0,
    'gpipe' keeps all m, 'interleaved' pp (1 + (pp - 1) / (pp v)) as Narayanan et al. 2021 count it."""
    virtual_stages: int = 1
    """Model chunks per pipeline rank (v) of the interleaved schedule: each rank holds v non-neighbouring
    slices of layers / (pp v) blocks, which divides the bubble by v. 1 for every other schedule."""
    recompute: str = "none"
    """Activation recomputation: none, selective (the paper's: the attention s^2 part), full (per block)."""
    bucket_bytes: int = 25 * 2**20
    """Gradient bucket of DDP/ZeRO-1/2 reductions (torch DDP's default 25 MiB): sets the call count."""
    layers_per_stage: tuple | None = None
    """Blocks on each pipeline stage, first to last (None: as even as possible, earlier stages taking
    the extra). ringzero's split(by='params') may place them otherwise; pass its counts to compare."""
    zeropp: str = ""
    """zero3 only: ZeRO++'s options as ZeroDataParallel takes them (e.g. 'hpz,qw,qg'); needs ranks_per_host."""
    ranks_per_host: int = 0
    """Data-parallel ranks per host where zeropp is set (the in-host groups of hpz and qg); must divide dp."""
    ep: int = 1
    """Expert-parallel ranks (mixture-of-experts models): each MoE block's experts are sharded over groups of
    ep neighbouring data-parallel ranks (parallel.Mesh's "ep" axis), which exchange tokens by all-to-all;
    ep divides dp, as in Megatron and DeepSpeed-MoE. Expert gradients are reduced, and ZeRO shards expert
    state, over the edp = dp / ep ranks holding the same experts; everything else over all dp ranks."""
    layout: Layout = dataclasses.field(init=False, repr=False, compare=False)
    """Derived: strategy, world, pp and tp validated by parallel.layout's rules, shared with `ringzero train`."""

    def __post_init__(self):
        object.__setattr__(self, "layout", Layout(self.strategy, self.world, self.pp, self.tp))
        if not isinstance(self.sequence_parallel, bool):
            raise ValueError(f"sequence_parallel must be True or False, got {self.sequence_parallel!r}")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel splits the sequence over the tensor-parallel ranks: it needs tp > 1")
        positive_ints("", microbatches=self.microbatches, bucket_bytes=self.bucket_bytes, ep=self.ep)
        if self.dp % self.ep:
            raise ValueError(f"ep ({self.ep}) does not divide the data-parallel degree dp ({self.dp}): expert "
                             "parallelism splits the data-parallel ranks")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r}: use one of {SCHEDULES}")
        positive_ints("", virtual_stages=self.virtual_stages)
        if (self.virtual_stages > 1) != (self.schedule == "interleaved"):
            raise ValueError(f"virtual_stages={self.virtual_stages} with schedule {self.schedule!r}: the interleaved "
                             "schedule takes virtual_stages > 1, the others 1")
        if self.schedule == "interleaved" and self.microbatches % self.pp:
            raise ValueError(f"the interleaved schedule needs micro-batches ({self.microbatches}) divisible by the "
                             f"pipeline stages pp ({self.pp})")
        if self.layers_per_stage is not None:
            lps = tuple(self.layers_per_stage)
            if len(lps) != self.pp or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in lps):
                raise ValueError(f"layers_per_stage={self.layers_per_stage!r}: give pp={self.pp} block counts >= 0")
            object.__setattr__(self, "layers_per_stage", lps)
        if self.recompute not in RECOMPUTE_KINDS:
            raise ValueError(f"recompute={self.recompute!r}: use one of {RECOMPUTE_KINDS}")
        if self.zeropp:
            from ..parallel.data_parallel.zeropp import parse

            names = parse(self.zeropp, "zeropp").names()
            object.__setattr__(self, "zeropp", "" if names == "none" else names)
        if self.zeropp:
            if self.strategy != "zero3":
                raise ValueError(f"zeropp={self.zeropp!r} applies to zero3, not {self.strategy}")
            if self.ranks_per_host < 1 or self.dp % self.ranks_per_host:
                raise ValueError(f"zeropp needs ranks_per_host, a divisor of the {self.dp} data-parallel ranks "
                                 f"(got {self.ranks_per_host})")

    @property
    def zeropp_options(self):
        """The parsed zeropp (a ringzero.parallel.data_parallel.zeropp.ZeroPP)."""
        from ..parallel.data_parallel.zeropp import parse

        return parse(self.zeropp or None)

    @property
    def dp(self) -> int:
        """Data-parallel replicas per pipeline stage."""
        return self.layout.dp

    @property
    def edp(self) -> int:
        """Ranks holding the same experts (expert data parallelism): dp / ep."""
        return self.dp // self.ep

    @property
    def zero_stage(self) -> int:
        """0 for DDP and plain pipeline, else the ZeRO stage: 1 shards optimizer state, 2 also
        gradients, 3 also parameters, each over the dp ranks of a stage."""
        return self.layout.zero_stage

    def describe(self) -> str:
        chunks = f" x {self.virtual_stages} chunks" if self.virtual_stages > 1 else ""
        pipe = (f", {self.pp} stages x {self.dp} data-parallel, {self.microbatches} micro-batches, "
                f"{self.schedule}{chunks}" if self.pp > 1 else f", {self.dp} data-parallel ranks")
        tensor = (f", {self.tp} tensor-parallel{' with sequence parallelism' if self.sequence_parallel else ''}"
                  if self.tp > 1 else "")
        expert = f", {self.ep} expert-parallel ({self.edp} holding the same experts)" if self.ep > 1 else ""
        return f"{self.strategy}{pipe}{tensor}{expert}, recompute {self.recompute}"
