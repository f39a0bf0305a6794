"""Runs torch's distributed test suite (suite.py) on gloo, on ringzero (BACKEND=ringzero) and with ringzero
standing in for every gloo group (BACKEND=gloo, so the suite's gloo-only tests run too) at several world
sizes, and says which tests pass on gloo but not on ringzero. The full run is this one command (about
30 s per backend at world size 2 on the 2-core machine, ranks forked):

    PYTHONPATH=python nice -n 19 python tests/helpers/torch_suite/run.py --out /tmp/torch_suite
    python tests/helpers/torch_suite/run.py --backends ringzero --world-sizes 2 -k "test_send_recv"   # a subset

Each (backend, world size) is one pytest process writing JUnit XML to --out; the summary (counts, and
the gloo-pass/ringzero-fail tests per world size) is printed and written to --out/summary.json.
tests/backend/test_torch_suite.py runs the CI subset through run_suite().
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET

HERE = pathlib.Path(__file__).resolve().parent


STAND_IN = "ringzero-for-gloo"  # the pseudo-backend name of the second mode (suite.py, RINGZERO_STAND_IN)


def run_suite(backend: str, world_size: int, out_dir: pathlib.Path, tests: list[str] | None = None,
              k: str | None = None, timeout_s: float | None = None, hosts: str = "") -> dict[str, str]:
    """Runs suite.py with `backend` ("gloo", "ringzero", or STAND_IN: the suite told gloo, every gloo group
    made ringzero) at `world_size` ranks; returns {test name: "passed"|"failed"|"skipped"}. `tests` names
    TorchSuite methods to run (all when None); `k` is a pytest -k expression; `hosts` (e.g. "a,a,b,b") forces
    each rank's host (suite.py, RINGZERO_SUITE_HOSTS): ringzero's groups then span hosts."""
    out_dir.mkdir(parents=True, exist_ok=True)
    xml_path = out_dir / f"{backend}-{world_size}{'-hosts' if hosts else ''}.xml"
    targets = [f"{HERE / 'suite.py'}::TorchSuite::{t}" for t in tests] if tests else [str(HERE / "suite.py")]
    # --noconftest: tests/conftest.py's check for leaked /dev/shm segments would also see those of other
    # processes on the machine; the suite's own checks are what counts here.
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest", f"--junitxml={xml_path}",
           *targets]
    if k:
        cmd += ["-k", k]
    env = {**os.environ, "BACKEND": "gloo" if backend == STAND_IN else backend, "WORLD_SIZE": str(world_size),
           "RINGZERO_STAND_IN": "1" if backend == STAND_IN else "0", "CUDA_VISIBLE_DEVICES": "",
           "RINGZERO_SUITE_HOSTS": hosts,
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    env.pop("TEMP_DIR", None)  # suite.py makes a fresh one per run
    log_path = out_dir / f"{backend}-{world_size}{'-hosts' if hosts else ''}.log"
    with open(log_path, "w") as log:
        subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, cwd=HERE)
    return parse_junit(xml_path)


def parse_junit(xml_path: pathlib.Path) -> dict[str, str]:
    """{test name: outcome} from pytest's JUnit XML."""
    outcomes = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        outcomes[case.get("name")] = outcome
    return outcomes


def backend_gates(test: str) -> list[str]:
    """The lines of torch's suite that gate `test` on the backend's name: its decorator lines that mention
    BACKEND or require_backend_is_available (whose set of names excludes plugins), each as
    "distributed_test.py:LINE: text" (an empty list when none does)."""
    import torch.testing._internal.distributed as package

    source = pathlib.Path(package.__file__).with_name("distributed_test.py")
    lines = source.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith(f"def {test}(")), None)
    if start is None:
        return []
    gates, i = [], start - 1
    while i >= 0 and (lines[i].strip().startswith(("@", ")", '"', "f\"", "BACKEND", "not ", "and ", "or "))
                      or lines[i].startswith(" " * 12) and lines[i].strip()):
        if "BACKEND" in lines[i] or "require_backend_is_available" in lines[i]:
            gates.append(f"{source.name}:{i + 1}: {lines[i].strip()}")
        i -= 1
    return gates[::-1]


def counts(outcomes: dict[str, str]) -> dict[str, int]:
    return {kind: sum(1 for o in outcomes.values() if o == kind) for kind in ("passed", "failed", "skipped")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["gloo", "ringzero", STAND_IN])
    parser.add_argument("--world-sizes", nargs="+", type=int, default=[2, 3, 4])
    parser.add_argument("-k", default=None, help="pytest -k expression selecting tests")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("torch_suite_results"))
    parser.add_argument("--hosts", action="store_true", help="ringzero's ranks on 2 forced hosts (half the ranks "
                        "each, RINGZERO_SUITE_HOSTS), so its groups span hosts; gloo runs as usual")
    args = parser.parse_args(argv)
    summary = {}
    for world in args.world_sizes:
        hosts = ",".join("ab"[2 * r // world] for r in range(world)) if args.hosts else ""
        results = {b: run_suite(b, world, args.out, k=args.k, hosts="" if b == "gloo" else hosts) for b in args.backends}
        entry = {b: counts(r) for b, r in results.items()}
        gloo = results.get("gloo", {})
        for mode, ours in results.items():
            if mode == "gloo" or not gloo:
                continue
            entry[f"gloo_pass_{mode}_not"] = {t: {mode: ours.get(t, "absent"), "gates": backend_gates(t)}
                                              for t, o in sorted(gloo.items()) if o == "passed" and ours.get(t) != "passed"}
            entry[f"{mode}_pass_gloo_not"] = sorted(t for t, o in ours.items() if o == "passed" and gloo.get(t) != "passed")
        summary[world] = entry
        print(f"world size {world}: {json.dumps(entry, indent=1)}", flush=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
