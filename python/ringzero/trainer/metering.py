"""Peak memory of one rank, counted the same way on both devices: the most tensor bytes alive at once.

On a GPU that is torch.cuda.max_memory_allocated (the caching allocator's own statistic, free to read,
so the whole run counts). On the CPU ringzero.memory.TensorMemoryMeter counts storages through a
dispatch mode; counting costs about 7% of a step, so the loop stops it after METERED_STEPS steps
(every later step repeats their allocations) and leaves those steps out of the step time. The
resident-set peak above the process's start is kept too (it adds what is not a tensor).
"""
from __future__ import annotations

import os
import resource

import torch

METERED_STEPS = 3
"""Steps counted by the CPU meter (and left out of the step time on both devices)."""


def core_wait_s() -> float:
    """Seconds the calling thread has been runnable but off a core (Linux's schedstat run_delay: other
    processes held the cores); 0.0 where the kernel does not report it. The step time's prediction is held
    to the measured step less this wait (estimate_check.predicted_step_for_run, [Note: a step's time on
    its cores] in trainer/loop.py)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) * 1e-9
    except (OSError, IndexError, ValueError):
        return 0.0


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """with PeakMemory(device) as peak: ...; peak.stop() ends CPU counting early; after the block
    peak.tensor_bytes and peak.rss_bytes. Only one may be active per process (the CPU meter's rule)."""

    def __init__(self, device: torch.device):
        from ..memory import TensorMemoryMeter

        self.device = device
        self._meter = TensorMemoryMeter() if device.type == "cpu" else None
        self._metering = False
        self.tensor_bytes = self.rss_bytes = 0

    def __enter__(self):
        self._rss0 = _rss_bytes()
        if self._meter is not None:
            self._meter.__enter__()
            self._metering = True
        else:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)  # what the process held before the run
        return self

    def stop(self):
        """Ends the CPU meter's counting (its peak is kept); nothing to do on a GPU."""
        if self._metering:
            self._metering = False
            self._meter.__exit__(None, None, None)

    def __exit__(self, *exc):
        self.stop()
        if self._meter is not None:
            self.tensor_bytes = self._meter.peak_bytes("cpu")
        else:
            torch.cuda.synchronize(self.device)
            self.tensor_bytes = torch.cuda.max_memory_allocated(self.device) - self._base
        self.rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self._rss0
        return False
