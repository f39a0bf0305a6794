"""No line of the README or of the code under csrc/ and python/ carries a date: a comment says what and
why, and a dated measurement lives in benchmarks/RESULTS.md or docs/status.md with a pointer from the code.
Checked on every line of those files (comments, docstrings and strings alike); a date inside a file name
(benchmarks/results/h100-2026-11-22/) is a pointer, not a date, and a paper's year is not one."""
from __future__ import annotations

import fnmatch
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
CODE_SUFFIXES = (".py", ".h", ".cpp", ".cu", ".cuh", ".inc")

PENDING: set[str] = set()
"""Pending allowance: globs of files not checked yet (to be emptied)."""

_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?"
          r"|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
DATE = re.compile(
    r"(?<![-_/\w])20\d\d-[01]\d(?:-[0-3]\d)?(?![\w/])"                          # 2026-11-28, 2026-11
    r"|\b" + _MONTH + r"\.? (?:[0-3]?\d(?:st|nd|rd|th)?,? )?20\d\d\b"              # Nov 2026, Nov 28, 2026
    r"|\b[0-3]?\d " + _MONTH + r"\.? 20\d\d\b"                                     # 28 Nov 2026
    r"|\b(?:on|of|since|until|till|before|after|from|by) [01]\d-[0-3]\d\b")         # on 11-28
"""A calendar date in the forms the house has written them."""


def checked_files(root: pathlib.Path = ROOT) -> list[str]:
    """README.md and the tracked code files under csrc/ and python/, less the pending ones."""
    try:
        files = subprocess.run(["git", "ls-files", "README.md", "csrc", "python"], cwd=root, check=True,
                               capture_output=True, text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        files = [str(p.relative_to(root)) for d in ("csrc", "python") for p in (root / d).rglob("*")] + ["README.md"]
    return sorted(f for f in files if (f == "README.md" or f.endswith(CODE_SUFFIXES))
            and not any(fnmatch.fnmatch(f, glob) for glob in PENDING) and (root / f).is_file())


def dated_lines(root: pathlib.Path = ROOT) -> list[str]:
    found = []
    for f in checked_files(root):
        for number, line in enumerate((root / f).read_text(errors="replace").splitlines(), 1):
            if DATE.search(line):
                found.append(f"{f}:{number}: {line.strip()}")
    return found


def test_no_line_carries_a_date():
    found = dated_lines()
    assert not found, ("say what and why, and move the dated measurement to benchmarks/RESULTS.md or "
                       "docs/status.md with a pointer:\n" + "\n".join(found))


def test_the_date_check_can_fail(tmp_path):
    dated = ["// measured on 2026-11-28", "# 1.2 ms (Nov 2026)", "x = 1  # since 28 November 2026",
             "timed on 11-28 by hand", "Dec. 3, 2026: faster", "the 2026-12 runs"]
    fine = ["see benchmarks/results/h100-2026-11-22/", "bench-floor-2026-11-27.txt", "Korthikanti et al. 2022",
            "issue 47 item 2", "12-15 us per call", "a 2026-byte buffer", "seed 20261128"]
    assert [line for line in dated if not DATE.search(line)] == []
    assert [line for line in fine if DATE.search(line)] == []
    (tmp_path / "csrc" / "core").mkdir(parents=True)
    (tmp_path / "python" / "ringzero").mkdir(parents=True)  # a copy of the tree's layout, with planted dates
    (tmp_path / "README.md").write_text("ringzero\nnumbers of Nov 2026\n")
    (tmp_path / "python" / "ringzero" / "__init__.py").write_text("X = 1  # timed on 2026-11-28\n")
    planted = pathlib.PurePosixPath("csrc", "core", "b.cpp")  # a file of the copy, not of the repository
    (tmp_path / planted).write_text("// fine\n// measured 2026-11-28\n")
    assert dated_lines(tmp_path) == ["README.md:2: numbers of Nov 2026", f"{planted}:2: // measured 2026-11-28",
                                     "python/ringzero/__init__.py:1: X = 1  # timed on 2026-11-28"]


def test_pending_files_still_exist():
    """A glob of PENDING that matches nothing is stale: remove it."""
    tracked = subprocess.run(["git", "ls-files", "csrc", "python"], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    assert [g for g in PENDING if not any(fnmatch.fnmatch(f, g) for f in tracked)] == []
