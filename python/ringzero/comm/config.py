"""The one reader of ringzero's runtime environment: `from_env()` reads and validates every RINGZERO_*
variable once, into a frozen `Config` that the Communicator, the CUDA path, the c10d backend and the
pipeline runtime take. A bad value fails at once with a ValueError naming the variable and what it
allows. docs/environment.md lists the same variables (tests/house/test_config.py keeps them in step).

Not read here: RINGZERO_CPU_ISA (csrc/core/reduce.cpp reads it when the reduction kernels load, also in
the C++ tests, and validates it there), RINGZERO_FAULT (trainer/faults.py: test-time fault injection),
and the build-time and test-time variables (RINGZERO_CUDA, RINGZERO_COMPAT_TORCH, RINGZERO_TORCH_CACHE).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os

from .. import _C

# Defaults, each described in docs/environment.md beside its variable.
DEFAULT_TIMEOUT_S = 300.0
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class Config:
    """ringzero's runtime settings (see from_env for where each comes from)."""

    timeout_s: float | None = None
    """RINGZERO_TIMEOUT_S: seconds any wait may last before ringzero.CommTimeout; None when unset (then
    the Communicator waits DEFAULT_TIMEOUT_S and the c10d backend the group's own timeout: timeout_or)."""
    shm_buffer_bytes: int = 256 << 10
    """RINGZERO_SHM_BUFFER_BYTES: staging slot per rank of the shared-memory segment (two per rank).
    256 KiB: a rank's two slots and the peer slice it reads stay in a 1 MiB L2; 1 MiB slots were up to
    twice as slow on the 16 and 64 MiB all-reduce, 64 KiB and 128 KiB slower, 512 KiB about the same
    (benchmarks/RESULTS.md, "Measurements moved out of code comments")."""
    ring_slice_bytes: int = 1 << 20
    """RINGZERO_RING_SLICE_BYTES: pipelining grain of the point-to-point rings between hosts (gloo and NCCL)."""
    allreduce_algo: str = "auto"
    """RINGZERO_ALLREDUCE_ALGO: a name of _C.ALL_REDUCE_ALGOS (auto, oneshot, twoshot, ring), lower case."""
    host_id: str = ""
    """RINGZERO_HOST_ID: forced host identity (ranks with equal ids share memory); empty: the real one."""
    bind_cores: bool = True
    """RINGZERO_BIND_CORES: each local rank runs on its own equal share of the cpus (comm/affinity.py), as
    Open MPI binds by default: ringzero's launcher binds before the rank starts; under other launchers
    (torchrun) the first setup of a job-wide group binds where no rank was bound and there is a cpu per
    rank ([Note: binding at setup]). 0 leaves placement to the scheduler. Unbound, the guest scheduler of
    the 2-core VM sometimes put both ranks on one vCPU, and each small collective's wait cost ~20 us."""
    single_copy: bool = True
    """RINGZERO_SINGLE_COPY: an all-gather of 64 KiB and more per rank reads each peer's block straight from
    the peer's memory (process_vm_readv: one copy instead of two through the staging slots), where the
    kernel allows it (the ranks vote at the first such call; one refusal, or one rank with 0, and every
    rank stages). 0: this rank votes no.
    [Note: single copy between a host's ranks] in csrc/core/shm_single_copy.cpp."""
    register_buffers: bool = True
    """RINGZERO_REGISTER_BUFFERS: ringzero's own flat CPU buffers that collectives read (DistributedDataParallel's
    gradient buckets, ZeRO's float32 master shards) are allocated with ringzero.empty, so that the all-reduce
    and all-gather read them from the peers directly ([Note: registered tensors], csrc/core/shm_window.cpp);
    where /dev/shm has no room they are plain tensors on every rank. 0: plain tensors. Must be the same on
    every rank (else their collectives raise CollectiveMismatch)."""
    debug: bool = False
    """RINGZERO_DEBUG: fingerprint every collective on the network paths too (one small all-gather per call)."""
    flight_dir: str = ""
    """RINGZERO_FLIGHT_DIR: folder of the flight recorder's files; empty: the temp folder."""
    cuda_buffer_bytes: int = 8 << 20
    """RINGZERO_CUDA_BUFFER_BYTES: IPC staging buffer per rank; larger messages stream through it."""
    cuda_ring_channels: int = 16
    """RINGZERO_CUDA_RING_CHANNELS: blocks (channels) of the CUDA ring kernels, fixed per communicator."""
    cuda_max_blocks: int = 32
    """RINGZERO_CUDA_MAX_BLOCKS: blocks per rank of the CUDA one-shot and two-shot kernels."""
    cuda_oneshot_max_bytes: int = 256 << 10
    """RINGZERO_CUDA_ONESHOT_MAX_BYTES: the CUDA `auto` all-reduce takes one-shot up to this size."""
    cuda_twoshot_max_bytes: int = 16 << 20
    """RINGZERO_CUDA_TWOSHOT_MAX_BYTES: the CUDA `auto` all-reduce takes two-shot up to this size, the ring above."""
    cuda_blocking_wait: bool = False
    """RINGZERO_CUDA_BLOCKING_WAIT: blocking CUDA calls and wait() wait for the kernel on the host and raise
    CommTimeout at once; off: a kernel timeout is raised at the group's next CUDA call (comm/cuda.py)."""

    def timeout_or(self, default_s: float) -> float:
        """RINGZERO_TIMEOUT_S when set, else `default_s` (when positive), else DEFAULT_TIMEOUT_S."""
        if self.timeout_s is not None:
            return self.timeout_s
        return default_s if default_s and default_s > 0 else DEFAULT_TIMEOUT_S

    @property
    def algo_code(self) -> int:
        """allreduce_algo as the C++ AllReduceAlgo value (the CUDA path maps it to cuda::Algo by name)."""
        return _C.ALL_REDUCE_ALGOS[self.allreduce_algo]

    def peer_config(self, timeout_s: float | None = None) -> dict:
        """Keyword arguments of _C.CudaPeerComm/_C.CudaSimWorld (timeout_s: this one instead of ours)."""
        return dict(
            staging_bytes=self.cuda_buffer_bytes,
            timeout_s=self.timeout_or(DEFAULT_TIMEOUT_S) if timeout_s is None else timeout_s,
            ring_channels=self.cuda_ring_channels,
            max_blocks=self.cuda_max_blocks,
            one_shot_max_bytes=self.cuda_oneshot_max_bytes,
            two_shot_max_bytes=self.cuda_twoshot_max_bytes,
        )


# variable -> Config field; tests/house/test_config.py compares this with docs/environment.md.
VARIABLES = {
    "RINGZERO_TIMEOUT_S": "timeout_s",
    "RINGZERO_SHM_BUFFER_BYTES": "shm_buffer_bytes",
    "RINGZERO_RING_SLICE_BYTES": "ring_slice_bytes",
    "RINGZERO_ALLREDUCE_ALGO": "allreduce_algo",
    "RINGZERO_HOST_ID": "host_id",
    "RINGZERO_DEBUG": "debug",
    "RINGZERO_BIND_CORES": "bind_cores",
    "RINGZERO_SINGLE_COPY": "single_copy",
    "RINGZERO_REGISTER_BUFFERS": "register_buffers",
    "RINGZERO_FLIGHT_DIR": "flight_dir",
    "RINGZERO_CUDA_BUFFER_BYTES": "cuda_buffer_bytes",
    "RINGZERO_CUDA_RING_CHANNELS": "cuda_ring_channels",
    "RINGZERO_CUDA_MAX_BLOCKS": "cuda_max_blocks",
    "RINGZERO_CUDA_ONESHOT_MAX_BYTES": "cuda_oneshot_max_bytes",
    "RINGZERO_CUDA_TWOSHOT_MAX_BYTES": "cuda_twoshot_max_bytes",
    "RINGZERO_CUDA_BLOCKING_WAIT": "cuda_blocking_wait",
}


def _positive(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number; it takes a positive number") from None
    if not value > 0:  # also rejects nan
        raise ValueError(f"{name} must be positive, got {raw}")
    return value


def _count(name: str, raw: str) -> int:
    """A positive size or count; '1e6' is accepted as the environment has always allowed it."""
    value = int(_positive(name, raw))
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {raw}")
    return value


def _flag(name: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r}: use 1 (on) or 0 (off)")


def _algo(name: str, raw: str) -> str:
    low = raw.strip().lower()
    if low not in _C.ALL_REDUCE_ALGOS:
        raise ValueError(f"{name}={raw!r}: use one of {', '.join(_C.ALL_REDUCE_ALGOS)}")
    return low


def _text(name: str, raw: str) -> str:
    return raw


_PARSERS = {"timeout_s": _positive, "allreduce_algo": _algo, "host_id": _text, "debug": _flag, "bind_cores": _flag, "single_copy": _flag, "register_buffers": _flag,
            "flight_dir": _text, "cuda_blocking_wait": _flag}


def from_env(environ=None) -> Config:
    """Reads and validates every RINGZERO_* runtime variable of `environ` (default os.environ); an unset
    or empty variable keeps its default. Raises ValueError naming the variable and its allowed values."""
    environ = os.environ if environ is None else environ
    values = {}
    for name, field in VARIABLES.items():
        raw = environ.get(name)
        if raw is None or raw == "":
            continue
        values[field] = _PARSERS.get(field, _count)(name, raw)
    return Config(**values)


@contextlib.contextmanager
def settings(**fields):
    """Sets the variables of these Config fields (e.g. allreduce_algo="ring") for the block, validated
    as from_env would, and restores them after: what a communicator made inside reads when its group's
    first collective makes it (ringzero bench --device cuda makes a group per forced algorithm so)."""
    names = {field: name for name, field in VARIABLES.items()}
    unknown = sorted(set(fields) - set(names))
    if unknown:
        raise ValueError(f"ringzero settings: unknown field(s) {unknown}; choose from {sorted(names)}")
    values = {names[f]: str(v) for f, v in fields.items()}
    from_env({**os.environ, **values})  # a bad value fails here, before anything is set
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


__all__ = ["Config", "DEFAULT_TIMEOUT_S", "VARIABLES", "from_env", "settings"]
