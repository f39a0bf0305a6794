"""The CPU selector is the one place in csrc/core that chooses by size: no other file of layer 1 compares a
byte count against a threshold constant (a named `k...Bytes`/`k...Calls` constant or a literal size such as
`64 << 10`) or reads the selector's table (`kCpuThresholds`). Reference: the rule in docs/design.md ("One
selector per device") and csrc/core/select.h's Note. The selector's own plans against today's are pinned in
tests/cpp/test_select.cpp; this file checks the structure only, and that the check can fail.
"""
from __future__ import annotations

import pathlib
import re

from ringzero import _C

CORE = pathlib.Path(__file__).resolve().parents[2] / "csrc" / "core"
SELECTOR = {"select.h", "select.cpp"}
# Constants compared only to check arguments (a violation raises), never to choose a path.
ARGUMENT_CHECKS = {"kChunkAlignBytes"}

_THRESHOLD = r"(?:k[A-Z]\w*(?:Bytes|Calls)\b|\d+\s*<<\s*\d+|kCpuThresholds\b)"
_COMPARISON = re.compile(rf"(?:[<>]=?(?![<>=])\s*\(?\s*{_THRESHOLD})|(?:{_THRESHOLD}\s*\)?\s*(?<![<>])[<>]=?(?![<>=]))")
_TABLE = re.compile(r"\bkCpuThresholds\b")


def _code(text: str) -> list[tuple[int, str]]:
    """(line number, code) with // comments and string literals blanked; static_asserts skipped (they check
    layouts, they choose nothing)."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        line = re.sub(r'"(?:\\.|[^"\\])*"', '""', line).split("//", 1)[0]
        for name in ARGUMENT_CHECKS:
            line = re.sub(rf"\b{name}\b", "_", line)
        if "static_assert" not in line and line.strip():
            out.append((number, line))
    return out


def size_choices(path: pathlib.Path) -> list[str]:
    """Lines of `path` that compare against a threshold constant or read the selector's table."""
    return [f"{path.name}:{n}: {line.strip()}" for n, line in _code(path.read_text())
            if _COMPARISON.search(line) or _TABLE.search(line)]


def test_only_the_selector_compares_sizes_against_thresholds_in_core():
    files = sorted(p for p in CORE.iterdir() if p.suffix in {".h", ".cpp", ".inc"} and p.name not in SELECTOR)
    found = [hit for p in files for hit in size_choices(p)]
    assert not found, "choose in csrc/core/select.* (kCpuThresholds), not here:\n" + "\n".join(found)


def test_the_size_check_finds_a_threshold_outside_the_selector(tmp_path):
    sample = tmp_path / "algo.cpp"
    sample.write_text("constexpr size_t kBigBytes = 1 << 20;\n"
                      "bool a(size_t b) { return b >= kBigBytes; }\n"        # a named constant
                      "bool c(size_t b) { return (64 << 10) < b; }\n"       # a literal size
                      "size_t d() { return kCpuThresholds.one_shot_max_bytes; }\n"  # the table
                      "size_t e(size_t b) { return b << 10; }  // b >= kBigBytes in a comment\n"
                      "static_assert(sizeof(int) <= kBigBytes, \"layout\");\n")
    assert [h.split(":")[1] for h in size_choices(sample)] == ["2", "3", "4"]


def test_the_extension_exports_the_cpu_algorithms_and_thresholds():
    names = _C.cpu_all_reduce_algorithms()
    assert names and "auto" not in names
    assert set(names) == set(_C.ALL_REDUCE_ALGOS) - {"auto"}
    assert _C.CPU_THRESHOLDS["one_shot_max_bytes"] > 0
    # The CUDA path reads a CPU choice by name: the shared names map to themselves, others to auto.
    for name, value in _C.ALL_REDUCE_ALGOS.items():
        assert _C.cuda_algo_of(value) == (value if name in ("auto", "oneshot", "twoshot", "ring") else 0)
