"""A killed rank under `torchrun --max-restarts 1`: the run restarts, resumes from the last complete
checkpoint and ends with parameters bit-identical to an uninterrupted run (CPU, deterministic data and
kernels). Reference: the same command without the fault.
"""
import os
import subprocess
import sys

import torch

from ringzero import checkpoint

ARGS = ["--strategy", "zero2", "--steps", "12", "--save-every", "4", "--val-every", "0", "--batch", "8", "--seq", "32",
        "--layers", "2", "--d-model", "64", "--heads", "2", "--no-progress"]


def torchrun(tmp, name, restarts, env_extra):
    ckpt, out = tmp / f"{name}-ckpt", tmp / f"{name}-out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", str(restarts), "--monitor-interval", "0.5", "-m", "ringzero.cli.train", *ARGS,
           "--checkpoint-dir", str(ckpt), "--resume", "--out", str(out)]
    env = {**os.environ, "RINGZERO_TIMEOUT_S": "60", **env_extra}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return ckpt, out, proc


def test_killed_rank_restarts_resumes_and_matches(tmp_path):
    ref_ckpt, _, _ = torchrun(tmp_path, "ref", 0, {})
    ckpt, out, proc = torchrun(tmp_path, "faulty", 1, {"RINGZERO_FAULT": "kill:rank=1:step=7"})
    import json

    with open(out / "results.json") as f:
        result = json.load(f)
    assert result["start_step"] == 4, result["start_step"]  # the step-8 checkpoint was never written
    ref = checkpoint.consolidate(checkpoint.latest(ref_ckpt))
    got = checkpoint.consolidate(checkpoint.latest(ckpt))
    assert ref.keys() == got.keys()
    for k in ref:
        assert torch.equal(ref[k], got[k]), k
    assert not [p for p in os.listdir("/dev/shm") if p.startswith("ringzero-")]
