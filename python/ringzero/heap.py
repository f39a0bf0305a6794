"""A training rank's C heap: glibc's malloc told to keep what a step frees ([Note: a rank keeps its heap]).
The command-line tools call keep_freed_memory() in every rank they start (launch.py)."""
from __future__ import annotations

import ctypes
import os

# [Note: a rank keeps its heap]
# A training step allocates and frees the same large CPU buffers every time: ZeRO-3's gathered weights
# and flat gradients, each unit's in turn; buckets, activations, optimizer temporaries. glibc hands a
# request above M_MMAP_THRESHOLD a fresh mmap and unmaps it at free(), and gives the top of its heap back
# to the kernel once more than M_TRIM_THRESHOLD lies free there (both thresholds move with the sizes freed
# so far). Either way the next step touches new pages: a page fault each 4 KiB and the kernel zeroing the
# page, before torch writes it again. On 2 cores shared by 4 ranks (the host lab) that was about a tenth
# of a zeropp step (benchmarks/RESULTS.md, "The rank's heap"). So a rank started by our tools serves
# requests up to MMAP_THRESHOLD_BYTES from its heap and never trims it: its resident memory stays at its
# high-water mark, which a training rank reaches every step anyway. Larger requests still get their own
# mmap. torch's own CPU launcher (torch.backends.xeon.run_cpu) preloads jemalloc with page decay turned off
# for the same reason. A user's own choice is left alone: glibc's tunables in the environment, or another
# allocator preloaded.
M_TRIM_THRESHOLD = -1  # mallopt parameters, <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20
"""glibc's largest (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit): mallopt refuses more."""
TRIM_THRESHOLD_BYTES = 2**31 - 1
"""mallopt takes an int: 2 GiB is the most it can say (more than that free at the heap's top is given back)."""
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES", "LD_PRELOAD")


def keep_freed_memory() -> bool:
    """Tells glibc's malloc in this process to keep freed memory for reuse (the Note above). True if it
    did; False where the C library is not glibc or the environment already chose (USER_SETTINGS)."""
    if any(os.environ.get(name) for name in USER_SETTINGS):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only: musl and macOS have no such mallopt parameters
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


__all__ = ["keep_freed_memory"]
