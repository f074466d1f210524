"""File locks, rlx's one ``flock`` helper: who is alive (a study's driver and workers), and one process at a time
(a fresh MLflow store's tables, the built-in base model's training).

A process holds an exclusive ``flock`` on a file for as long as it lives or until it closes the descriptor. The
kernel lets go of the lock when its holder dies, however it dies (SIGKILL, a crash, the OOM killer), so there
is no pid file to go stale and no time-out to tune. A child started with the descriptor in ``pass_fds`` shares the
lock and keeps it after the parent closes its copy. On a cluster the files must sit on a filesystem whose ``flock``
is seen by every machine (NFSv4 and most parallel filesystems; Lustre with ``-o flock``).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def take(path: Path, *, wait: float = 0.0) -> int | None:
    """Hold the lock on ``path`` (created, with its folders): the open descriptor, or None if another process holds
    it after ``wait`` seconds (a reader probing it with ``held`` holds it for microseconds). Closing the descriptor
    lets go."""
    fd = descriptor(path)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.05)


def held(path: Path) -> bool:
    """Whether a live process holds the lock on ``path`` (no file: nobody)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # and with it the shared lock just taken


@contextmanager
def holding(path: Path) -> Iterator[None]:
    """Inside it, this process holds the lock on ``path`` (created, with its folders), waiting for as long as another
    holds it; let go on leaving."""
    fd = descriptor(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def descriptor(path: Path) -> int:
    """An open descriptor of ``path`` to lock (the file created, with its folders, if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
