"""Layer 7 (python/ringzero/parallel) reaches the comm layer through its public surface only: no module there
imports a private name of ringzero.comm (a module or a name starting with `_`), takes hold of a
Communicator (get_communicator, Communicator, HostGroup), or reads a Communicator's transport state or
execution entry points (`.shm`, `.run`, `.transport`, ...) on any object. What ZeRO++ once took that way is public
now (comm.group_info, comm.all_gather_dequantize). Reference: the source text (ast) of parallel/ and of
comm/communicator.py, whose attributes the listed names must be."""
from __future__ import annotations

import ast
import pathlib

import ringzero

PACKAGE = pathlib.Path(ringzero.__file__).resolve().parent

COMMUNICATOR_HANDLES = {"get_communicator", "Communicator", "HostGroup"}
"""Public names of ringzero.comm that hand out a Communicator (or its HostGroup): the way to its internals."""

COMMUNICATOR_INTERNALS = {"shm", "run", "run_direct", "shm_direct", "transport", "flat_ring", "cross_ring",
                          "flight", "cuda_path", "shm_all_reduce_", "shm_reduce_scatter", "shm_all_gather",
                          "shm_all_to_all"}
"""Attributes of a Communicator that hold its transport state or run calls on it, read by name on any object
(the check cannot know types: parallel/ keeps these names for Communicators alone). A Communicator's `hosts`
is not among them: it is also a field of the public comm.Topology (comm.group_info), and a Communicator's
own cannot be reached without one of COMMUNICATOR_HANDLES."""


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def boundary_violations(root: pathlib.Path, top: pathlib.Path) -> list[str]:
    """Each crossing of the comm layer's public surface by a module under `root` (a folder of the package
    whose top folder is `top`, named as that folder), as "file:line what"."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(top.parent)
        package = list(rel.parent.parts)
        tree = ast.parse(path.read_text())
        comm_names = set()  # names bound to ringzero.comm or one of its modules in this file
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    parts = a.name.split(".")
                    if parts[:2] == [top.name, "comm"]:
                        if any(_private(p) for p in parts[2:]):
                            found.append(f"{rel}:{node.lineno} imports {a.name}")
                        if a.asname:
                            comm_names.add(a.asname)
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                target = base + (node.module.split(".") if node.module else [])
                if target[:2] != [top.name, "comm"] and target != [top.name]:
                    continue
                for a in node.names:
                    full = target + [a.name]
                    if full[:2] != [top.name, "comm"]:
                        continue  # `from ringzero import x`, x not comm
                    where = ".".join(full)
                    if any(_private(p) for p in full[2:]):
                        found.append(f"{rel}:{node.lineno} imports the private {where}")
                    elif a.name in COMMUNICATOR_HANDLES:
                        found.append(f"{rel}:{node.lineno} imports {where}, which hands out a Communicator")
                    else:
                        comm_names.add(a.asname or a.name)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
                continue
            on_comm = isinstance(node.value, ast.Name) and node.value.id in comm_names
            if on_comm and _private(node.attr):
                found.append(f"{rel}:{node.lineno} reads the private {node.value.id}.{node.attr}")
            elif on_comm and node.attr in COMMUNICATOR_HANDLES:
                found.append(f"{rel}:{node.lineno} calls {node.value.id}.{node.attr}, which hands out a Communicator")
            elif node.attr in COMMUNICATOR_INTERNALS:
                found.append(f"{rel}:{node.lineno} reads .{node.attr}, a Communicator's internals")
    return found


def test_parallel_uses_only_the_public_comm_layer():
    assert boundary_violations(PACKAGE / "parallel", PACKAGE) == []


def test_the_internal_names_are_a_communicators():
    """The listed attributes exist on Communicator (set in its methods or defined as methods), so the list
    follows the class rather than a memory of it."""
    tree = ast.parse((PACKAGE / "comm" / "communicator.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Communicator")
    names = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    names |= {t.attr for n in ast.walk(cls) if isinstance(n, ast.Assign) for t in n.targets
              if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    names |= {e.attr for n in ast.walk(cls) if isinstance(n, ast.Assign) for t in n.targets
              if isinstance(t, ast.Tuple) for e in t.elts if isinstance(e, ast.Attribute)}
    assert COMMUNICATOR_INTERNALS <= names, COMMUNICATOR_INTERNALS - names


def test_the_boundary_check_finds_each_kind(tmp_path):
    top = tmp_path / "ringzero"
    (top / "parallel" / "form").mkdir(parents=True)
    (top / "parallel" / "form" / "a.py").write_text(
        "from ... import comm\n"
        "from ...comm.api import _comm\n"
        "from ...comm import _private_mod\n"
        "from ...comm.communicator import get_communicator\n"
        "import ringzero.comm._x\n"
        "from ...comm.types import ReduceOp\n"
        "def f(g, t):\n"
        "    c = comm._comm(g, 'x')\n"
        "    comm.get_communicator(g)\n"
        "    c.run(lambda: c.shm.all_gather(t), False)\n"
        "    return comm.all_reduce(t, op=ReduceOp.SUM, group=g), g.host_group\n")
    found = boundary_violations(top / "parallel", top)
    lines = sorted(int(f.split(":")[1].split()[0]) for f in found)
    assert lines == [2, 3, 4, 5, 8, 9, 10, 10], found
