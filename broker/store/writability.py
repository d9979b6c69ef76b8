"""WriteGuard: whether the message store accepts writes now, and the probe that gives them back.

RocketMQ keeps RunningFlags (DISK_FULL, WRITE_LOGICS_QUEUE_ERROR, ...) and
answers puts with SERVICE_NOT_AVAILABLE while any is set. Tidemark's store does
the same with one small state machine:

    WRITABLE --trip(error)--> NOT_WRITABLE --probe succeeds--> WRITABLE

`trip()` is called on the loop thread by the store when an append or a flush
raised. The first trip of an episode records the cause, logs one line and tells
the listeners; further trips while NOT_WRITABLE change nothing (a full disk
fails every retry of the same flush, and one line per episode is what an
operator can read). While NOT_WRITABLE, `check()` refuses puts with a
StoreError (UNAVAILABLE on the wire) that says why and that the client should
retry later.

The guard owns one task, started by the store: every `probe_interval_s` while
NOT_WRITABLE it asks two questions, and goes back to WRITABLE (one line,
listeners) only when both say yes:

1. Is at least `resume_free_bytes` free on the store's file system? Without
   a margin, the first batch after a few freed kilobytes fills the disk again
   and the broker flaps between the two states once per second.
2. Does the store's `repair()` succeed? It cuts back a batch a failed append
   left half-written, and flushes (commit log, consume queues, checkpoint)
   whatever a failed fsync left pending, so nothing acknowledged before the
   episode depends on a flush that never happened.

Known limit: after a failed fsync, Linux may drop the dirty pages and report
the next fsync as successful (the "fsyncgate" behaviour of some file systems).
ENOSPC is reported by write() before any page is dirtied, so a full disk does
not run into it; a failing device (EIO on fsync) can, and then only a restart's
CRC-checked recovery from the last checkpoint can say what the disk holds.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from tidemark.broker.errors import StoreError
from tidemark.common.logs import get_logger
from tidemark.common.scheduler import cancel_and_wait

log = get_logger("tidemark.broker.store")

_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class WriteState(enum.Enum):
    WRITABLE = "writable"
    NOT_WRITABLE = "not_writable"


@dataclass(frozen=True)
class GuardSettings:
    """How often the probe looks, and how much room it wants before writes resume."""

    probe_interval_s: float = 1.0
    resume_free_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        if self.probe_interval_s <= 0:
            raise ValueError(f"probe_interval_s {self.probe_interval_s} must be > 0")
        if self.resume_free_bytes < 0:
            raise ValueError(f"resume_free_bytes {self.resume_free_bytes} must be >= 0")


def root_cause(exc: BaseException) -> BaseException:
    """The OSError behind a StoreError (the store wraps I/O errors), else exc itself."""
    seen = exc
    while not isinstance(seen, OSError) and seen.__cause__ is not None:
        seen = seen.__cause__
    return seen if isinstance(seen, OSError) else exc


def describe(exc: BaseException) -> str:
    """'disk full: <detail>' for ENOSPC/EDQUOT, 'disk I/O error: <detail>' for other OSErrors."""
    cause = root_cause(exc)
    if isinstance(cause, OSError):
        kind = "disk full" if cause.errno in _DISK_FULL_ERRNOS else "disk I/O error"
        return f"{kind}: {cause.strerror or cause}"
    return f"store write failed: {exc}"


def free_bytes(directory: Path) -> int:
    """Bytes an unprivileged writer may still use on directory's file system."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


StateListener = Callable[[WriteState, str], None]


class WriteGuard:
    """The store's writability (see the module docstring); all methods run on the loop thread."""

    def __init__(
        self,
        *,
        settings: GuardSettings,
        free_bytes: Callable[[], int],
        repair: Callable[[], Awaitable[None]],
    ) -> None:
        self._settings = settings
        self._free_bytes = free_bytes
        self._repair = repair
        self._state = WriteState.WRITABLE
        self._reason = ""
        self._tripped = asyncio.Event()
        self._listeners: list[StateListener] = []
        self._task: asyncio.Task[None] | None = None

    @property
    def state(self) -> WriteState:
        return self._state

    @property
    def reason(self) -> str:
        """Why writes are refused ('' while WRITABLE)."""
        return self._reason

    def add_listener(self, listener: StateListener) -> None:
        """listener(state, reason) after every transition, on the loop thread."""
        self._listeners.append(listener)

    def check(self) -> None:
        """Raise refusal() while writes are refused."""
        if self._state is WriteState.NOT_WRITABLE:
            raise self.refusal()

    def refusal(self) -> StoreError:
        """The StoreError (UNAVAILABLE on the wire) a put gets while writes are refused."""
        return StoreError(f"{self._reason}; the message store accepts writes again by itself once the "
                          "disk has room, retry later")

    def trip(self, exc: BaseException) -> None:
        """A write or flush failed: refuse writes until the probe succeeds."""
        if self._state is WriteState.NOT_WRITABLE:
            return
        self._reason = describe(exc)
        log.error("message store not writable: %s; refusing writes until the probe succeeds", self._reason,
                  event="store_not_writable", reason=self._reason, error=str(exc))
        self._transition(WriteState.NOT_WRITABLE)
        self._tripped.set()

    def _transition(self, state: WriteState) -> None:
        self._state = state
        for listener in self._listeners:
            try:
                listener(state, self._reason)
            except Exception:
                log.exception("write state listener %r failed", listener)

    # -- the probe -----------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="store-write-probe")

    async def stop(self) -> None:
        """Cancel and await the probe; the state stays as it is (shutdown decides what to do)."""
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def probe(self) -> bool:
        """One probe: True when writes were given back (or never taken away)."""
        if self._state is WriteState.WRITABLE:
            return True
        try:
            free = self._free_bytes()
            if free < self._settings.resume_free_bytes:
                log.debug("write probe: %d bytes free, want %d", free, self._settings.resume_free_bytes)
                return False
            await self._repair()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # same episode: no new line, the next probe tries again
            log.debug("write probe: repair failed: %s", exc)
            return False
        log.info("message store writable again (%s was resolved, %d bytes free)", self._reason, free,
                 event="store_writable", free_bytes=free)
        self._reason = ""
        self._transition(WriteState.WRITABLE)
        return True

    async def _run(self) -> None:
        while True:
            await self._tripped.wait()
            await asyncio.sleep(self._settings.probe_interval_s)
            if await self.probe():
                self._tripped.clear()
