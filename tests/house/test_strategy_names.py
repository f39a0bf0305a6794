"""The names `ringzero train` accepts live in two source tables: parallel.layout.STRATEGY_FORMS (ringzero's
strategies, shared with the estimator) and trainer.registry.STOCK_ROWS (the stock rows). Every other list
of names is derived from them; these tests fail on a name listed in one place only, and on a new
hand-written table of names anywhere in the package."""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "ringzero"
SOURCES = {"parallel/layout.py", "trainer/registry.py"}
"""The two files allowed to write strategy names as a table."""
PENDING: set[str] = set()
"""Known tables in files another change is editing now: to derive from STRATEGY_FORMS, then empty this set."""
DIMENSIONS = {"pp", "tp", "ep"}
"""Mesh dimension names that are also strategy names: a dict keyed by these only is a table of sizes."""


def names_out_of_step(strategies: set, stock: dict, tables: dict[str, set], like_for_like: dict) -> list[str]:
    """What does not agree between the sources (strategies; stock: name -> StockRow-like with layout,
    first_for, else_for) and the tables derived from them (tables: name -> the set of names it lists,
    which must be every name; like_for_like: strategy -> stock rows)."""
    every = strategies | set(stock)
    problems = [f"{n} is both a strategy and a stock row" for n in sorted(strategies & set(stock))]
    for table, names in tables.items():
        problems += [f"{n} is in {table} only" for n in sorted(names - every)]
        problems += [f"{n} is missing from {table}" for n in sorted(every - names)]
    for name, row in stock.items():
        problems += [f"stock row {name} names {s}, not a strategy"
                     for s in (row.layout, *row.first_for, *row.else_for) if s not in strategies]
    problems += [f"{s} is missing from LIKE_FOR_LIKE" for s in sorted(strategies - set(like_for_like))]
    problems += [f"{s} in LIKE_FOR_LIKE is not a strategy" for s in sorted(set(like_for_like) - strategies)]
    problems += [f"{s} has no stock row to compare with" for s, rows in like_for_like.items() if not rows]
    problems += [f"{s} is the first choice of {len(rows)} stock rows" for s in sorted(strategies)
                 if len(rows := [n for n, r in stock.items() if s in r.first_for]) > 1]
    return problems


def test_every_name_is_in_both_sources_and_every_derived_table():
    from ringzero.parallel.layout import ALL_STRATEGIES, STRATEGY_FORMS
    from ringzero.trainer.layout import BASELINE_LAYOUT, BASELINES, RUNS
    from ringzero.trainer.registry import LIKE_FOR_LIKE, RUN_CLASSES, STOCK_ROWS

    tables = {"RUN_CLASSES": set(RUN_CLASSES), "RUNS": set(RUNS),
              "ALL_STRATEGIES + BASELINES": set(ALL_STRATEGIES) | set(BASELINES),
              "BASELINE_LAYOUT + STRATEGY_FORMS": set(BASELINE_LAYOUT) | set(STRATEGY_FORMS)}
    assert len(RUNS) == len(set(RUNS)), RUNS
    assert names_out_of_step(set(STRATEGY_FORMS), STOCK_ROWS, tables, LIKE_FOR_LIKE) == []


def tables_of_names(source: str, names: set, stock: set) -> list[int]:
    """Lines of `source` that write a table of names by hand: a dict keyed by two or more names, or a
    tuple, list or set of two or more stock-row names (one or two ringzero names in a rule are fine:
    `run == "pp"`). A dict keyed by dimension names only (DIMENSIONS) is not one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)} & names
            if len(keys) >= 2 and not keys <= DIMENSIONS:
                found.append(node.lineno)
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            if sum(isinstance(e, ast.Constant) and e.value in stock for e in node.elts) >= 2:
                found.append(node.lineno)
    return found


def test_no_other_module_writes_a_table_of_names():
    from ringzero.trainer.layout import BASELINES, RUNS

    found = {str(p.relative_to(PACKAGE)): lines for p in sorted(PACKAGE.rglob("*.py"))
             if str(p.relative_to(PACKAGE)) not in SOURCES | PENDING
             and (lines := tables_of_names(p.read_text(), set(RUNS), set(BASELINES)))}
    assert not found, f"name tables outside {sorted(SOURCES)} (derive them from those): {found}"


def test_the_name_checks_can_fail():
    class Row:
        def __init__(self, layout, first_for=(), else_for=()):
            self.layout, self.first_for, self.else_for = layout, first_for, else_for

    stock = {"torch-ddp": Row("ddp", ("ddp",)), "torch-x": Row("x", ("zero1",))}
    problems = names_out_of_step({"ddp", "zero1"}, stock, {"RUNS": {"ddp", "torch-ddp", "torch-x", "extra"}},
                                 {"ddp": ("torch-ddp",)})
    assert problems == ["extra is in RUNS only", "zero1 is missing from RUNS", "stock row torch-x names x, not a strategy",
                        "zero1 is missing from LIKE_FOR_LIKE"]
    sample = ('A = {"ddp": 1, "zero1": 2}\nB = ("torch-ddp", "torch-pp")\nrule = run in ("pp", "tp")\nC = {"ddp": 1}\n'
              'sizes = {"pp": 2, "tp": 1}\n')
    assert tables_of_names(sample, {"ddp", "zero1", "pp", "tp", "torch-ddp", "torch-pp"}, {"torch-ddp", "torch-pp"}) == [1, 2]
