import glob
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))


def _segments():
    return set(glob.glob("/dev/shm/ringzero-*"))


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _made_by_someone_else(path: str) -> bool:
    """A segment whose creator (the pid in its name) is alive and is neither this test process nor one
    of its descendants: another program's on this machine (a concurrent test run), not our leak."""
    try:
        creator = int(os.path.basename(path).split("-")[1])
    except (IndexError, ValueError):
        return False
    if not os.path.exists(f"/proc/{creator}"):
        return False  # its creator is gone and it is still here: a leak, whoever made it
    pid, me = creator, os.getpid()
    while pid > 1:
        if pid == me:
            return False
        pid = _parent(pid)
    return True


@pytest.fixture(autouse=True)
def no_leaked_segments():
    """Every test, including the ones that kill a rank, must leave nothing in /dev/shm."""
    before = _segments()
    yield
    leaked = {p for p in _segments() - before if not _made_by_someone_else(p)}
    assert not leaked, f"shared-memory segments leaked: {sorted(leaked)}"
