"""Reading a saved checkpoint (ringzero.checkpoint): the manifest, the rank files memory-mapped, and the
ranges of the old flat groups a new model's groups need, across world sizes, tensor-parallel and
expert-parallel degrees."""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ..parallel.data_parallel.flat import FlatLayout
from ..parallel.expert.expert_state import ExpertRange, check_expert_count, join_rows
from ..parallel.tensor_parallel.tensor_state import join_parts, part_of, shard_of, unshard

FORMAT = 1

# [Note: tensor-parallel checkpoints]
# A model holding parallel.tensor_parallel layers is saved by every rank of the world, tensor rank t writing
# tp{t:03d}-rank{r:05d}.pt for its data-parallel rank r. Every tensor rank's flat groups have the same
# layout (equal shards), so the manifest lists each group once per tensor rank with "tp_rank", the files
# holding its shards ("files", in data-parallel order) and the key of its tensors in them ("key").
# Replicated parameters outside ZeRO groups are written by tensor rank 0 only. "tensor_parallel" maps
# each split parameter to [dim, chunks] (tensor_state.shard_specs). A checkpoint without it reads as
# tp = 1, so old checkpoints load as before, and a tensor-parallel one loads into a plain model whole.
MANIFEST = "manifest.json"

class CheckpointReader:
    """Reads ranges of the old flat groups from the rank files (memory-mapped: only what is used)."""

    def __init__(self, ckpt: Path):
        self.dir = ckpt
        try:
            self.manifest = json.loads((ckpt / MANIFEST).read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{ckpt / MANIFEST}: corrupt checkpoint manifest ({e}); load an earlier step-* "
                             "directory or save again") from None
        if not isinstance(self.manifest, dict) or self.manifest.get("format") != FORMAT:
            got = self.manifest.get("format") if isinstance(self.manifest, dict) else type(self.manifest).__name__
            raise ValueError(f"{ckpt}: checkpoint manifest format {got} is not {FORMAT}")
        self.files = {f: torch.load(ckpt / f, mmap=True, weights_only=True) for f in self.manifest["files"]}
        self.first = self.files[self.manifest["files"][0]]  # buffers, optimizer hyperparameters, extra
        tensor_parallel = self.manifest.get("tensor_parallel", {"tp": 1, "shards": {}})
        self.tp, self.specs = tensor_parallel["tp"], {n: tuple(v) for n, v in tensor_parallel["shards"].items()}
        self.where = {}  # (parameter name, tensor rank) -> (group index, offset in the old flat group, shape)
        self.experts = {}  # expert parameter name -> [(ExpertRange, group index)] in expert order
        self.names = {}  # every parameter name, in the saved order (a dict as an ordered set)
        for i, g in enumerate(self.manifest["groups"]):
            for p in g["layout"]["params"]:
                self.names[p["name"]] = None
                if "experts" in g:  # [Note: expert-parallel checkpoints]
                    self.experts.setdefault(p["name"], []).append((ExpertRange(**g["experts"]), i))
                else:
                    self.where.setdefault((p["name"], g.get("tp_rank", 0)), (i, p["offset"], p["shape"]))
        # [Note: fused parameters in checkpoints] parallelize fuses a transformers layer's q, k, v (and gate,
        # up) into one parameter and renames the output projections; "fused" maps each such name to the
        # unfused model's names for it (tensor_state.fused_sources). A name this checkpoint lacks is made
        # from what it has: a part is cut out of the saved fused parameter, and a fused parameter of the
        # loading model (its own map, `target`) is joined from the saved parts. So a tp checkpoint loads
        # into ddp or ZeRO and the other way round; optimizer states follow the same cut, element by element.
        self.fused = self.manifest.get("fused", {})
        self.part = {p: (name, i) for name, e in self.fused.items() for i, p in enumerate(e["parts"])}

    def _group_files(self, i: int) -> tuple[list, int]:
        """(the files holding old group i's shards in data-parallel order, its key in them)."""
        g = self.manifest["groups"][i]
        return [self.files[f] for f in g.get("files", self.manifest["files"])], g.get("key", i)

    def locate(self, name: str, tp_rank: int = 0) -> tuple[int, int, list]:
        """(old group, offset, shape) of `name` as tensor rank tp_rank saved it."""
        if (name, tp_rank) not in self.where:
            raise KeyError(f"{self.dir}: the checkpoint has no parameter {name!r}")
        return self.where[name, tp_rank]

    def read(self, i: int, key: str, start: int, stop: int) -> torch.Tensor:
        """Elements [start, stop) of old group i's flat `key` ("values" or "state.NAME")."""
        g = self.manifest["groups"][i]
        files, k = self._group_files(i)
        if not g["sharded"]:
            return files[0][f"{k}.{key}"][start:stop]
        s = g["layout"]["shard_numel"]
        pieces = []
        for r in range(start // s, (stop - 1) // s + 1):
            shard = files[r][f"{k}.{key}"]
            pieces.append(shard[max(start - r * s, 0): min(stop - r * s, s)])
        return torch.cat(pieces) if len(pieces) != 1 else pieces[0]

    def _saved(self, name: str, key: str, tp_rank: int) -> torch.Tensor:
        i, offset, shape = self.locate(name, tp_rank)
        return self.read(i, key, offset, offset + math.prod(shape)).view(shape)

    def saved(self, name: str) -> bool:
        """Whether the checkpoint holds `name` under that name."""
        return (name, 0) in self.where or name in self.experts

    def group_of(self, name: str) -> int:
        """An old group holding (part of) `name`: its optimizer state keys are those of every part."""
        return self.experts[name][0][1] if name in self.experts else self.locate(name)[0]

    def check_experts(self, shapes: dict, experts: dict):
        """Before any weight is read: ValueError naming both counts where an expert parameter of the model
        (experts: its expert_ranges; shapes: every parameter's whole or sliced shape) or of the checkpoint has
        a number of experts the other cannot give ([Note: expert-parallel checkpoints])."""
        for name in [*experts, *(n for n in self.experts if n in shapes and n not in experts)]:
            whole = ExpertRange(0, shapes[name][0], shapes[name][0])  # a plain model holds every expert
            if name in self.experts or self.saved(name):
                saved = self.experts[name][0][0].total if name in self.experts else self.locate(name)[2][0]
                check_expert_count(name, saved, experts.get(name, whole), self.dir)

    def expert_rows(self, name: str, key: str, want: ExpertRange) -> torch.Tensor:
        """The experts `want` of the stacked expert parameter `name` (rows of its whole [E, ...] tensor), from
        the saved slices, or from the whole tensor a plain model saved (check_experts has checked E)."""
        if name in self.experts:
            saved = [(r, lambda i=i: self._slice(i, key)) for r, i in self.experts[name]]
        else:
            whole = self.full(name, key)
            saved = [(ExpertRange(0, whole.shape[0], whole.shape[0]), lambda: whole)]
        return join_rows(saved, want)

    def _slice(self, i: int, key: str) -> torch.Tensor:
        shape = self.manifest["groups"][i]["layout"]["params"][0]["shape"]
        return self.read(i, key, 0, math.prod(shape)).view(shape)

    def saved_name(self, name: str, fused: dict | None = None) -> str:
        """A name the checkpoint holds that `name` is read from ([Note: fused parameters in checkpoints])."""
        if not self.saved(name) and name in self.part:
            return self.part[name][0]
        if not self.saved(name) and fused and name in fused:
            return fused[name]["parts"][0]
        return name

    def full(self, name: str, key: str = "values", fused: dict | None = None) -> torch.Tensor:
        """The whole parameter `name` of the unsplit model (its shards joined when tensor-parallel; made
        from fused or unfused parameters when the checkpoint has the other form, `fused` being the loading
        model's map: [Note: fused parameters in checkpoints])."""
        if not self.saved(name) and name in self.part:
            whole, i = self.part[name]
            e = self.fused[whole]
            return part_of(self.full(whole, key), e["sizes"], i, e["transposed"])
        if not self.saved(name) and fused and name in fused:
            e = fused[name]
            return join_parts([self.full(p, key) for p in e["parts"]], e["transposed"])
        if name in self.experts:
            total = self.experts[name][0][0].total
            return self.expert_rows(name, key, ExpertRange(0, total, total))
        if name not in self.specs:
            return self._saved(name, key, 0)
        dim, chunks = self.specs[name]
        return unshard([self._saved(name, key, t) for t in range(self.tp)], dim, chunks)

    def state_keys(self, i: int):
        """(flat keys, other entries) of old group i's optimizer state; scalar entries (Adam's step)
        are the same on every rank, so the first file is enough."""
        g = self.manifest["groups"][i]
        n = g["layout"]["shard_numel"] if g["sharded"] else g["layout"]["numel"]
        files, k = self._group_files(i)
        prefix = f"{k}.state."
        flat, other = [], {}
        for key, v in files[0].items():
            if key.startswith(prefix):
                name = key[len(prefix):]
                if isinstance(v, torch.Tensor) and v.dim() == 1 and v.numel() == n:
                    flat.append(name)
                else:
                    other[name] = v
        return flat, other

    def fill(self, layout: FlatLayout, start: int, count: int, key: str, out: torch.Tensor,
             target=(1, 0, {}, {}, {})):
        """Writes elements [start, start + count) of the new flat group `layout` (key of each old
        group holding its parameters) into out; padding stays as it is. target: (tp, tensor rank,
        shard_specs, fused_sources, expert_ranges) of the new model; a parameter split in the checkpoint or
        in the new model is joined and cut again ([Note: tensor-parallel checkpoints]), one fused in one of
        them and not in the other is made from the other's ([Note: fused parameters in checkpoints]), an
        expert parameter is cut to the new model's experts ([Note: expert-parallel checkpoints])."""
        tp, tp_rank, specs, fused, experts = target
        for slot in layout.slots:
            a, b = max(start, slot.offset), min(start + count, slot.offset + slot.numel)
            if a >= b:
                continue
            renamed = not self.saved(slot.name) and (slot.name in self.part or slot.name in fused)
            if slot.name in self.experts or slot.name in experts:
                whole = ExpertRange(0, slot.shape[0], slot.shape[0])  # a plain model holds every expert
                piece = self.expert_rows(slot.name, key, experts.get(slot.name, whole))
                shape, flat = list(piece.shape), piece.reshape(-1)[a - slot.offset: b - slot.offset]
            elif slot.name in self.specs or slot.name in specs or renamed:
                piece = self.full(slot.name, key, fused)
                if slot.name in specs:
                    piece = shard_of(piece, *specs[slot.name], tp, tp_rank)
                shape, flat = list(piece.shape), piece.reshape(-1)[a - slot.offset: b - slot.offset]
            else:
                i, offset, shape = self.locate(slot.name)
                flat = None
            if list(shape) != list(slot.shape):
                raise ValueError(f"{self.dir}: parameter {slot.name!r} has shape {shape} in the checkpoint "
                                 f"but {list(slot.shape)} in the model")
            if flat is None:
                flat = self.read(i, key, offset + a - slot.offset, offset + b - slot.offset)
            out[a - start: b - start].copy_(flat)
