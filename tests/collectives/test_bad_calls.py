"""Bad input everywhere public, as one table: each row is a call that must raise a specific exception
whose message names the argument (collectives, optimizer, low-level ops, wrappers, mesh, checkpoint,
command lines, environment). Reference: the documented contract of each function.
"""
import os

import pytest
import torch
import torch.distributed as dist

import ringzero
from harness import run_ranks


def _world_rows(tmp):
    from ringzero import checkpoint, ops
    from ringzero.optim import FusedAdamW
    from ringzero.parallel import DistributedDataParallel, Mesh, ZeroDataParallel

    p = torch.nn.Parameter(torch.ones(3))
    t = torch.ones(8)
    lin = torch.nn.Linear(2, 2)
    bad_ckpt = os.path.join(tmp, "bad")
    os.makedirs(os.path.join(bad_ckpt, "step-00000001"), exist_ok=True)
    with open(os.path.join(bad_ckpt, "step-00000001", "manifest.json"), "w") as f:
        f.write("{not json")
    return [
        # collectives
        ("all_reduce float64 op BOR", ValueError, "op=", lambda: ringzero.all_reduce(t, op=dist.ReduceOp.BOR)),
        ("all_reduce bool", TypeError, "dtype torch.bool", lambda: ringzero.all_reduce(torch.ones(2, dtype=torch.bool))),
        ("all_reduce complex", TypeError, "complex", lambda: ringzero.all_reduce(torch.ones(2, dtype=torch.complex64))),
        ("all_reduce non-contiguous", ValueError, "contiguous", lambda: ringzero.all_reduce(torch.ones(3, 3).t())),
        ("all_reduce meta device", ValueError, "meta", lambda: ringzero.all_reduce(torch.ones(2, device="meta"))),
        ("all_reduce list", TypeError, "must be a torch.Tensor", lambda: ringzero.all_reduce([1, 2])),
        ("reduce_scatter sizes", ValueError, "world_size", lambda: ringzero.reduce_scatter_single(torch.empty(8), t)),
        ("reduce_scatter dtypes", TypeError, "differs", lambda: ringzero.reduce_scatter_single(
            torch.empty(8, dtype=torch.float64), torch.empty(16))),
        ("all_gather sizes", ValueError, "output_tensor has", lambda: ringzero.all_gather_single(torch.empty(3), t)),
        ("all_gather_v counts length", ValueError, "counts must hold", lambda: ringzero.all_gather_v(torch.empty(8), t, [8])),
        ("all_gather_v counts type", TypeError, "sequence of ints", lambda: ringzero.all_gather_v(torch.empty(8), t, ["a", "b"])),
        ("broadcast src not in group", ValueError, "src=9", lambda: ringzero.broadcast(t, src=9)),
        ("broadcast src and group_src", ValueError, "exactly one", lambda: ringzero.broadcast(t, src=0, group_src=0)),
        ("reduce group_dst range", ValueError, "group_dst=5", lambda: ringzero.reduce(t, group_dst=5)),
        ("group of wrong type", TypeError, "group must be a ProcessGroup", lambda: ringzero.barrier(group=3)),
        # optimizer and ops
        ("FusedAdamW lr", ValueError, "learning rate", lambda: FusedAdamW([p], lr=-1)),
        ("FusedAdamW betas", ValueError, "betas", lambda: FusedAdamW([p], betas=(1.5, 0.9))),
        ("FusedAdamW eps", ValueError, "epsilon", lambda: FusedAdamW([p], eps=-1)),
        ("FusedAdamW weight_decay", ValueError, "weight_decay", lambda: FusedAdamW([p], weight_decay=-0.1)),
        ("FusedAdamW int params", TypeError, "dtype torch.int64", lambda: FusedAdamW([torch.ones(3, dtype=torch.int64)])),
        ("adam_step_ sizes", ValueError, "grad has 4 elements", lambda: ops.adam_step_(
            torch.ones(3), torch.ones(4), torch.zeros(3), torch.zeros(3), lr=1e-3, beta1=0.9, beta2=0.99, eps=1e-8,
            weight_decay=0, step=1)),
        # wrappers and mesh
        ("ZeRO stage", ValueError, "stage must be 1, 2 or 3", lambda: ZeroDataParallel(lin, stage=4)),
        ("ZeRO unit without stage 3", ValueError, "unit=", lambda: ZeroDataParallel(lin, stage=2, unit=torch.nn.Linear)),
        ("ZeRO not a module", TypeError, "module must be an nn.Module", lambda: ZeroDataParallel("model")),
        ("ZeRO own_bucket at stage 3", ValueError, "own_bucket= applies to stages 1-2",
         lambda: ZeroDataParallel(lin, stage=3, own_bucket=[lin.weight])),
        ("ZeRO own_bucket not the module's", ValueError, "own_bucket parameter must be a parameter of module",
         lambda: ZeroDataParallel(lin, stage=2, own_bucket=[torch.nn.Parameter(torch.ones(2))])),
        ("DDP not a module", TypeError, "nn.Module", lambda: DistributedDataParallel(3)),
        ("Mesh pp does not divide", ValueError, "does not divide", lambda: Mesh(pp=3) if dist.get_world_size() == 2 else
         (_ for _ in ()).throw(ValueError("does not divide"))),
        ("Mesh axis", ValueError, "unknown mesh axis", lambda: Mesh(pp=1).group("xp")),
        # checkpoint
        ("load missing checkpoint", FileNotFoundError, "no complete checkpoint", lambda: checkpoint.load(
            os.path.join(tmp, "none"), lin)),
        ("load corrupt manifest", ValueError, "manifest", lambda: checkpoint.load(bad_ckpt, ZeroDataParallel(lin, stage=1))),
    ]


def world_body(rank, world, tmp):
    rows = _world_rows(tmp)
    for name, exc, pattern, call in rows:
        with pytest.raises(exc, match=pattern):
            call()
    return len(rows)


def test_bad_calls_in_a_process_group(tmp_path):
    counts = run_ranks(2, world_body, str(tmp_path))
    assert counts[0] >= 29


@pytest.mark.parametrize("argv,pattern", [
    (["train", "--strategy", "warp"], "invalid choice"),
    (["train", "--steps", "0"], "--steps must be at least 1"),
    (["train", "--strategy", "pp", "--nproc", "2", "--pp", "3"], "must divide --nproc"),
    (["train", "--save-every", "2"], "need --checkpoint-dir"),
    (["train", "--bogus-flag"], "unrecognized arguments"),
    (["bench", "--ops", "all_to_some"], "unknown op"),
    (["bench", "--min-bytes", "1K", "--max-bytes", "8"], "--min-bytes <= --max-bytes"),
    (["estimate", "--params", "1B", "--world", "0"], "world"),
])
def test_bad_command_lines(argv, pattern, capsys):
    from ringzero.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code != 0
    assert pattern in capsys.readouterr().err


def test_unknown_command_and_bad_environment(capsys, monkeypatch):
    from ringzero.__main__ import main

    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err
    monkeypatch.setenv("RINGZERO_FAULT", "explode:rank=0:step=1")
    from ringzero.trainer import _maybe_fault

    with pytest.raises(ValueError, match="RINGZERO_FAULT"):
        _maybe_fault(1)
