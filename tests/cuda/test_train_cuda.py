"""`ringzero train --device cuda` (skipped without a GPU): the loss curve of every strategy follows the
CPU run of the same seed (float32 and bf16 tolerances in benchmarks/train_cuda_check.py, which states
them), and --resume on CUDA continues with the uninterrupted run's losses. Two ranks: on one GPU they
share it through CUDA IPC.
"""
import os
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))


def test_cuda_losses_follow_the_cpu_run():
    import train_cuda_check

    rows = train_cuda_check.numerics(2, 8)
    bad = [r for r in rows if r[2] > r[3]]
    assert not bad, bad


def test_resume_on_cuda_continues_the_losses():
    import train_cuda_check

    assert train_cuda_check.resume(2, 8) <= train_cuda_check.TOL_RESUME
