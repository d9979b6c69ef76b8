"""One broker per data directory: an exclusive lock held for the broker's whole life.

Two brokers on one `--data-dir` would both append to the commit log and
rewrite topics.json and consumerOffset.json over each other. The broker takes
an `fcntl.flock` on `<data-dir>/lock` before it reads anything and keeps the
file open until it exits; the kernel drops the lock when the process dies,
kill -9 included, so a crash never leaves a stale lock behind. The file holds
the holder's pid, so the second broker can say who has the directory.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from tidemark.broker.errors import BrokerError

LOCK_FILE = "lock"


class DataDirLockedError(BrokerError):
    """Another process holds the data directory."""


class DataDirLock:
    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise DataDirLockedError naming the holder's pid. Idempotent."""
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"pid {holder}" if holder else "another process"
            raise DataDirLockedError(f"data dir {self.path.parent} is in use by another broker ({who}); "
                                     f"stop it or give this broker its own --data-dir") from None
        except BaseException:
            os.close(fd)
            raise
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # a full disk must not stop the broker that holds the lock; the pid is only a hint
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isascii() and text.isdigit() else None
