"""Training frameworks that start the worker processes themselves, on the "ringzero" backend, against the
same run on gloo: PyTorch Lightning's DDPStrategy(process_group_backend=...) on 2 CPU processes
(tests/lightning_train_script.py) and Ray Train's TorchTrainer with TorchConfig(backend=...) on a local
Ray cluster with 2 CPU workers that never import ringzero (tests/ray_train_script.py: torch's backend
autoload registers it) must end with exactly gloo's parameters (2 ranks: each gradient average is one
addition, the same on both), must have moved them, and must have run on ringzero's backend. Lightning
and Ray are installed by tools/setup.sh; without them this fails naming them.
"""
import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(__file__)


def train(script, backend, tmp_path):
    out = tmp_path / f"{backend}.pt"
    done = subprocess.run([sys.executable, os.path.join(HERE, script), backend, str(out)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"{backend} run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return torch.load(out)


def test_lightning_ddp_on_ringzero_matches_gloo(tmp_path):
    try:
        import lightning  # noqa: F401
    except ImportError:
        pytest.fail("PyTorch Lightning is missing: tools/setup.sh installs it (pip install lightning)")
    gloo, ours = train("lightning_train_script.py", "gloo", tmp_path), train("lightning_train_script.py", "ringzero",
                                                                             tmp_path)
    assert int(gloo["final"]["ran_on_ringzero"]) == 0 and int(ours["final"]["ran_on_ringzero"]) == 1
    params = [name for name in gloo["final"] if name != "ran_on_ringzero"]
    assert len(params) == 4, params
    for name in params:
        assert torch.equal(ours["final"][name], gloo["final"][name]), f"{name}: ringzero and gloo runs differ"
        assert not torch.equal(gloo["final"][name], gloo["initial"][name]), f"{name} did not train"


def test_ray_train_on_ringzero_matches_gloo(tmp_path):
    try:
        import ray.train.torch  # noqa: F401
    except ImportError:
        pytest.fail("Ray Train is missing: tools/setup.sh installs it (pip install 'ray[train]')")
    gloo, ours = train("ray_train_script.py", "gloo", tmp_path), train("ray_train_script.py", "ringzero", tmp_path)
    assert (gloo["backend_class"], ours["backend_class"]) == ("ProcessGroupGloo", "RingzeroBackend")
    assert len(gloo["final"]) == 4, list(gloo["final"])
    for name, value in gloo["final"].items():
        assert torch.equal(ours["final"][name], value), f"{name}: ringzero and gloo runs differ"
        assert not torch.equal(value, gloo["initial"][name]), f"{name} did not train"
