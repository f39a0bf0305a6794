"""The tests of torch's suite that pass on gloo and may not pass on ringzero, each with the line of torch
that decides it by the backend's name (not by what the backend does). COMPATIBILITY.md lists the same.

With BACKEND=ringzero, a test whose decorators in distributed_test.py name the backend
(run.backend_gates finds the line) is skipped by the suite itself; that is accepted only as a skip.
The failures below come from torch's library code, not from the suite's decorators.
"""
from __future__ import annotations

# Fail with BACKEND=ringzero.
RINGZERO_FAILS = {
    "test_ddp_logging_data_cpu": "DDP's logging data reports the ProcessGroup's name, which is \"custom\" for "
    "every plugin backend (torch/csrc/distributed/c10d/ProcessGroup.hpp:168-169, getBackendName() returns "
    "backendTypeToString(backendType_), CUSTOM), while the test expects dist.get_backend() (\"ringzero\")",
}

# Fail when ringzero stands in for every gloo group (BACKEND=gloo).
STAND_IN_FAILS = {
    "test_get_backend": "asserts dist.get_backend() == BACKEND (\"gloo\"); the group is a ringzero group by design",
    "test_ddp_logging_data_cpu": RINGZERO_FAILS["test_ddp_logging_data_cpu"],
    "test_monitored_barrier_gloo": "torch/distributed/distributed_c10d.py:5418 (2.13.0): monitored_barrier raises "
    "unless get_backend(group) == Backend.GLOO (ringzero's backend implements monitoredBarrier, on its inner gloo)",
    "test_monitored_barrier_gloo_subgroup": "the same line of distributed_c10d.py",
}
