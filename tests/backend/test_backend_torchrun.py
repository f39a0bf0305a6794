"""init_process_group("ringzero") under torchrun --nproc-per-node 2: tests/helpers/run_backend_train.py
trains stock DDP on the default (ringzero) group and on a gloo group over the same ranks, and exits
non-zero unless the parameters are bitwise equal (2 ranks: one float32 sum order) and the ringzero
backend ran the all-reduces. Also the device-map form "cpu:ringzero,cuda:<backend>": NCCL where
torch has it and a GPU is visible (skipped otherwise: NCCL groups cannot be created), gloo otherwise.
"""
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "helpers", "run_backend_train.py")


def torchrun(backend: str):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "python"), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", SCRIPT,
           "--backend", backend, "--steps", "10"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}"
    # Both ranks print to one pipe; their lines may run together.
    diffs = re.findall(r"rank (\d)/2 backend=\S+: max \|ringzero - gloo\| = (\S+),", proc.stdout)
    assert sorted(r for r, _ in diffs) == ["0", "1"], proc.stdout
    return [float(d) for _, d in diffs]


def test_torchrun_init_process_group_ringzero():
    assert torchrun("ringzero") == [0.0, 0.0]


@pytest.mark.parametrize("cuda_backend", ["gloo", "nccl"])
def test_torchrun_device_map(cuda_backend):
    if cuda_backend == "nccl" and not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL: 'cpu:ringzero,cuda:nccl' cannot be created here")
    if cuda_backend == "nccl" and not torch.cuda.is_available():
        # A CUDA build of torch on a machine without a GPU has NCCL, but ProcessGroupNCCL refuses to start.
        pytest.skip("no GPU here: ProcessGroupNCCL cannot be created ('cpu:ringzero,cuda:nccl')")
    assert torchrun(f"cpu:ringzero,cuda:{cuda_backend}") == [0.0, 0.0]
