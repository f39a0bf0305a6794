"""launch(): `--nproc N` ranks on the CPU start from a fork server ([Note: the fork server] in launch.py).
References: what the launching process has at each launch (its environment, its stdout and stderr as
pytest's capfd sees them), and the process ids the OS reports."""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

import ringzero
from ringzero.cli.launch import launch


def _report(path):
    rank = dist.get_rank()
    x = torch.full((5,), float(rank + 1))
    ringzero.all_reduce(x)
    mark = os.environ.get("RINGZERO_TEST_LAUNCH_MARK", "<unset>")
    print(f"stdout rank {rank} mark {mark}", flush=True)
    print(f"stderr rank {rank} mark {mark}", file=sys.stderr, flush=True)
    with open(f"{path}.{rank}", "w") as f:
        json.dump({"mark": mark, "gone": os.environ.get("RINGZERO_TEST_LAUNCH_GONE"), "pid": os.getpid(),
                   "ppid": os.getppid(), "sum": x.tolist()}, f)


def _rows(tmp_path, name, nproc):
    return [json.loads((tmp_path / f"{name}.{r}").read_text()) for r in range(nproc)]


def test_each_launch_gets_the_launching_process_environment_and_output(tmp_path, capfd, monkeypatch):
    with capfd.disabled():  # the server starts here (unless an earlier test started it): outside this capture
        launch(_report, 2, str(tmp_path / "warm"))
    monkeypatch.setenv("RINGZERO_TEST_LAUNCH_MARK", "first")
    monkeypatch.setenv("RINGZERO_TEST_LAUNCH_GONE", "set")
    launch(_report, 2, str(tmp_path / "a"))
    first = capfd.readouterr()
    monkeypatch.setenv("RINGZERO_TEST_LAUNCH_MARK", "second")
    monkeypatch.delenv("RINGZERO_TEST_LAUNCH_GONE")
    launch(_report, 3, str(tmp_path / "b"))
    second = capfd.readouterr()

    a, b = _rows(tmp_path, "a", 2), _rows(tmp_path, "b", 3)
    assert [r["sum"] for r in a] == [[3.0] * 5] * 2 and [r["sum"] for r in b] == [[6.0] * 5] * 3
    assert [r["mark"] for r in a] == ["first"] * 2 and [r["gone"] for r in a] == ["set"] * 2
    assert [r["mark"] for r in b] == ["second"] * 3 and [r["gone"] for r in b] == [None] * 3
    for rank in range(2):
        assert f"stdout rank {rank} mark first" in first.out and f"stderr rank {rank} mark first" in first.err
    for rank in range(3):
        assert f"stdout rank {rank} mark second" in second.out and f"stderr rank {rank} mark second" in second.err
    assert "mark second" not in first.out + first.err and "mark first" not in second.out + second.err
    # One server for both launches, not this process: every rank a child of it.
    servers = {r["ppid"] for r in _rows(tmp_path, "warm", 2) + a + b}
    assert len(servers) == 1 and os.getpid() not in servers, (servers, os.getpid())
    assert len({r["pid"] for r in a + b}) == 5  # and a fresh process for every rank of every launch


def _fail(path):
    if dist.get_rank() == 1:
        raise ValueError("rank 1 refuses")


def test_a_rank_that_raises_fails_the_launch_with_its_error(tmp_path):
    import pytest
    from torch.multiprocessing import ProcessRaisedException

    with pytest.raises(ProcessRaisedException, match="rank 1 refuses"):
        launch(_fail, 2, str(tmp_path / "c"))


_RESTART_SCRIPT = r"""
import json, os, sys
import ringzero.cli.launch as launcher

def ppid(path):
    with open(f"{path}.{os.environ['RANK']}", "w") as f:
        f.write(str(os.getppid()))

if __name__ == "__main__":
    out = sys.argv[1]
    assert not any(m.startswith("transformers.models.") for m in sys.modules)
    launcher.launch(ppid, 2, out + "/before")
    import transformers.models.llama.modeling_llama
    launcher.launch(ppid, 2, out + "/after")
    launcher.launch(ppid, 2, out + "/again")
    print(json.dumps({"preload": launcher._SERVER_PRELOAD, **{name: sorted({open(f"{out}/{name}.{r}").read()
          for r in range(2)}) for name in ("before", "after", "again")}}))
"""


def test_the_server_restarts_once_to_preload_a_transformers_model(tmp_path):
    """A launch after the process imported a transformers model (as `ringzero train --model hf:...` does
    before its ranks start) gets a server that has it; the next launch reuses that server. In a fresh
    interpreter: this one may have imported transformers already."""
    import subprocess

    import pytest

    pytest.importorskip("transformers")
    script = tmp_path / "restart.py"
    script.write_text(_RESTART_SCRIPT)
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(len(got[name]) == 1 for name in ("before", "after", "again")), got
    assert got["after"] != got["before"] and got["again"] == got["after"], got
    assert "transformers.models.llama.modeling_llama" in got["preload"], got
