import glob
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


def _segments():
    return set(glob.glob("/dev/shm/ringzero-*"))


@pytest.fixture(autouse=True)
def no_leaked_segments():
    """Every test, including the ones that kill a rank, must leave nothing in /dev/shm."""
    before = _segments()
    yield
    leaked = _segments() - before
    assert not leaked, f"shared-memory segments leaked: {sorted(leaked)}"
