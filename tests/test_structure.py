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


def test_each_submodule_imports_alone_in_a_fresh_interpreter():
    procs = {m: subprocess.Popen([sys.executable, "-c", f"import ringzero.comm.{m}"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for m in ["__init__", *MODULES]}
    failed = {}
    for m, p in procs.items():
        out, err = p.communicate(timeout=300)
        if p.returncode != 0:
            failed[m] = err[-2000:]
    assert not failed, failed


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
    references live in helper modules (reference.py, adam_cases.py, cuda_fuzz_cases.py, ...)."""
    tests = pathlib.Path(__file__).resolve().parent
    offenders = []
    for path in sorted(tests.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            offenders += [f"{path.name} imports {n}" for n in names if n.split(".")[0].startswith("test_")]
    assert not offenders, offenders


TRANSPORT_CLASSES = {"Solo", "SharedMemory", "NetworkRing", "Hierarchical", "CudaPeers", "CudaRing", "CudaHierarchical"}
TRANSPORT_MAKERS = {("transports.py", "pick_transport"), ("cuda.py", "_pick_transport")}


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
    and patch(), and the swap-in backend's engine across hosts) and cuda.CudaPath._pick_transport (CUDA)
    make transports, both from layout(); the backend's creator and its CUDA setup tell the C++ side
    spans_hosts from layout() too; nothing but layout() reads a topology's single_host or hierarchical
    (topology.py computes them); and the C++ backend no longer compares host ids to decide for itself."""
    sources = {p.name: p.read_text() for p in sorted(COMM.glob("*.py"))}
    found = layout_decisions(sources)
    assert found["made"] == TRANSPORT_MAKERS, found["made"]
    # (cuda.py's _pick_transport reads the layout its __init__ took)
    assert {("transports.py", "pick_transport"), ("backend.py", "_create_backend"), ("backend.py", "__call__"),
            ("communicator.py", "__init__"), ("cuda.py", "__init__")} <= found["layout"], found["layout"]
    assert {r for r in found["read"] if r[0] != "topology.py"} == {("transports.py", "layout")}, found["read"]
    backend_cpp = (COMM.parents[2] / "csrc" / "torch" / "backend.cpp").read_text()
    assert "host_id" not in backend_cpp, "the C++ backend decides the layout from host ids again"


def test_the_layout_check_finds_a_second_decision():
    sample = {"x.py": "def pick(topo):\n    if topo.single_host:\n        return SharedMemory(1, 2)\n"}
    found = layout_decisions(sample)
    assert found["made"] == {("x.py", "pick")} and found["read"] == {("x.py", "pick")} and not found["layout"]
