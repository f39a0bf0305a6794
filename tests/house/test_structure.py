"""The shape of layer 5 (python/ringzero/comm): every submodule imports alone in a fresh interpreter, the
modules import each other without cycles (communicator.py and cuda.py in particular), and the enums that
cross into C++ come from ringzero._C rather than from integers kept in step by hand. Reference: the C++
tables exported by _C (csrc/core/types.h through csrc/torch/enum_bindings.cpp) and the source text."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

from ringzero import _C
from ringzero.comm import types

COMM = pathlib.Path(types.__file__).resolve().parent
MODULES = sorted(p.stem for p in COMM.glob("*.py") if p.stem != "__init__")


def comm_imports(module: str) -> set[str]:
    """The ringzero.comm modules that `module` imports at its top level (imports inside functions
    run later and cannot form an import-time cycle)."""
    tree = ast.parse((COMM / f"{module}.py").read_text())
    found = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(a.name for a in node.names)
    return found & set(MODULES)


IMPORT_EACH = """
import os, sys, traceback
import torch  # preloaded once: the check is ringzero's own import order, and torch's import is 2-3 s of CPU
early = [m for m in sys.modules if m == "ringzero" or m.startswith("ringzero.")]
assert not early, f"import torch loaded {early}: the children would not import ringzero alone"
failed = {}
for m in sys.argv[1:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            __import__(f"ringzero.comm.{m}")
            code = 0
        except BaseException:
            os.write(w, traceback.format_exc()[-2000:].encode())
            code = 1
        os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        err = f.read()
    if os.waitpid(pid, 0)[1] != 0:
        failed[m] = err or "exited without a traceback"
print(repr(failed))
sys.exit(1 if failed else 0)
"""


def test_each_submodule_imports_alone_in_a_fresh_interpreter():
    """Each module imported first in a child forked from an interpreter that has imported torch and nothing of
    ringzero (one interpreter per module took 40 s of CPU on the 2-core machine, nearly all torch's import)."""
    done = subprocess.run([sys.executable, "-c", IMPORT_EACH, "__init__", *MODULES], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert done.stdout.strip() == "{}", done.stdout


def test_no_import_cycle_in_comm():
    graph = {m: comm_imports(m) for m in MODULES}
    assert "communicator" not in graph["cuda"], "comm/cuda.py must not import comm/communicator.py"
    state: dict[str, str] = {}

    def visit(m, path):
        if state.get(m) == "done":
            return
        assert state.get(m) != "open", f"import cycle: {' -> '.join(path + [m])}"
        state[m] = "open"
        for dep in sorted(graph[m]):
            visit(dep, path + [m])
        state[m] = "done"

    for m in MODULES:
        visit(m, [])


@pytest.mark.parametrize("enum_name, table", [
    ("ReduceOp", "REDUCE_OPS"), ("AllReduceAlgo", "ALL_REDUCE_ALGOS"), ("CollectiveKind", "COLLECTIVE_KINDS"),
])
def test_python_enums_are_the_cpp_tables(enum_name, table):
    cls = getattr(types, enum_name)
    assert {m.name: int(m) for m in cls} == {k.upper(): v for k, v in getattr(_C, table).items()}


def test_supported_dtypes_follow_the_cpp_dtype_values():
    assert [str(d).replace("torch.", "") for d in types.SUPPORTED_DTYPES] == list(_C.DTYPES)
    assert list(_C.DTYPES.values()) == list(range(len(_C.DTYPES)))


def hand_kept_tables(path: pathlib.Path) -> list[str]:
    """Integer tables in a Python source: dicts of 2+ int literals, `A, B = 0, 1`, enum classes whose
    members are int literals."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Dict):
            ints = [v for v in node.values if isinstance(v, ast.Constant) and type(v.value) is int]
            if len(ints) >= 2 and len(ints) == len(node.values):
                found.append(f"{path.name}:{node.lineno} dict of ints")
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
            elts = node.value.elts
            if len(elts) >= 2 and all(isinstance(e, ast.Constant) and type(e.value) is int for e in elts) and \
                    any(isinstance(t, ast.Tuple) for t in node.targets):
                found.append(f"{path.name}:{node.lineno} names assigned int literals")
        elif isinstance(node, ast.ClassDef) and any("Enum" in ast.unparse(b) for b in node.bases):
            if any(isinstance(s, ast.Assign) and isinstance(s.value, ast.Constant) and type(s.value.value) is int
                   for s in node.body):
                found.append(f"{path.name}:{node.lineno} enum class {node.name} with int members")
    return found


def test_no_hand_kept_integer_table_in_comm():
    found = [f for p in sorted(COMM.glob("*.py")) for f in hand_kept_tables(p)]
    assert not found, found


def test_the_table_detector_finds_one(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import enum\nA = {'x': 0, 'y': 1}\nB, C = 0, 1\nclass E(enum.IntEnum):\n    X = 0\n")
    assert len(hand_kept_tables(sample)) == 3


def test_tests_share_helpers_through_helper_modules_not_test_files():
    """No file under tests/ imports another test file (anywhere, also inside functions): shared inputs and
    references live in helper modules (tests/helpers: reference.py, adam_cases.py, ...)."""
    tests = pathlib.Path(__file__).resolve().parents[1]
    offenders = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            offenders += [f"{path.name} imports {n}" for n in names if n.split(".")[0].startswith("test_")]
    assert not offenders, offenders


TRANSPORT_CLASSES = {"Solo", "SharedMemory", "NetworkRing", "Hierarchical", "CudaPeers", "CudaRing", "CudaHierarchical"}
TRANSPORT_MAKERS = {("transports.py", "pick_transport"), ("cuda.py", "cuda_transport")}


def layout_decisions(sources: dict[str, str]) -> dict:
    """Where a transport is made, where a topology's single_host/hierarchical is read, and which functions
    call layout(): {"made": {(file, function)}, "read": {(file, function)}, "layout": {(file, function)}}."""
    found = {"made": set(), "read": set(), "layout": set()}
    for name, text in sources.items():
        def visit(node, fn):
            for child in ast.iter_child_nodes(node):
                here = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else fn
                if isinstance(child, ast.Call):
                    callee = child.func.id if isinstance(child.func, ast.Name) else \
                        child.func.attr if isinstance(child.func, ast.Attribute) else ""
                    if callee in TRANSPORT_CLASSES:
                        found["made"].add((name, fn))
                    if callee == "layout":
                        found["layout"].add((name, fn))
                if isinstance(child, ast.Attribute) and child.attr in ("single_host", "hierarchical") and \
                        isinstance(child.ctx, ast.Load):
                    found["read"].add((name, fn))
                visit(child, here)
        visit(ast.parse(text), "<module>")
    return found


def test_one_place_decides_how_collectives_travel_for_every_door():
    """[Note: one engine behind every door] (docs/design.md): transports.layout() is the one decision of how
    a group's collectives travel. Only transports.pick_transport (CPU: the Communicator behind ringzero.*
    and patch(), and the swap-in backend's engine across hosts) and cuda.cuda_transport (CUDA: the
    Communicator's CUDA path and the backend's CUDA lane across hosts) make transports, both from layout();
    the backend's creator and its CUDA setup tell the C++ side
    spans_hosts from layout() too; nothing but layout() reads a topology's single_host or hierarchical
    (topology.py computes them); and the C++ backend no longer compares host ids to decide for itself."""
    sources = {p.name: p.read_text() for p in sorted(COMM.glob("*.py"))}
    found = layout_decisions(sources)
    assert found["made"] == TRANSPORT_MAKERS, found["made"]
    # (cuda.py's cuda_transport takes the layout its callers read)
    assert {("transports.py", "pick_transport"), ("backend.py", "_create_backend"), ("backend.py", "__call__"),
            ("communicator.py", "__init__"), ("cuda.py", "__init__")} <= found["layout"], found["layout"]
    assert {r for r in found["read"] if r[0] != "topology.py"} == {("transports.py", "layout")}, found["read"]
    backend_cpp = (COMM.parents[2] / "csrc" / "torch" / "backend.cpp").read_text()
    assert "host_id" not in backend_cpp, "the C++ backend decides the layout from host ids again"


def test_the_layout_check_finds_a_second_decision():
    sample = {"x.py": "def pick(topo):\n    if topo.single_host:\n        return SharedMemory(1, 2)\n"}
    found = layout_decisions(sample)
    assert found["made"] == {("x.py", "pick")} and found["read"] == {("x.py", "pick")} and not found["layout"]


# ---- the whole package: no import cycle, parallel/ by form, trainer/ by registry -------------------------

PACKAGE = COMM.parent
EXTENSIONS = {"ringzero._C"}
"""Compiled modules: they import no Python module of ours, so they end every path."""


def package_modules(root: pathlib.Path = PACKAGE) -> dict[str, pathlib.Path]:
    """Dotted name -> file of every Python module under `root` (a package's name is its folder's)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(modules: dict[str, pathlib.Path], top: str = "ringzero") -> dict[str, set[str]]:
    """For each module, the modules of `top` it imports anywhere in its file, inside functions too:
    such an import only postpones a cycle to the first call, and the two modules still cannot be read
    apart. Relative imports are resolved; `from P import n` is an import of P.n where that is a module,
    else of P. An import of a module does not count as one of its parent packages."""
    known = set(modules) | EXTENSIONS
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                for a in node.names:
                    found.add(f"{target}.{a.name}" if f"{target}.{a.name}" in known else target)
        graph[name] = {m for m in found if m in known and m.split(".")[0] == top}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` as a path that ends where it starts, or None."""
    state: dict[str, str] = {}

    def visit(m, path):
        if state.get(m) == "done":
            return None
        if state.get(m) == "open":
            return path[path.index(m):] + [m]
        state[m] = "open"
        for dep in sorted(graph.get(m, ())):
            cycle = visit(dep, path + [m])
            if cycle:
                return cycle
        state[m] = "done"
        return None

    for m in sorted(graph):
        cycle = visit(m, [])
        if cycle:
            return cycle
    return None


def test_no_import_cycle_in_ringzero():
    cycle = find_cycle(import_graph(package_modules()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_finds_one_through_a_function_level_relative_import(tmp_path):
    pkg = tmp_path / "ringzero"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import x\n")
    graph = import_graph(package_modules(pkg))
    assert graph["ringzero.a"] == {"ringzero.sub.b"} and graph["ringzero.sub.b"] == {"ringzero.a"}
    assert find_cycle(graph) == ["ringzero.a", "ringzero.sub.b", "ringzero.a"]


def layer_of(module: str) -> str:
    """The layer of a module of ringzero, as docs/design.md's table names them ("models": the plain-torch
    models folder, beside the layers; "top": the package itself, which re-exports and registers)."""
    parts = module.split(".")
    if module in EXTENSIONS:
        return "4 torch"
    if len(parts) == 1:
        return "top"
    return {"comm": "5 comm", "optim": "6 optim", "ops": "6 optim", "parallel": "7 parallel",
            "models": "models"}.get(parts[1], "8 tools")


LAYER_USES = {"5 comm": {"4 torch"}, "6 optim": {"4 torch"}, "7 parallel": {"4 torch", "5 comm", "6 optim", "models"},
              "models": set()}
"""What each layer of python/ringzero may import besides itself (docs/design.md, "Layers"); layer 8 (the
tools) and the package itself may import anything."""


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, deps in sorted(graph.items()):
        mine = layer_of(module)
        if mine not in LAYER_USES:
            continue
        for dep in sorted(deps):
            theirs = layer_of(dep)
            if theirs != mine and theirs not in LAYER_USES[mine]:
                found.append(f"{module} ({mine}) imports {dep} ({theirs})")
    return found


def test_each_layer_imports_only_what_design_md_allows():
    assert layer_violations(import_graph(package_modules())) == []


def test_the_layer_check_finds_a_violation(tmp_path):
    pkg = tmp_path / "ringzero"
    for sub in ("comm", "parallel", "models"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "trainer.py").write_text("")
    (pkg / "comm" / "a.py").write_text("def f():\n    from ..parallel import b\n")
    (pkg / "parallel" / "b.py").write_text("from .. import trainer\nfrom ..models import m\nfrom ..comm import a\n")
    (pkg / "models" / "m.py").write_text("from ..comm import a\n")
    assert layer_violations(import_graph(package_modules(pkg))) == [
        "ringzero.comm.a (5 comm) imports ringzero.parallel.b (7 parallel)",
        "ringzero.models.m (models) imports ringzero.comm.a (5 comm)",
        "ringzero.parallel.b (7 parallel) imports ringzero.trainer (8 tools)"]


PARALLEL_FORMS = {"data_parallel": set(), "tensor_parallel": {"data_parallel"},
                  "pipeline": {"data_parallel", "tensor_parallel"},
                  "hf": {"data_parallel", "tensor_parallel", "pipeline", "expert"}, "expert": {"data_parallel"}}
"""The folders of parallel/, one per form, and the other forms each may import (docs/design.md)."""


def test_parallel_has_a_folder_per_form():
    parallel = PACKAGE / "parallel"
    assert {p.name for p in parallel.glob("*.py")} == {"__init__.py", "mesh.py", "layout.py"}
    folders = {p.name for p in parallel.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(PARALLEL_FORMS)
    assert all((parallel / f / "__init__.py").is_file() for f in folders)
    graph = import_graph(package_modules())
    wrong = []
    for name, deps in graph.items():
        form = name.split(".")[2] if name.startswith("ringzero.parallel.") else None
        if form in PARALLEL_FORMS:
            for dep in deps:
                other = dep.split(".")[2] if dep.startswith("ringzero.parallel.") else None
                if other in PARALLEL_FORMS and other != form and other not in PARALLEL_FORMS[form]:
                    wrong.append(f"{name} imports {dep}")
    assert not wrong, wrong


def run_name_branches(source: str, names) -> list[int]:
    """Lines of `source` that compare something with one of the run `names` (==, !=, in a literal
    collection of them) or test for a prefix or suffix of one (.startswith("deepspeed-"))."""
    names = set(names)

    def is_name(node):
        return isinstance(node, ast.Constant) and node.value in names

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(is_name(o) or (isinstance(o, (ast.Tuple, ast.List, ast.Set)) and any(is_name(e) for e in o.elts))
                   for o in operands):
                found.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("startswith", "endswith"):
            literals = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if any(getattr(n, node.func.attr)(s) for s in literals for n in names):
                found.append(node.lineno)
    return sorted(found)


def test_trainer_picks_a_run_class_from_one_registry():
    """registry.RUN_CLASSES maps every name `ringzero train` accepts to a concrete run.Run class, and is
    the only place that tells runs apart by name: no trainer module but layout.py (the name tables and
    the rules checked before any rank starts) branches on a run's name, and loop.py probes no Run
    attribute with getattr/hasattr."""
    import inspect

    from ringzero.trainer.layout import RUNS
    from ringzero.trainer.registry import RUN_CLASSES
    from ringzero.trainer.run import Run

    assert set(RUN_CLASSES) == set(RUNS)
    assert all(issubclass(c, Run) and not inspect.isabstract(c) for c in RUN_CLASSES.values())
    trainer = PACKAGE / "trainer"
    branches = {p.name: run_name_branches(p.read_text(), RUNS) for p in sorted(trainer.glob("*.py"))
                if p.name != "layout.py"}
    assert not {f: lines for f, lines in branches.items() if lines}, branches
    loop = ast.parse((trainer / "loop.py").read_text())
    probes = [n.lineno for n in ast.walk(loop) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
              and n.func.id in ("getattr", "hasattr") and len(n.args) > 1 and isinstance(n.args[1], ast.Constant)
              and n.args[1].value in dir(Run)]
    assert not probes, f"loop.py probes a Run attribute at lines {probes}; declare it on run.Run"
    calls = {n.func.id for n in ast.walk(loop) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "run_class" in calls, "loop.py builds its run through registry.run_class"


def test_the_name_branch_check_finds_them():
    sample = ('if run == "torch-pp":\n    pass\nelif name.startswith("deepspeed-zero"):\n    pass\n'
              'x = run in ("pp", "3d")\ny = family.name == "gpt"\nz = fmt.startswith("{:<")\n')
    assert run_name_branches(sample, ["torch-pp", "pp", "3d", "deepspeed-zero1"]) == [1, 3, 5]


TEST_AREAS = {"collectives", "backend", "parallel", "trainer", "estimate", "cuda", "lab", "optim", "house"}


def misplaced_test_files(tests: pathlib.Path) -> list[str]:
    """What is out of place in a tests/ tree: test files live in an area folder (TEST_AREAS) and nowhere
    else; everything else Python lives in helpers/, where a file is run as its own process (it has an
    `if __name__ == "__main__":` block) exactly when its name starts with run_; conftest.py is the only
    Python file at the top."""
    problems = []
    for path in sorted(tests.rglob("*.py")):
        rel = path.relative_to(tests)
        top = rel.parts[0]
        if "cpp" == top or "__pycache__" in rel.parts:
            continue
        if len(rel.parts) == 1:
            if rel.name != "conftest.py":
                problems.append(f"{rel}: only conftest.py sits at the top of tests/")
        elif rel.name.startswith("test_"):
            if top not in TEST_AREAS or len(rel.parts) != 2:
                problems.append(f"{rel}: a test file belongs in one of {sorted(TEST_AREAS)}")
        elif top != "helpers":
            problems.append(f"{rel}: a helper belongs in tests/helpers")
        elif len(rel.parts) == 2:
            is_main = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)
                          for n in ast.parse(path.read_text()).body)
            if is_main != rel.name.startswith("run_"):
                problems.append(f"{rel}: run as a process {'but not' if is_main else 'yet'} named run_*.py")
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name not in ("cpp", "helpers", "__pycache__")}
    problems += [f"{f}/: not an area of tests/" for f in sorted(folders - TEST_AREAS)]
    return problems


def test_tests_are_filed_by_area_and_helpers_in_one_place():
    assert misplaced_test_files(pathlib.Path(__file__).resolve().parents[1]) == []


def test_the_test_layout_check_can_fail(tmp_path):
    for rel, text in {"conftest.py": "", "stray.py": "", "collectives/test_x.py": "", "misc/test_y.py": "",
                      "collectives/util.py": "", "helpers/run_ok.py": "if __name__ == '__main__':\n    pass\n",
                      "helpers/script.py": "if __name__ == '__main__':\n    pass\n", "helpers/run_lib.py": "X = 1\n",
                      "helpers/cases.py": "X = 1\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = misplaced_test_files(tmp_path)
    assert sorted(p.split(":")[0] for p in found) == sorted(
        ["stray.py", "misc/test_y.py", "collectives/util.py", "helpers/script.py", "helpers/run_lib.py", "misc/"]), found
