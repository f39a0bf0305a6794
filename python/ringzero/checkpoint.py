"""Sharded, atomic, reshardable checkpoints for plain modules, DistributedDataParallel and ZeroDataParallel.

Layout of a checkpoint root:
    ROOT/step-00000100/manifest.json    written last; a directory without it is never loaded
    ROOT/step-00000100/rank00000.pt     that rank's shards: weights and optimizer state, flat
    ROOT/.tmp-step-00000100/            where a save is written before the rename that publishes it

Every weight is stored as part of a flat group (a ZeRO bucket/unit sharded over the ranks, or one
replicated parameter written by rank 0) described in the manifest by names, shapes and offsets. Load
rebuilds, for each group of the *new* model, the ranges it owns from whichever old shards hold them,
so a checkpoint saved at one world size loads at another.

    python -m ringzero.checkpoint consolidate ROOT_OR_DIR OUT.pt    # full state_dict of the plain module
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from . import comm
from .parallel.ddp import DistributedDataParallel
from .parallel.flat import FlatLayout
from .parallel.zero import ZeroDataParallel

FORMAT = 1
MANIFEST = "manifest.json"
_before_commit = None  # test hook: called on every rank after the shards are written, before the manifest


def _wrapped(model) -> nn.Module:
    return model.module if isinstance(model, (DistributedDataParallel, ZeroDataParallel)) else model


def _group(model):
    if isinstance(model, (DistributedDataParallel, ZeroDataParallel)):
        return model.group
    return dist.group.WORLD if dist.is_initialized() else None


def _entries(model):
    """(layout, values, optimizer parameter, sharded) per flat group of `model`. values is a 1-D
    view of this rank's weights (its master shard, or a whole replicated parameter)."""
    if isinstance(model, ZeroDataParallel):
        return [(g.layout, g.master.detach(), g.master, True) for g in model.groups]
    return [(FlatLayout([(n, p)], 1, 0), p.detach().view(-1), p, False)
            for n, p in _wrapped(model).named_parameters()]


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
    Returns the published directory. A crash at any point leaves the previous checkpoint loadable."""
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"checkpoint.save: step must be a non-negative int, got {step!r}")
    group = _group(model)
    rank = dist.get_rank(group) if group is not None else 0
    world = dist.get_world_size(group) if group is not None else 1
    root = Path(path)
    final, tmp = root / f"step-{step:08d}", root / f".tmp-step-{step:08d}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # left by an interrupted save of the same step
        tmp.mkdir()
    _barrier(group)

    tensors, groups = {}, []
    for i, (layout, values, opt_param, sharded) in enumerate(_entries(model)):
        groups.append({"layout": layout.describe(), "sharded": sharded})
        if not sharded and rank != 0:
            continue
        tensors[f"{i}.values"] = values.clone()
        state = optimizer.state.get(opt_param, {}) if optimizer is not None else {}
        for key, v in state.items():
            flat = isinstance(v, torch.Tensor) and v.numel() == opt_param.numel() and v.dim() > 0
            tensors[f"{i}.state.{key}"] = v.detach().reshape(-1).clone() if flat else v
    if rank == 0:
        tensors["buffers"] = {n: b.detach().clone() for n, b in _wrapped(model).named_buffers()}
        tensors["extra"] = extra
        if optimizer is not None:
            tensors["param_groups"] = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    _fsync_write(tmp / f"rank{rank:05d}.pt", lambda f: torch.save(tensors, f))
    _barrier(group)  # every shard is on disk before the manifest says the checkpoint exists

    if _before_commit is not None:
        _before_commit()
    if rank == 0:
        manifest = {"format": FORMAT, "step": step, "world": world, "groups": groups,
                    "files": [f"rank{r:05d}.pt" for r in range(world)]}
        _fsync_write(tmp / (MANIFEST + ".tmp"), lambda f: f.write(json.dumps(manifest, indent=1).encode()))
        os.replace(tmp / (MANIFEST + ".tmp"), tmp / MANIFEST)
        if final.exists():  # saving the same step again: the new one replaces it
            old = root / f".old-step-{step:08d}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, final)
        _fsync_dir(root)
    _barrier(group)
    return final


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


class _Reader:
    """Reads ranges of the old flat groups from the rank files (memory-mapped: only what is used)."""

    def __init__(self, ckpt: Path):
        self.dir = ckpt
        self.manifest = json.loads((ckpt / MANIFEST).read_text())
        if self.manifest.get("format") != FORMAT:
            raise ValueError(f"{ckpt}: checkpoint format {self.manifest.get('format')} is not {FORMAT}")
        self.files = [torch.load(ckpt / f, mmap=True, weights_only=True) for f in self.manifest["files"]]
        self.where = {}  # parameter name -> (group index, offset in the old flat group, shape)
        for i, g in enumerate(self.manifest["groups"]):
            for p in g["layout"]["params"]:
                self.where[p["name"]] = (i, p["offset"], p["shape"])

    def read(self, i: int, key: str, start: int, stop: int) -> torch.Tensor:
        """Elements [start, stop) of old group i's flat `key` ("values" or "state.NAME")."""
        g = self.manifest["groups"][i]
        if not g["sharded"]:
            return self.files[0][f"{i}.{key}"][start:stop]
        s = g["layout"]["shard_numel"]
        pieces = []
        for r in range(start // s, (stop - 1) // s + 1):
            shard = self.files[r][f"{i}.{key}"]
            pieces.append(shard[max(start - r * s, 0): min(stop - r * s, s)])
        return torch.cat(pieces) if len(pieces) != 1 else pieces[0]

    def state_keys(self, i: int):
        """(flat keys, other entries) of old group i's optimizer state; scalar entries (Adam's step)
        are the same on every rank, so rank 0's file is enough."""
        g = self.manifest["groups"][i]
        n = g["layout"]["shard_numel"] if g["sharded"] else g["layout"]["numel"]
        prefix = f"{i}.state."
        flat, other = [], {}
        for k, v in self.files[0].items():
            if k.startswith(prefix):
                name = k[len(prefix):]
                if isinstance(v, torch.Tensor) and v.dim() == 1 and v.numel() == n:
                    flat.append(name)
                else:
                    other[name] = v
        return flat, other

    def fill(self, layout: FlatLayout, start: int, count: int, key: str, out: torch.Tensor):
        """Writes elements [start, start + count) of the new flat group `layout` (key of each old
        group holding its parameters) into out; padding stays as it is."""
        for slot in layout.slots:
            a, b = max(start, slot.offset), min(start + count, slot.offset + slot.numel)
            if a >= b:
                continue
            if slot.name not in self.where:
                raise KeyError(f"{self.dir}: the checkpoint has no parameter {slot.name!r}")
            i, offset, shape = self.where[slot.name]
            if list(shape) != list(slot.shape):
                raise ValueError(f"{self.dir}: parameter {slot.name!r} has shape {shape} in the checkpoint "
                                 f"but {list(slot.shape)} in the model")
            out[a - start: b - start].copy_(self.read(i, key, offset + a - slot.offset, offset + b - slot.offset))


def load(path, model, optimizer=None) -> dict:
    """Restores the latest complete checkpoint under `path` (or the checkpoint `path`) into `model`
    (plain, DDP or ZeRO, any world size and stage) and `optimizer` (built on model.parameters(), with
    as many param groups as when saved). Every rank of the model's group must call it.
    Returns {"step", "extra", "path"}."""
    ckpt = latest(path)
    reader = _Reader(ckpt)
    for layout, values, opt_param, sharded in _entries(model):
        start, count = (layout.shard_start, layout.shard_numel) if sharded else (0, layout.numel)
        with torch.no_grad():
            buf = torch.zeros(count, dtype=torch.float32)
            reader.fill(layout, start, count, "values", buf)
            values.copy_(buf)
        if optimizer is None or not layout.slots:
            continue
        first = reader.where[layout.slots[0].name][0]
        flat_keys, other = reader.state_keys(first)
        state = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in other.items()}
        for key in flat_keys:
            buf = torch.zeros(count, dtype=torch.float32)
            reader.fill(layout, start, count, f"state.{key}", buf)
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
    rank0 = reader.files[0]
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
    if isinstance(model, ZeroDataParallel):
        model._stale = True  # gather the loaded masters before the next forward
    return {"step": reader.manifest["step"], "extra": rank0.get("extra"), "path": ckpt}


def consolidate(path) -> dict[str, torch.Tensor]:
    """The full state_dict (parameters as float32 from the masters, buffers) of the plain module
    saved in the checkpoint `path` (or the latest under it). Runs in one process, no group needed."""
    reader = _Reader(latest(path))
    out = {}
    for name, (i, offset, shape) in reader.where.items():
        n = 1
        for d in shape:
            n *= d
        out[name] = reader.read(i, "values", offset, offset + n).clone().view(shape)
    for name, b in reader.files[0]["buffers"].items():
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


if __name__ == "__main__":
    raise SystemExit(main())
