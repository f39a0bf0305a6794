"""Flight recorder: the last 64 collectives of each communicator (op, sequence number, dtype, numel,
start, duration, outcome), written to a file when a collective times out or mismatches, and for
every communicator on SIGUSR1. The file is named in the error message, so a hang report always comes
with what each rank last did.
"""
from __future__ import annotations

import collections
import datetime
import os
import signal
import sys
import tempfile
import threading
import time
import weakref

CAPACITY = 64
_RECORDERS: "weakref.WeakSet[FlightRecorder]" = weakref.WeakSet()
_SIGNAL_INSTALLED = False


class FlightRecorder:
    """The recent collectives of one communicator; files go to `folder` (Config.flight_dir, from
    RINGZERO_FLIGHT_DIR) or, when empty, the temp folder."""

    def __init__(self, global_rank: int, label: str, folder: str = ""):
        self.global_rank = global_rank
        self.label = label
        self.folder = folder
        self.entries = collections.deque(maxlen=CAPACITY)
        _RECORDERS.add(self)
        _install_signal_handler()

    def start(self, seq: int, op: str, tensor) -> list:
        """Records the start of a collective (cheap: on the path of every call)."""
        entry = [seq, op, tensor.dtype if tensor is not None else None, tensor.numel() if tensor is not None else 0,
                 time.time(), None, "running"]
        self.entries.append(entry)
        return entry

    @staticmethod
    def end(entry: list, status: str = "ok"):
        entry[5] = time.time() - entry[4]
        entry[6] = status

    def path(self) -> str:
        folder = self.folder or tempfile.gettempdir()
        return os.path.join(folder, f"ringzero-flight-rank{self.global_rank}-pid{os.getpid()}.txt")

    def dump(self, reason: str) -> str:
        """Appends the recorded ops to this rank's file and returns its path."""
        lines = [f"== ringzero flight recorder | {self.label} | global rank {self.global_rank} | pid {os.getpid()} "
                 f"| {datetime.datetime.now().isoformat(timespec='seconds')} | {reason}",
                 f"{'seq':>6}  {'op':<22} {'dtype':<9} {'numel':>12}  {'start':<15} {'ms':>10}  status"]
        for seq, op, dtype, numel, t0, dt, status in list(self.entries):
            dtype = str(dtype).replace("torch.", "") if dtype is not None else "-"
            start = datetime.datetime.fromtimestamp(t0).strftime("%H:%M:%S.%f")
            ms = f"{dt * 1e3:.3f}" if dt is not None else "-"
            lines.append(f"{seq:>6}  {op:<22} {dtype:<9} {numel:>12}  {start:<15} {ms:>10}  {status}")
        path = self.path()
        try:
            with open(path, "a") as f:
                f.write("\n".join(lines) + "\n")
        except OSError as e:  # never let the recorder hide the real error
            return f"(could not write {path}: {e})"
        return path


def _on_sigusr1(signum, frame):
    paths = [r.dump("SIGUSR1") for r in list(_RECORDERS)]
    sys.stderr.write("ringzero flight recorder written to: " + ", ".join(paths) + "\n")


def _install_signal_handler():
    """On SIGUSR1, dump every recorder; only from the main thread and only if nobody else handles it."""
    global _SIGNAL_INSTALLED
    if _SIGNAL_INSTALLED or threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGUSR1, _on_sigusr1)
        _SIGNAL_INSTALLED = True
    except (ValueError, OSError, AttributeError):
        pass
