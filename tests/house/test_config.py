"""comm/config.py, the one reader of the RINGZERO_* runtime variables. Reference: the tables of
docs/environment.md (runtime and CUDA), which must list exactly the variables from_env reads, with the
same defaults; and the source tree, in which no other file may read a RINGZERO_* variable. No processes
are spawned."""
from __future__ import annotations

import dataclasses
import datetime
import pathlib
import re

import pytest

from ringzero import _C
from ringzero.comm import config as rz_config
from ringzero.comm.backend import backend_config
from ringzero.comm.config import DEFAULT_TIMEOUT_S, VARIABLES, Config, from_env

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENVIRONMENT_DOC = ROOT / "docs" / "environment.md"

# Documented in docs/environment.md but read elsewhere, each for a reason.
NOT_FROM_ENV = {
    "RINGZERO_CPU_ISA": "read by csrc/core/reduce.cpp when the kernels load (the C++ tests use it without Python)",
    "RINGZERO_FAULT": "test-time fault injection, read by trainer/faults.py at a training step",
    "RINGZERO_STEP_GATE": "test time: stops `ringzero train`'s ranks at given steps, read by trainer/faults.py",
    "RINGZERO_CUDA": "build time (setup.py)",
    "RINGZERO_FUZZ_SEED": "test time: the seed of the CUDA fuzz tests (C++ and Python)",
    "RINGZERO_FUZZ_CASES": "test time: how many cases the CUDA fuzz tests run",
    "RINGZERO_FUZZ_TIMEOUT_S": "test time: the kernels' wait timeout in the C++ CUDA fuzz",
    "RINGZERO_CPU_GRID_SMS": "the CPU grid (C++ test builds of the CUDA kernels): read by csrc/cuda/cpu_grid",
    "RINGZERO_CPU_GRID_CHAOS": "the CPU grid: read by csrc/cuda/cpu_grid",
    "RINGZERO_CPU_GRID_THREADS": "the CPU grid: read by csrc/cuda/cpu_grid",
    "RINGZERO_CPU_GRID_KERNEL_LOG": "the CPU grid: read by csrc/cuda/cpu_grid (ctest's coverage check)",
}  # Not in those tables and not runtime settings: RINGZERO_COMPAT_TORCH, RINGZERO_TORCH_CACHE (the
# compatibility check), RINGZERO_HOST_IDS (tests/helpers/harness.py).


def documented_rows() -> dict[str, str]:
    """variable -> its default column, from every table row of docs/environment.md that names one."""
    rows = {}
    for line in ENVIRONMENT_DOC.read_text().splitlines():
        m = re.match(r"\|\s*`(RINGZERO_[A-Z0-9_]+)`\s*\|\s*([^|]*?)\s*\|", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def test_documented_tables_and_from_env_agree():
    documented = set(documented_rows())
    read = set(VARIABLES)
    assert documented - read - set(NOT_FROM_ENV) == set(), "documented but not read by from_env"
    assert read - documented == set(), "read by from_env but not in docs/environment.md's tables"
    assert not read & set(NOT_FROM_ENV)


def test_documented_defaults_are_the_config_defaults():
    rows, cfg = documented_rows(), Config()
    for name, field in VARIABLES.items():
        column, value = rows[name], getattr(cfg, field)
        if field == "timeout_s":
            assert float(column) == DEFAULT_TIMEOUT_S, name
        elif isinstance(value, bool):
            assert column == str(int(value)), name
        elif isinstance(value, int):
            assert int(column) == value, name
        elif field == "allreduce_algo":
            assert column == value, name


def test_every_field_is_documented_and_read():
    fields = {f.name for f in dataclasses.fields(Config)}
    assert set(VARIABLES.values()) == fields
    source = pathlib.Path(rz_config.__file__).read_text()
    for field in fields:  # a docstring per field naming its variable
        name = next(k for k, v in VARIABLES.items() if v == field)
        assert re.search(rf"{field}: .*\n    \"\"\"{name}:", source), field


def test_no_other_python_file_reads_a_ringzero_variable():
    """config.py reads through VARIABLES; a literal RINGZERO_ name in an environment read elsewhere is
    a second reader (trainer/faults.py's RINGZERO_FAULT and RINGZERO_STEP_GATE are the listed exceptions)."""
    pattern = re.compile(r"""(environ(\.get)?[\[(]|getenv\()\s*f?["']RINGZERO_""")
    readers = {str(p.relative_to(ROOT)) for p in (ROOT / "python").rglob("*.py") if pattern.search(p.read_text())}
    assert readers == {"python/ringzero/trainer/faults.py"}, readers


def test_defaults_when_unset_or_empty():
    assert from_env({}) == Config()
    assert from_env({name: "" for name in VARIABLES}) == Config()
    assert Config().timeout_or(0) == DEFAULT_TIMEOUT_S and Config().timeout_or(12.5) == 12.5
    assert Config(timeout_s=3.0).timeout_or(12.5) == 3.0


def test_values_are_parsed():
    cfg = from_env({"RINGZERO_TIMEOUT_S": "1.5", "RINGZERO_SHM_BUFFER_BYTES": "4096", "RINGZERO_ALLREDUCE_ALGO": "Ring",
                    "RINGZERO_DEBUG": "1", "RINGZERO_HOST_ID": "a", "RINGZERO_CUDA_MAX_BLOCKS": "1e1"})
    assert (cfg.timeout_s, cfg.shm_buffer_bytes, cfg.allreduce_algo, cfg.debug, cfg.host_id, cfg.cuda_max_blocks) == \
        (1.5, 4096, "ring", True, "a", 10)
    assert cfg.peer_config()["timeout_s"] == 1.5 and cfg.peer_config(7.0)["timeout_s"] == 7.0


@pytest.mark.parametrize("name, raw, says", [
    ("RINGZERO_TIMEOUT_S", "soon", "RINGZERO_TIMEOUT_S='soon' is not a number"),
    ("RINGZERO_TIMEOUT_S", "-1", "RINGZERO_TIMEOUT_S must be positive"),
    ("RINGZERO_TIMEOUT_S", "nan", "RINGZERO_TIMEOUT_S must be positive"),
    ("RINGZERO_SHM_BUFFER_BYTES", "0", "RINGZERO_SHM_BUFFER_BYTES must be positive"),
    ("RINGZERO_CUDA_RING_CHANNELS", "0.5", "RINGZERO_CUDA_RING_CHANNELS must be at least 1"),
    ("RINGZERO_ALLREDUCE_ALGO", "fastest",
     "RINGZERO_ALLREDUCE_ALGO='fastest': use one of auto, oneshot, twoshot, ring"),
    ("RINGZERO_DEBUG", "maybe", r"RINGZERO_DEBUG='maybe': use 1 \(on\) or 0 \(off\)"),
])
def test_bad_values_name_the_variable_and_what_it_allows(name, raw, says):
    with pytest.raises(ValueError, match=says):
        from_env({name: raw})


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().timeout_s = 1.0


def test_the_backend_gets_the_config():
    """What comm/backend.py hands the C++ backend (_C.BackendConfig) is the validated Config."""
    cfg = from_env({"RINGZERO_SHM_BUFFER_BYTES": "4096", "RINGZERO_ALLREDUCE_ALGO": "ring", "RINGZERO_HOST_ID": "h"})
    got = backend_config(cfg, datetime.timedelta(seconds=9))
    assert (got.host_id, got.timeout_s, got.slot_bytes, got.all_reduce_algo) == ("h", 9.0, 4096,
                                                                                 _C.ALL_REDUCE_ALGOS["ring"])
    assert backend_config(from_env({"RINGZERO_TIMEOUT_S": "2.5"}), datetime.timedelta(seconds=9)).timeout_s == 2.5
    with pytest.raises(ValueError, match="all_reduce_algo must be one of"):
        _C.BackendConfig(host_id="h", timeout_s=1.0, slot_bytes=64, all_reduce_algo=len(_C.ALL_REDUCE_ALGOS))


def test_settings_sets_for_the_block_and_restores(monkeypatch):
    """config.settings: what a communicator made inside the block reads, validated first, and the
    variables as they were after (unset stays unset, a set value comes back), also after an error."""
    from ringzero.comm.config import settings

    monkeypatch.delenv("RINGZERO_ALLREDUCE_ALGO", raising=False)
    monkeypatch.setenv("RINGZERO_TIMEOUT_S", "7")
    with settings(allreduce_algo="ring", timeout_s=2.5):
        cfg = from_env()
        assert (cfg.allreduce_algo, cfg.timeout_s) == ("ring", 2.5)
    cfg = from_env()
    assert (cfg.allreduce_algo, cfg.timeout_s) == ("auto", 7.0)
    with pytest.raises(RuntimeError, match="inside"):
        with settings(allreduce_algo="oneshot"):
            raise RuntimeError("inside")
    assert from_env().allreduce_algo == "auto"
    with pytest.raises(ValueError, match="RINGZERO_ALLREDUCE_ALGO"):
        with settings(allreduce_algo="fastest"):
            pass
    with pytest.raises(ValueError, match="unknown field"):
        with settings(algo="ring"):
            pass
    assert from_env().allreduce_algo == "auto"
