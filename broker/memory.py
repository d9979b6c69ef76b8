"""Giving memory back after a burst of large requests (glibc's allocator).

A broker's memory at rest is small, but a burst of requests near
`max_request_bytes` leaves freed buffers inside the allocator's heaps, where
they count as the process's memory until reused. Two things return them:
buffers of 256 KiB and more are served from mmap (`configure`), so each one
goes back to the OS when freed, and after a burst the request intake calls
`Trimmer.burst_over`, which runs `malloc_trim(0)` in a thread (at most every
few seconds) to release the free pages of smaller blocks. Both are no-ops
where glibc is not the allocator.
"""

from __future__ import annotations

import asyncio
import ctypes
import time

from tidemark.common.logs import get_logger
from tidemark.common.scheduler import cancel_and_wait

log = get_logger("tidemark.broker")

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD_BYTES = 256 * 1024
TRIM_INTERVAL_S = 2.0


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def configure() -> None:
    """Serve large buffers from mmap (glibc would otherwise raise its threshold as big blocks are freed
    and keep them in the heap)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


class Trimmer:
    """Runs malloc_trim(0) off the event loop after a burst, at most once per TRIM_INTERVAL_S."""

    def __init__(self, clock=time.monotonic) -> None:
        libc = _libc()
        self._trim = getattr(libc, "malloc_trim", None) if libc is not None else None
        self._clock = clock
        self._last = -TRIM_INTERVAL_S
        self._task: asyncio.Task | None = None
        self.trims = 0

    def burst_over(self) -> None:
        """Called on the event loop when the requests of a burst are all done."""
        if self._trim is None or (self._task is not None and not self._task.done()):
            return
        delay = max(0.0, self._last + TRIM_INTERVAL_S - self._clock())
        self._task = asyncio.get_running_loop().create_task(self._run(delay), name="malloc-trim")

    async def _run(self, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        self._last = self._clock()
        released = await asyncio.to_thread(self._trim, 0)
        self.trims += 1
        log.debug("memory trimmed after a burst", event="malloc_trim", released=bool(released))

    async def close(self) -> None:
        await cancel_and_wait(self._task)
