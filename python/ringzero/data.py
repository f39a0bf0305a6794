"""The training corpus every machine has offline: the .py files of Python's own standard library,
as bytes, split into train and validation by file (a stable hash of the path), and a deterministic
batch sampler so that every strategy and every rank sees the same data for the same (seed, step).
"""
from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
from pathlib import Path

import torch


@functools.lru_cache(maxsize=4)
def stdlib_corpus(max_bytes: int = 12 << 20, val_every: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation) uint8 tensors of the standard library's .py sources, files sorted by path;
    a file goes to validation when the hash of its relative path is 0 modulo `val_every`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(_stdlib_sources(root))
    if not files:
        raise RuntimeError(f"no .py files found under the standard library at {root}")
    train, val, total = [], [], 0
    for path in files:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        rel = str(path.relative_to(root)).encode()
        bucket = int.from_bytes(hashlib.sha1(rel).digest()[:4], "little") % val_every
        (val if bucket == 0 else train).append(data)
        total += len(data)
        if total >= max_bytes:
            break
    as_tensor = lambda parts: torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8)  # noqa: E731
    return as_tensor(train), as_tensor(val)


def _stdlib_sources(root: Path):
    """The .py files under `root`, not descending into site-packages or dist-packages (root.rglob walked them
    too, 26k paths of installed packages, to drop them after: 1.3-2.3 s of every rank of every run), nor into
    directory symlinks (as rglob). Sorted by the caller as Path objects, so the order is rglob's."""
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ("site-packages", "dist-packages")]
        base = Path(folder)
        for name in names:
            if name.endswith(".py"):
                yield base / name


def batch(data: torch.Tensor, batch_size: int, seq_len: int, seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch for `step`: inputs and next-byte targets, both (batch_size, seq_len) int64.
    The same (seed, step) gives the same batch on every rank and in every run."""
    if data.numel() <= seq_len + 1:
        raise ValueError(f"corpus of {data.numel()} bytes is too short for seq_len={seq_len}")
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, data.numel() - seq_len - 1, (batch_size,), generator=g)
    idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]
    window = data[idx].long()
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()


def corpus_info() -> str:
    train, val = stdlib_corpus()
    return (f"Python {sysconfig.get_python_version()} standard library sources: {train.numel() / 2**20:.1f} MiB train, "
            f"{val.numel() / 2**20:.1f} MiB validation (split by file), {os.path.basename(sysconfig.get_paths()['stdlib'])}")
