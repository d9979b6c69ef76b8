"""The broker's use of glibc's allocator: buffers reused while it serves, memory given back after a burst.

A broker's memory at rest is small, but a burst of requests near
`max_request_bytes` leaves freed buffers inside the allocator's heaps, where
they count as the process's memory until reused. Three settings decide what
happens to a freed buffer (`configure`):

- Buffers up to the default largest request (`MMAP_THRESHOLD_BYTES`: a
  4 MiB message plus its framing) come from the heap and are reused. Served
  from mmap, each one is a fresh mapping that faults in every 4 KiB page on
  its first write and is unmapped when freed: a fetch frame of 256 KiB and a
  little more paid 64 page faults, a munmap and a mapping at every frame, and
  the broker spent half its CPU of a large read on them (docs/benchmarks.md,
  "Reads, fifth pass").
- Larger ones (a flood of over-sized requests) still come from mmap and go
  back to the OS when freed.
- The heap keeps up to `TRIM_THRESHOLD_BYTES` free at its top instead of
  glibc's default 128 KiB, so a frame freed at the top is not given back
  and faulted in again by the next.

After a burst the request intake calls `Trimmer.burst_over`, which runs
`malloc_trim(0)` in a thread (at most every few seconds) and gives back the
free pages the heap still holds. Setting the thresholds turns off glibc's
own moving threshold, which would keep a burst's large blocks in the heap.
All of it is a no-op where glibc is not the allocator.
"""

from __future__ import annotations

import asyncio
import ctypes
import time

from tidemark.broker.config import REQUEST_OVERHEAD_BYTES
from tidemark.common.logs import get_logger
from tidemark.common.protocol import DEFAULT_MAX_MESSAGE_SIZE
from tidemark.common.scheduler import cancel_and_wait

log = get_logger("tidemark.broker")

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD_BYTES = DEFAULT_MAX_MESSAGE_SIZE + REQUEST_OVERHEAD_BYTES  # the default largest request
TRIM_THRESHOLD_BYTES = 4 * 1024 * 1024
TRIM_INTERVAL_S = 2.0


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def configure() -> None:
    """Reuse buffers up to a request's size from the heap, serve larger ones from mmap (module doc)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)


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
