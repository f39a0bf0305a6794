"""ringzero.heap ([Note: a rank keeps its heap]): after keep_freed_memory(), a process that allocates, touches
and frees the same large buffers again and again faults their pages in once, not every round; a user's own
malloc settings in the environment are left alone. Reference: the same rounds in a process without it
(glibc's defaults), which fault every round. Each arm runs in a fresh interpreter: mallopt's settings last
for the process."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROUNDS = """
import ctypes, json, resource, sys
sys.path.insert(0, sys.argv[2])
if sys.argv[1] == "keep":
    from ringzero.heap import keep_freed_memory
    assert keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
SIZE = 6 << 20  # three of them: over glibc's own trim threshold (twice the largest freed) once freed
faults = []
for _ in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [libc.malloc(SIZE) for _ in range(3)]
    for b in blocks:
        ctypes.memset(b, 1, SIZE)  # touch every page, as torch writing a fresh tensor does
    for b in reversed(blocks):
        libc.free(b)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults))
"""


def rounds(arm):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
    out = subprocess.run([sys.executable, "-c", ROUNDS, arm, os.path.join(ROOT, "python")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_freed_buffers_are_not_faulted_in_again():
    pages = 3 * (6 << 20) // os.sysconf("SC_PAGE_SIZE")
    default, kept = rounds("default"), rounds("keep")
    print(f"page faults per round of {pages} pages: glibc's defaults {default}, after keep_freed_memory() {kept}")
    assert kept[0] >= pages // 2, kept  # the first round faults its pages in either way
    assert max(kept[1:]) < pages // 20, kept
    # The reference: without it glibc gives the freed memory back and the rounds fault again.
    assert min(default[1:]) >= pages // 2, default


@pytest.mark.parametrize("name,value", [("MALLOC_TRIM_THRESHOLD_", "131072"), ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0"),
                                        ("LD_PRELOAD", "libjemalloc.so.2")])
def test_a_users_own_allocator_settings_are_left_alone(monkeypatch, name, value):
    from ringzero.heap import keep_freed_memory

    monkeypatch.setenv(name, value)
    assert keep_freed_memory() is False
