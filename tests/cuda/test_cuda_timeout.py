"""A CUDA peer that never arrives or dies: the other ranks must raise ringzero.CommTimeout naming it
within about RINGZERO_TIMEOUT_S, and stay usable (no hang, no trapped kernel, no poisoned CUDA
context). Reference: the rank the script leaves out. N processes on one GPU through CUDA IPC
(tests/helpers/run_cuda_ipc_timeout.py); the same without torch on simulated ranks is tests/cpp/test_cuda_timeout.cu.
Skips without CUDA (a skip is not a pass: benchmarks/gpu_check.sh runs it on a GPU).
"""
from cuda_util import gpu, run_script


@gpu
def test_absent_peer_raises_comm_timeout():
    """One-shot, two-shot and ring, one group each: the last rank skips one all-reduce."""
    out = run_script("run_cuda_ipc_timeout.py", "3", "absent", timeout_s=170)
    assert "ok 3 ranks" in out, out


@gpu
def test_dead_peer_raises_comm_timeout():
    """The last rank exits instead of a ring all-reduce (the others wait for it through a chain)."""
    out = run_script("run_cuda_ipc_timeout.py", "3", "dead", timeout_s=170)
    assert "ok 3 ranks" in out, out
