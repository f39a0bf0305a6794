"""`ringzero train` across 2 lab hosts (tests/helpers/hostlab.py: separate network, hostname and /dev/shm; torchrun
per host, c10d rendezvous on host 0) against the same command on one host (`torchrun --standalone
--nproc-per-node 2`): DDP and ZeRO-2 end with the parameters of the one-host run within PARAM_ATOL.
Not bitwise: `ringzero train` gives each rank cpu_count / ranks-on-its-host intra-op threads
(launch.py), 2 on a lab host of one rank against 1 on the one-host run, so the matmuls sum in other
orders; the gradient all-reduce of 2 ranks is one float32 sum on either path.

ZeRO-2 with rank 1 killed at step 7 under `--max-restarts 1`: both hosts restart (host 1's agent
counts a restart, host 0's restarts on the membership change without counting: launch.py's round
prefix must not rest on the restart count), resume from the step-4 checkpoint and end bit-identical to
the uninterrupted two-host run.

The checkpoints go to this machine's /tmp, which the lab's hosts share (on a real cluster
--checkpoint-dir is best on a shared file system).

Needs root and iproute2: where they are missing these tests FAIL naming what is missing.
"""
import json
import os
import subprocess
import sys
import time

import pytest
import torch

import hostlab
from ringzero import checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARGS = ["--steps", "12", "--save-every", "4", "--val-every", "0", "--batch", "8", "--seq", "32", "--layers", "2",
        "--d-model", "64", "--heads", "2", "--no-progress"]
TIMEOUT_S = 400
PARAM_ATOL = 1e-4
"""12 Adam steps at lr 2e-3 from float32 rounding differences; a wrong gradient moves parameters by ~lr."""


def train_argv(strategy, ckpt):
    return ["-m", "ringzero.cli.train", "--strategy", strategy, *ARGS, "--checkpoint-dir", str(ckpt), "--resume",
            "--out", f"{ckpt}-out"]


def one_host(strategy, ckpt):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RINGZERO_TIMEOUT_S": "60"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "python"), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           *train_argv(strategy, ckpt)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def final_params(ckpt):
    return checkpoint.consolidate(checkpoint.latest(ckpt))


def lab_train(tmp_path, name, strategy, fault=None):
    """`ringzero train` on 2 lab hosts x 1 rank (fault: RINGZERO_FAULT, restarted under --max-restarts 1);
    returns the final parameters and the step the last attempt started from."""
    env = {"RINGZERO_TIMEOUT_S": "60", **({"RINGZERO_FAULT": fault} if fault else {})}
    with hostlab.HostLab(2) as lab:
        runs = lab.run([1, 1], train_argv(strategy, tmp_path / name), env, TIMEOUT_S, max_restarts=1 if fault else 0)
    for r in runs:
        assert r.returncode == 0, f"host {r.host}: torchrun exited {r.returncode}\n{r.output[-6000:]}"
        assert r.shm_left == [], f"host {r.host}: /dev/shm still holds {r.shm_left}"
    with open(tmp_path / f"{name}-out" / "results.json") as f:
        return final_params(tmp_path / name), json.load(f)["start_step"]


def max_difference(want, got):
    assert want.keys() == got.keys()
    return max((want[k].float() - got[k].float()).abs().max().item() for k in want)


@pytest.mark.parametrize("strategy", ["ddp", "zero2"])
def test_two_hosts_train_like_one(tmp_path, strategy):
    missing = hostlab.missing_requirements()
    if missing:
        pytest.fail("the host lab needs " + "; ".join(missing) + " (CI has them; run the tests as root)")
    one_host(strategy, tmp_path / "one")
    got, start_step = lab_train(tmp_path, "lab", strategy)
    assert start_step == 0
    diff = max_difference(final_params(tmp_path / "one"), got)
    print(f"{strategy}: max |one host - two hosts| = {diff:.3g}")
    assert diff <= PARAM_ATOL
    if strategy != "zero2":
        return
    # Rank 1 (host 1) killed at step 7, before the step-8 checkpoint: both hosts restart, resume from
    # step 4 and end bit-identical to the uninterrupted two-host run.
    resumed, start_step = lab_train(tmp_path, "lab-killed", strategy, fault="kill:rank=1:step=7")
    assert start_step == 4, f"start step {start_step}"
    for k in got:
        assert torch.equal(got[k], resumed[k]), k
    print("zero2 with rank 1 killed at step 7: bit-identical to the uninterrupted two-host run")


ZEROPP_MODEL = ["--seq", "32", "--layers", "2", "--d-model", "256", "--heads", "4"]  # blocks 3.0 MiB, root 0.5 MiB
SMALL_MODEL = ["--seq", "32", "--layers", "3", "--d-model", "128", "--heads", "4"]  # blocks 0.8 MiB, root 0.3 MiB


def zeropp_bytes(lab, zeropp, steps, model, gate_dir):
    """Bytes each host sent per step of `ringzero train --strategy zero3 [--zeropp]` on 2 x 2 lab hosts, counted
    on the lab's links over steps 2 to `steps` - 1 of one run: every rank stops at the start of step 2 and of
    step `steps` (RINGZERO_STEP_GATE, trainer/faults.py), and the counters are read while all of them wait, once
    they have stopped moving (setup, the first steps' one-time costs and the final validation fall outside)."""
    how = ["--strategy", "zero3"] + (["--zeropp", zeropp] if zeropp else [])
    gates = (2, steps)
    os.makedirs(gate_dir, exist_ok=True)
    env = {"RINGZERO_TIMEOUT_S": "60", "RINGZERO_STEP_GATE": f"steps={gates[0]},{gates[1]}:dir={gate_dir}"}
    procs = lab.start([2, 2], ["-m", "ringzero.cli.train", *how, "--batch", "4", *model, "--val-every", "0",
                               "--no-progress", "--steps", str(steps + 1)], env)
    sent = []
    try:
        for step in gates:
            deadline = time.monotonic() + TIMEOUT_S
            while sum(name.startswith(f"at-{step}-") for name in os.listdir(gate_dir)) < 4:
                assert all(p.poll() is None for p in procs), f"a host's torchrun exited before step {step}'s gate"
                assert time.monotonic() < deadline, f"the ranks did not all reach step {step} in {TIMEOUT_S} s"
                time.sleep(0.05)
            sent.append(settled_bytes(lab))
            open(os.path.join(gate_dir, f"go-{step}"), "w").close()
    finally:
        runs = lab.wait(procs, TIMEOUT_S)
    for r in runs:
        assert r.returncode == 0, f"host {r.host}: torchrun exited {r.returncode}\n{r.output[-6000:]}"
    return (sent[1] - sent[0]) / (gates[1] - gates[0])


def settled_bytes(lab, quiet_s=0.3, limit_s=10.0):
    """The bytes all hosts sent so far, on average per host, once the counters stayed the same for quiet_s
    (a send still in flight when the ranks stopped lands first)."""
    deadline = time.monotonic() + limit_s
    last = sum(lab.sent_bytes())
    while True:
        time.sleep(quiet_s)
        now = sum(lab.sent_bytes())
        if now == last or time.monotonic() > deadline:
            return now / lab.hosts
        last = now


def test_zeropp_sends_what_the_estimate_counts(tmp_path):
    """ZeRO-3 plain, with hpz alone and with hpz,qw,qg across 2 lab hosts x 2 ranks, and plain on a model whose
    blocks are under 2 MiB: the bytes each host's link carried per step are `ringzero estimate`'s count within 2%
    (frame headers, the loss's all-reduce and the clip's; measured 1.003, 1.004, 1.008 and 1.004 on 2026-12-02),
    and the options cut them below a third (issue 46's bar; measured 13%). The estimate
    counts what the transport does: the blocks (3 MiB each) take the pipelined hierarchical collectives ((H-1)/H
    of the buffer over each host's link), an all-gather or reduce-scatter under 2 MiB (the root group here, every
    unit of the small model) the flat ring ((world-1)/world: 3/4 here, not 1/2; the estimate that assumed the
    hierarchical form at every size was 1.43x off with blocks of 0.8 MiB), and the root group is gathered once per
    forward, without an hpz secondary (4.5% off for hpz alone when the estimate counted it as two units like the
    blocks)."""
    missing = hostlab.missing_requirements()
    if missing:
        pytest.fail("the host lab needs " + "; ".join(missing) + " (CI has them; run the tests as root)")
    from ringzero.estimate import Plan, estimate
    from ringzero.estimate.communication import cross_host_bytes
    from ringzero.models import GPTConfig

    def config(model):
        arg = lambda name: int(model[model.index(name) + 1])  # noqa: E731
        return GPTConfig(vocab_size=256, seq_len=arg("--seq"), n_layer=arg("--layers"), n_head=arg("--heads"),
                         d_model=arg("--d-model"))

    cases = [("", ZEROPP_MODEL), ("hpz", ZEROPP_MODEL), ("hpz,qw,qg", ZEROPP_MODEL), ("", SMALL_MODEL)]
    got = {}
    with hostlab.HostLab(2) as lab:
        for zeropp, model in cases:
            got[zeropp, model is SMALL_MODEL] = zeropp_bytes(lab, zeropp, 6, model, tmp_path / f"gates{len(got)}")
    for (zeropp, small), sent in got.items():
        plan = Plan("zero3", world=4, zeropp=zeropp, ranks_per_host=2)
        want = cross_host_bytes(estimate(config(SMALL_MODEL if small else ZEROPP_MODEL), batch=4, plan=plan))
        what = f"zero3 {zeropp or 'plain'}{', the small model' if small else ''}"
        print(f"{what}: {sent:.0f} bytes per host and step, estimate {want:.0f} ({sent / want:.3f})")
        assert abs(sent / want - 1) <= 0.02, f"{what}: {sent:.0f} bytes per step against the estimate's {want:.0f}"
    assert got["hpz,qw,qg", False] <= got["", False] / 3
