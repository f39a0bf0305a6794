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
        # Entries keep time.perf_counter() (one clock read per start and per end, shared with the
        # communicator's busy time); the dump turns them into wall-clock times with this offset.
        self.wall_minus_perf = time.time() - time.perf_counter()
        # name -> callable returning more entries in the same form, recorded natively (the shared-memory
        # communicator's own history, which alone sees the api's fast path): dumped as their own sections.
        self.sources = {}
        _RECORDERS.add(self)
        _install_signal_handler()

    def start(self, seq: int, op: str, tensor) -> list:
        """Records a collective when it is called (cheap: on the path of every call). The entry is
        [seq, op, dtype, numel, start perf_counter, seconds or None, status]; its start stays None until
        the call begins to run (began), which for an async call is later, on the communicator's worker."""
        entry = [seq, op, None, 0, None, None, "running"]
        if tensor is not None:
            entry[2] = tensor.dtype
            entry[3] = tensor.numel()
        self.entries.append(entry)
        return entry

    @staticmethod
    def began(entry: list) -> None:
        """Marks the entry's call as running: the one clock read of its start."""
        entry[4] = time.perf_counter()

    @staticmethod
    def end(entry: list, status: str = "ok") -> float:
        """Marks the entry finished; returns its duration in seconds."""
        entry[5] = dt = time.perf_counter() - entry[4]
        entry[6] = status
        return dt

    def path(self) -> str:
        folder = self.folder or tempfile.gettempdir()
        return os.path.join(folder, f"ringzero-flight-rank{self.global_rank}-pid{os.getpid()}.txt")

    def dump(self, reason: str) -> str:
        """Appends the recorded ops to this rank's file and returns its path."""
        lines = [f"== ringzero flight recorder | {self.label} | global rank {self.global_rank} | pid {os.getpid()} "
                 f"| {datetime.datetime.now().isoformat(timespec='seconds')} | {reason}"]
        sections = [("calls", list(self.entries))]
        for name, source in self.sources.items():
            try:
                sections.append((name, source()))
            except Exception as e:  # never let the recorder hide the real error
                lines.append(f"({name}: unreadable: {e})")
        for name, entries in sections:
            lines.append(f"-- {name}")
            lines.append(f"{'seq':>6}  {'op':<22} {'dtype':<9} {'numel':>12}  {'start':<15} {'ms':>10}  status")
            for seq, op, dtype, numel, t0, dt, status in entries:
                dtype = str(dtype).replace("torch.", "") if dtype is not None else "-"
                start = ("queued" if t0 is None else
                         datetime.datetime.fromtimestamp(t0 + self.wall_minus_perf).strftime("%H:%M:%S.%f"))
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
