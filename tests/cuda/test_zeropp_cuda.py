"""zeropp on CUDA tensors (tests/helpers/run_cuda_zeropp.py, which states the checks), 2 ranks sharing one GPU
through CUDA IPC: qw's gathered weights are the CPU kernels' dequantized masters bit for bit, hpz and qg change
nothing on one host, qw trains like plain ZeRO-3. Skipped without a GPU; CI runs the same script on CPU tensors
(tests/parallel/test_zeropp.py). Across hosts the CUDA form needs a GPU per rank (NCCL), so no test here."""
import pytest
import torch

from cuda_util import run_script

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_zeropp_on_cuda_tensors_one_host():
    out = run_script("run_cuda_zeropp.py", "2", "cuda", timeout_s=600)
    assert "ok 2 ranks cuda" in out, out
