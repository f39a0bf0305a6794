"""Sharded, atomic, reshardable checkpoints for plain modules, DistributedDataParallel and ZeroDataParallel,
also over a tensor-parallel model (parallel.tensor_parallel.tensor_gpt), and for expert-parallel models
(parallel.expert, bare or in ExpertDataParallel).

Layout of a checkpoint root:
    ROOT/step-00000100/manifest.json    written last; a directory without it is never loaded
    ROOT/step-00000100/rank00000.pt     that rank's shards: weights and optimizer state, flat
    ROOT/step-00000100/tp001-rank00000.pt   the same for tensor rank 1 (tensor-parallel models)
    ROOT/.tmp-step-00000100/            where a save is written before the rename that publishes it

Every weight is stored as part of a flat group (a ZeRO bucket/unit sharded over the ranks, or one
replicated parameter written by rank 0) described in the manifest by names, shapes and offsets. Load
rebuilds, for each group of the *new* model, the ranges it owns from whichever old shards hold them,
so a checkpoint saved at one world size loads at another.

Tensor parallelism adds a second level ([Note: tensor-parallel checkpoints]): each tensor rank saves
its shards as above (over its data-parallel group), and the manifest records how every split
parameter was cut (dim, chunks), so load can join the old shards into the full tensor and cut the
piece the new model holds, at any tensor-parallel size (1: the plain GPT).

Expert parallelism ([Note: expert-parallel checkpoints] in parallel/expert/expert_state.py): each slice of
stacked experts is saved once with its global expert range, and load cuts the slice of the new model's ep
degree out of the saved ones (1: the plain MoEGPT, every expert whole).

    python -m ringzero.checkpoint consolidate ROOT_OR_DIR OUT.pt    # full state_dict of the plain module
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import comm
from ..parallel.data_parallel.ddp import DistributedDataParallel
from ..parallel.data_parallel.flat import FlatLayout
from ..parallel.data_parallel.zero import ZeroDataParallel
from ..parallel.expert.expert_data_parallel import ExpertDataParallel
from ..parallel.expert.expert_state import expert_ranges, model_names, piece_layout, saved_slices
from ..parallel.tensor_parallel.tensor_state import fused_sources, shard_specs, tensor_parallel_group

from .reader import FORMAT, MANIFEST, CheckpointReader

_before_commit = None  # test hook: called on every rank after the shards are written, before the manifest


def _wrapped(model) -> nn.Module:
    return model.module if isinstance(model, (DistributedDataParallel, ZeroDataParallel, ExpertDataParallel)) else model


def _group(model):
    if isinstance(model, (DistributedDataParallel, ZeroDataParallel)):
        return model.group
    if isinstance(model, ExpertDataParallel):
        return model.dp_group
    return dist.group.WORLD if dist.is_initialized() else None


def _zero(model) -> ZeroDataParallel | None:
    """The ZeroDataParallel whose masters a load writes (ExpertDataParallel's wrapper of the replicated part)."""
    inner = model.dense if isinstance(model, ExpertDataParallel) else model
    return inner if isinstance(inner, ZeroDataParallel) else None


def _entries(model):
    """(layout, values, optimizer parameter, sharded) per flat group of `model`. values is a 1-D
    view of this rank's weights (its master shard, or a whole replicated parameter, or this rank's slice
    of an expert parameter). Slot names are those of the plain module (_wrapped(model))."""
    if isinstance(model, ExpertDataParallel):
        names = model_names(model.dense.module, model.module)
        dense = [(_renamed(layout, names), values, p, sharded) for layout, values, p, sharded in _entries(model.dense)]
        return dense + [(FlatLayout([(n, p)], 1, 0), p.detach().view(-1), p, False)
                        for n, p in zip(model.expert_names, model.expert_params)]
    if isinstance(model, ZeroDataParallel):
        return [(g.layout, g.master.detach(), g.master, True) for g in model.groups]
    return [(FlatLayout([(n, p)], 1, 0), p.detach().view(-1), p, False)
            for n, p in _wrapped(model).named_parameters()]


def _renamed(layout: FlatLayout, names: dict[str, str]) -> FlatLayout:
    """A copy of `layout` (same offsets and shard) with every slot named names[slot.name]."""
    out = copy.copy(layout)
    out.slots = [dataclasses.replace(s, name=names[s.name]) for s in layout.slots]
    return out


def _fsync_write(path: Path, write):
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(path, model, optimizer=None, step: int = 0, extra=None) -> Path:
    """Writes ROOT/step-{step:08d} atomically; every rank of the model's group must call it.

    model: a plain module, DistributedDataParallel or ZeroDataParallel; optimizer: the torch optimizer
    built on model.parameters() (or None); extra: anything torch.save can store (rank 0's is kept).
    An expert-parallel model (ExpertDataParallel, or a bare model whose group holds every expert) saves each
    slice of its experts once, from the lowest rank holding it ([Note: expert-parallel checkpoints]).
    Returns the published directory. A crash at any point leaves the previous checkpoint loadable."""
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"checkpoint.save: step must be a non-negative int, got {step!r}")
    group = _group(model)
    rank = dist.get_rank(group) if group is not None else 0
    world = dist.get_world_size(group) if group is not None else 1
    _, tp, tp_rank = tensor_parallel_group(_wrapped(model))
    specs = shard_specs(_wrapped(model))
    if tp > 1 and world * tp != dist.get_world_size():
        raise ValueError(f"checkpoint.save: a tensor-parallel model saves from every rank: its data-parallel group "
                         f"({world}) times its tensor group ({tp}) must be the world ({dist.get_world_size()}); "
                         "wrap it in DistributedDataParallel or ZeroDataParallel over the data-parallel group")
    experts, pieces = saved_slices(_wrapped(model), group)
    if experts and (tp > 1 or isinstance(model, ZeroDataParallel)):
        raise ValueError("checkpoint.save: an expert-parallel model is saved bare or in ExpertDataParallel (its "
                         "experts are not ZeRO's to shard), and not tensor-parallel too")
    everyone = dist.group.WORLD if tp > 1 else group  # the ranks that write files
    first = rank == 0 and tp_rank == 0  # writes the directory, the buffers and the manifest
    root = Path(path)
    final, tmp = root / f"step-{step:08d}", root / f".tmp-step-{step:08d}"
    if first:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # left by an interrupted save of the same step
        tmp.mkdir()
    _barrier(everyone)

    tensors, groups = {}, []
    for i, (layout, values, opt_param, sharded) in enumerate(_entries(model)):
        expert = layout.slots[0].name if len(layout.slots) == 1 and layout.slots[0].name in experts else None
        if expert is not None:
            for r, writer in pieces[expert]:
                groups.append({"layout": piece_layout(layout.describe(), r), "sharded": False, "key": i,
                               "tp_rank": 0, "files": [_file_name(0, writer, 1)], "experts": r._asdict()})
            if (experts[expert], rank) not in pieces[expert]:
                continue
        else:
            split = any(slot.name in specs for slot in layout.slots)
            for t in range(tp) if sharded or split else [0]:
                groups.append({"layout": layout.describe(), "sharded": sharded, "key": i, "tp_rank": t,
                               "files": [_file_name(t, r, tp) for r in range(world if sharded else 1)]})
            if (not sharded and rank != 0) or not (sharded or split or tp_rank == 0):
                continue
        tensors[f"{i}.values"] = values.clone()
        state = optimizer.state.get(opt_param, {}) if optimizer is not None else {}
        for key, v in state.items():
            flat = isinstance(v, torch.Tensor) and v.numel() == opt_param.numel() and v.dim() > 0
            tensors[f"{i}.state.{key}"] = v.detach().reshape(-1).clone() if flat else v
    if first:
        tensors["buffers"] = {n: b.detach().clone() for n, b in _wrapped(model).named_buffers()}
        tensors["extra"] = extra
        if optimizer is not None:
            tensors["param_groups"] = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    _fsync_write(tmp / _file_name(tp_rank, rank, tp), lambda f: torch.save(tensors, f))
    _barrier(everyone)  # every shard is on disk before the manifest says the checkpoint exists

    if _before_commit is not None:
        _before_commit()
    if first:
        manifest = {"format": FORMAT, "step": step, "world": world, "groups": groups,
                    "files": [_file_name(t, r, tp) for t in range(tp) for r in range(world)]}
        if tp > 1:
            manifest["tensor_parallel"] = {"tp": tp, "shards": {n: list(spec) for n, spec in specs.items()}}
        fused = fused_sources(_wrapped(model))
        if fused:
            manifest["fused"] = fused
        _fsync_write(tmp / (MANIFEST + ".tmp"), lambda f: f.write(json.dumps(manifest, indent=1).encode()))
        os.replace(tmp / (MANIFEST + ".tmp"), tmp / MANIFEST)
        if final.exists():  # saving the same step again: the new one replaces it
            old = root / f".old-step-{step:08d}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, final)
        _fsync_dir(root)
    _barrier(everyone)
    return final


def _file_name(tp_rank: int, rank: int, tp: int) -> str:
    """The file of data-parallel rank `rank` of tensor rank `tp_rank` (without tensor parallelism, the
    name checkpoints always had)."""
    return f"rank{rank:05d}.pt" if tp == 1 else f"tp{tp_rank:03d}-rank{rank:05d}.pt"


def _barrier(group):
    if group is not None and dist.get_world_size(group) > 1:
        comm.barrier(group=group)


def latest(path) -> Path:
    """The checkpoint directory to load: `path` itself if it holds a manifest, else the complete
    step-* directory under it with the highest step. Raises FileNotFoundError when there is none."""
    p = Path(path)
    if (p / MANIFEST).is_file():
        return p
    done = sorted(d for d in p.glob("step-*") if (d / MANIFEST).is_file()) if p.is_dir() else []
    if not done:
        raise FileNotFoundError(f"no complete checkpoint (a step-* directory with {MANIFEST}) under {p}")
    return done[-1]


def load(path, model, optimizer=None) -> dict:
    """Restores the latest complete checkpoint under `path` (or the checkpoint `path`) into `model`
    (plain, DDP or ZeRO, any world size and stage; expert-parallel at any ep degree that divides its
    experts, [Note: expert-parallel checkpoints]) and `optimizer` (built on model.parameters(), with
    as many param groups as when saved). Every rank of the model's group must call it.
    Returns {"step", "extra", "path"}."""
    ckpt = latest(path)
    reader = CheckpointReader(ckpt)
    _, tp, tp_rank = tensor_parallel_group(_wrapped(model))
    fused = fused_sources(_wrapped(model))
    target = (tp, tp_rank, shard_specs(_wrapped(model)), fused, expert_ranges(_wrapped(model)))
    entries = _entries(model)
    reader.check_experts({s.name: s.shape for layout, *_ in entries for s in layout.slots}, target[4])
    for layout, values, opt_param, sharded in entries:
        start, count = (layout.shard_start, layout.shard_numel) if sharded else (0, layout.numel)
        with torch.no_grad():
            buf = torch.zeros(count, dtype=torch.float32)
            reader.fill(layout, start, count, "values", buf, target)
            values.copy_(buf)
        if optimizer is None or not layout.slots:
            continue
        flat_keys, other = reader.state_keys(reader.group_of(reader.saved_name(layout.slots[0].name, fused)))
        state = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in other.items()}
        for key in flat_keys:
            buf = torch.zeros(count, dtype=torch.float32)
            reader.fill(layout, start, count, f"state.{key}", buf, target)
            state[key] = buf.view_as(opt_param).to(opt_param.device)
        current = optimizer.state.get(opt_param, {})
        for key, v in state.items():
            # Copy into existing state tensors (an optimizer such as FusedAdamW keeps them as views of
            # its flat buffers, which its kernel updates); otherwise install the loaded ones.
            old = current.get(key)
            if isinstance(old, torch.Tensor) and isinstance(v, torch.Tensor) and old.shape == v.shape:
                with torch.no_grad():
                    old.copy_(v)
            else:
                current[key] = v
        optimizer.state[opt_param] = current
    rank0 = reader.first
    with torch.no_grad():
        for name, b in _wrapped(model).named_buffers():
            b.copy_(rank0["buffers"][name])
    if optimizer is not None and "param_groups" in rank0:
        saved = rank0["param_groups"]
        if len(saved) != len(optimizer.param_groups):
            raise ValueError(f"{ckpt}: saved optimizer had {len(saved)} param groups, this one has "
                             f"{len(optimizer.param_groups)}")
        for g, s in zip(optimizer.param_groups, saved):
            g.update(s)
    if _zero(model) is not None:
        _zero(model).masters_written()  # gather the loaded masters before the next forward
    return {"step": reader.manifest["step"], "extra": rank0.get("extra"), "path": ckpt}


def consolidate(path) -> dict[str, torch.Tensor]:
    """The full state_dict (parameters as float32 from the masters, buffers) of the plain module
    saved in the checkpoint `path` (or the latest under it). Runs in one process, no group needed."""
    reader = CheckpointReader(latest(path))
    out = {}
    for name in reader.names:
        for part in reader.fused.get(name, {}).get("parts", [name]):  # the unfused model's names
            if part not in out:
                out[part] = reader.full(part).clone()
    for name, b in reader.first["buffers"].items():
        out[name] = b.clone()
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 3 or argv[0] != "consolidate":
        print("usage: python -m ringzero.checkpoint consolidate CHECKPOINT_ROOT_OR_DIR OUT.pt", file=sys.stderr)
        return 2
    state = consolidate(argv[1])
    torch.save(state, argv[2])
    print(f"wrote {len(state)} tensors from {latest(argv[1])} to {argv[2]}")
    return 0

