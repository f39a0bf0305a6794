"""Training frameworks that start the worker processes themselves, on the "ringzero" backend, against the
same run on gloo: PyTorch Lightning's DDPStrategy(process_group_backend=...) on 2 CPU processes
(tests/lightning_train_script.py) must end with exactly gloo's parameters (2 ranks: each gradient
average is one addition, the same on both), must have moved them, and must have run on ringzero's
backend. Lightning is installed by tools/setup.sh; without it this fails naming it.
"""
import os
import subprocess
import sys

import pytest
import torch

SCRIPT = os.path.join(os.path.dirname(__file__), "lightning_train_script.py")


def train(backend, tmp_path):
    out = tmp_path / f"{backend}.pt"
    done = subprocess.run([sys.executable, SCRIPT, backend, str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{backend} run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return torch.load(out)


def test_lightning_ddp_on_ringzero_matches_gloo(tmp_path):
    try:
        import lightning  # noqa: F401
    except ImportError:
        pytest.fail("PyTorch Lightning is missing: tools/setup.sh installs it (pip install lightning)")
    gloo, ours = train("gloo", tmp_path), train("ringzero", tmp_path)
    assert int(gloo["final"]["ran_on_ringzero"]) == 0 and int(ours["final"]["ran_on_ringzero"]) == 1
    params = [name for name in gloo["final"] if name != "ran_on_ringzero"]
    assert len(params) == 4, params
    for name in params:
        assert torch.equal(ours["final"][name], gloo["final"][name]), f"{name}: ringzero and gloo runs differ"
        assert not torch.equal(gloo["final"][name], gloo["initial"][name]), f"{name} did not train"
