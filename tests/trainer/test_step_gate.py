"""RINGZERO_STEP_GATE (trainer/faults.py): `ringzero train`'s ranks stop at the listed steps until a test opens
the gate. The lab's byte count (tests/lab/test_hostlab_training.py) rests on it; here, one process, with the
rank taken as 0 (no process group)."""
from __future__ import annotations

import threading
import time

import pytest

from ringzero.trainer import faults


@pytest.fixture
def rank0(monkeypatch):
    monkeypatch.setattr(faults.dist, "get_rank", lambda: 0)


@pytest.mark.parametrize("spec", ["steps=2", "dir=/tmp", "steps=two:dir=/tmp", "2,6"])
def test_a_malformed_gate_is_a_value_error(monkeypatch, rank0, spec):
    monkeypatch.setenv("RINGZERO_STEP_GATE", spec)
    with pytest.raises(ValueError, match="RINGZERO_STEP_GATE"):
        faults.step_gate(2)


def test_the_gate_stops_only_its_steps_until_opened(monkeypatch, rank0, tmp_path):
    monkeypatch.setenv("RINGZERO_STEP_GATE", f"steps=2,6:dir={tmp_path}")
    faults.step_gate(3)  # not a gated step: returns at once, leaves nothing
    assert list(tmp_path.iterdir()) == []
    opened = []

    def open_later():
        while not (tmp_path / "at-2-rank-0").exists():
            time.sleep(0.01)
        time.sleep(0.2)
        opened.append(time.monotonic())
        (tmp_path / "go-2").touch()

    t = threading.Thread(target=open_later)
    t.start()
    faults.step_gate(2)
    returned = time.monotonic()
    t.join()
    assert opened and returned >= opened[0], "step_gate returned before the gate was opened"


def test_a_gate_never_opened_raises_naming_the_file(monkeypatch, rank0, tmp_path):
    monkeypatch.setenv("RINGZERO_STEP_GATE", f"steps=6:dir={tmp_path}")
    monkeypatch.setenv("RINGZERO_TIMEOUT_S", "0.3")
    with pytest.raises(TimeoutError, match="go-6"):
        faults.step_gate(6)
    assert (tmp_path / "at-6-rank-0").exists()
