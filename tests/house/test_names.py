"""Every global name a Python file of the repo reads is defined in that file (assigned, imported, a def or
class) or is a builtin. A script run only on a GPU (benchmarks/bench_cuda.py) once lost two of its
functions in an edit and nothing on a CPU machine noticed until the device run died with a NameError;
this check reads the source, so it needs no GPU and runs nothing. Reference: Python's own symbol tables
(symtable), which resolve scopes as the compiler does. Likewise every name imported from a ringzero module
exists in it (the module imported: no process, no GPU)."""
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


def ringzero_imports(path: pathlib.Path):
    """(line, module, name) for each `from <ringzero module> import name` in `path`, at any depth, relative
    imports inside python/ringzero resolved to their absolute module."""
    import ast

    tree = ast.parse(path.read_text(), str(path))
    package = None
    if path.is_relative_to(ROOT / "python"):
        package = list(path.relative_to(ROOT / "python").with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            if package is None:
                continue
            base = package[:len(package) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        if module == "ringzero" or module.startswith("ringzero."):
            for alias in node.names:
                if alias.name != "*":
                    yield node.lineno, module, alias.name


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_imported_from_ringzero_exists(path):
    """`from ringzero.cli.launch import run_as_user_script` in a benchmark, with the function gone: a NameError
    only when the benchmark runs (an edit of launch.py once dropped it and CI, which runs no benchmark, passed).
    Reference: the modules themselves, imported (a name or a submodule of that name)."""
    import importlib
    import importlib.util

    missing = []
    for line, module, name in ringzero_imports(path):
        mod = importlib.import_module(module)
        if not hasattr(mod, name) and importlib.util.find_spec(f"{module}.{name}") is None:
            missing.append(f"line {line}: {name} from {module}")
    assert not missing, missing
