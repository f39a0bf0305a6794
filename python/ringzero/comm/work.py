"""Handles returned by collectives called with async_op=True (torch.distributed.Work's contract)."""
from __future__ import annotations

import concurrent.futures

import torch


class Work:
    """A collective in flight. wait() blocks until it is done and re-raises its error, if any."""

    def __init__(self, future: concurrent.futures.Future, result=None):
        self._future = future
        self._result = result

    @classmethod
    def completed(cls, result=None) -> "Work":
        f = concurrent.futures.Future()
        f.set_result(None)
        return cls(f, result)

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the collective finished (the op's own RINGZERO_TIMEOUT_S bounds it too)."""
        self._future.result(timeout)
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        return self._future.done() and self._future.exception() is None

    def exception(self):
        return self._future.exception() if self._future.done() else None

    def result(self):
        """The tensors the collective wrote (after wait())."""
        self.wait()
        return self._result

    def get_future(self) -> torch.futures.Future:
        """A torch.futures.Future completed with the written tensors, as c10d Work.get_future() is."""
        fut = torch.futures.Future()

        def done(f):
            exc = f.exception()
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(self._result)

        self._future.add_done_callback(done)
        return fut
