"""Every global name a Python file of the repo reads is defined in that file (assigned, imported, a def or
class) or is a builtin. A script run only on a GPU (benchmarks/bench_cuda.py) once lost two of its
functions in an edit and nothing on a CPU machine noticed until the device run died with a NameError;
this check reads the source, so it needs no GPU and runs nothing. Reference: Python's own symbol tables
(symtable), which resolve scopes as the compiler does."""
from __future__ import annotations

import builtins
import pathlib
import symtable

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FILES = sorted(p for d in ("python", "benchmarks", "tools", "tests", "examples") if (ROOT / d).is_dir()
               for p in (ROOT / d).rglob("*.py") if "build" not in p.parts)
MODULE_NAMES = {"__file__", "__name__", "__doc__", "__spec__", "__loader__", "__package__", "__path__",
                "__builtins__", "__annotations__", "__dict__"}


def undefined_globals(source: str, filename: str) -> set[str]:
    """The global names that `source` reads but never binds at module level and that are not builtins."""
    top = symtable.symtable(source, filename, "exec")
    if any(s.get_name() == "*" for s in top.get_symbols()):  # a star import binds names we cannot see
        return set()
    bound = {s.get_name() for s in top.get_symbols()
             if s.is_assigned() or s.is_imported() or s.is_namespace()}
    known = bound | set(dir(builtins)) | MODULE_NAMES
    read: set[str] = set()

    def walk(table: symtable.SymbolTable, is_top: bool) -> None:
        for s in table.get_symbols():
            if not s.is_referenced():
                continue
            if is_top and not (s.is_assigned() or s.is_imported()):
                read.add(s.get_name())
            elif not is_top and s.is_global():
                read.add(s.get_name())
        for child in table.get_children():
            walk(child, False)

    walk(top, True)
    return read - known


def test_the_check_finds_a_lost_function():
    src = "def main():\n    helper(1)\n\ndef other():\n    return len([])\n"
    assert undefined_globals(src, "x.py") == {"helper"}
    assert undefined_globals(src + "def helper(x):\n    return x\n", "x.py") == set()
    assert undefined_globals("class A:\n    def f(self):\n        return B\n", "x.py") == {"B"}
    assert undefined_globals("import os\nprint(os.sep, __file__)\n", "x.py") == set()


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_global_name_read_is_defined(path):
    missing = undefined_globals(path.read_text(), str(path))
    assert not missing, f"{path.relative_to(ROOT)} reads global names it never defines: {sorted(missing)}"
