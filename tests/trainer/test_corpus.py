"""The training corpus (ringzero.data.stdlib_corpus): the files it reads are exactly those of the plain
reference, `root.rglob("*.py")` less every path through site-packages or dist-packages, in the same order,
though the walk no longer enters the installed packages; and the same call gives the same bytes."""
import sysconfig
from pathlib import Path

import torch

from ringzero import data


def test_the_corpus_reads_the_files_rglob_finds_outside_the_installed_packages():
    root = Path(sysconfig.get_paths()["stdlib"])
    want = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "dist-packages" not in p.parts)
    got = sorted(data._stdlib_sources(root))
    assert len(want) > 100, f"{len(want)} standard library sources under {root}"
    assert got == want


def test_the_corpus_is_the_same_every_time():
    train, val = data.stdlib_corpus()
    data.stdlib_corpus.cache_clear()
    train2, val2 = data.stdlib_corpus()
    assert train.numel() > 0 and val.numel() > 0
    assert torch.equal(train, train2) and torch.equal(val, val2)
