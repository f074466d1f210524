"""Ctrl-C (SIGINT) and SIGTERM: inside the RL loop the run finishes its step, checkpoints and stops.

Outside the loop (building, value pretraining, evaluation at step 0) there is nothing to save yet, so a
signal stops the run at once. Either way the run ends KILLED and the process exits with 128 + the signal
number (130 for Ctrl-C, 143 for SIGTERM). A second signal while a step finishes stops at once; a SIGTERM within
a second of the previous one is the same request (a dying ``rlx sweep`` sends each worker one per thread of its
own that exits, see ``launchers.stop_with_parent``).
"""

from __future__ import annotations

import math
import signal
import threading
import time
from contextlib import contextmanager


class Stopped(Exception):
    """The run was asked to stop by a signal; ``code`` is the exit status."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.code = 128 + signum


class StopRequests:
    """Installs the handlers; ``requested`` is the pending signal's number (or None) inside ``deferred()``."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    REPEAT_S = 1.0  # a SIGTERM this soon after another is a repeat of it

    def __init__(self):
        self.requested: int | None = None
        self._deferring = False
        self._previous = {}
        self._last_sigterm = -math.inf

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGTERM:
            now, last = time.monotonic(), self._last_sigterm
            self._last_sigterm = now
            if now - last < self.REPEAT_S:
                return
        if self._deferring and self.requested is None:
            self.requested = signum  # the loop checks this at the end of the step
            return
        raise Stopped(signum, f"stopped by {signal.Signals(signum).name} before a checkpoint could be written")

    @contextmanager
    def deferred(self):
        """Inside it, a signal only sets ``requested``; the caller checkpoints and raises ``stop()``."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False

    def stop(self, message: str) -> Stopped:
        return Stopped(self.requested, f"stopped by {signal.Signals(self.requested).name}: {message}")

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is not threading.main_thread():
            return self  # only the main thread may handle signals: a run in another thread keeps the defaults
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
