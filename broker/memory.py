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

Buffers freed inside the heap stay the process's memory until reused, so
after a burst `malloc_trim(0)` gives back the free pages the heap still holds
(`Trimmer`, in a thread, at most every few seconds): after a burst of large
requests, when the request intake has none left (`burst_over`), and after a
burst of large answers (fetch frames: `answered`), once answers have been
quiet for a few seconds. A read that goes on is not trimmed under its feet
(its frames would fault their pages in again); one that ends gives back what
its streams held at their peak. Setting the thresholds turns off glibc's
own moving threshold, which would keep a burst's large blocks in the heap.
All of it is a no-op where glibc is not the allocator.
"""

from __future__ import annotations

import asyncio
import ctypes
import time
from collections.abc import Callable

from tidemark.broker.config import REQUEST_OVERHEAD_BYTES
from tidemark.common.logs import get_logger
from tidemark.common.protocol import DEFAULT_MAX_MESSAGE_SIZE
from tidemark.common.scheduler import cancel_and_wait

log = get_logger("tidemark.broker")

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD_BYTES = DEFAULT_MAX_MESSAGE_SIZE + REQUEST_OVERHEAD_BYTES  # the default largest request
TRIM_THRESHOLD_BYTES = 4 * 1024 * 1024
TRIM_INTERVAL_S = 2.0
# This many bytes of answers make a burst, after which (once answers are quiet) freed memory is given back.
ANSWER_BURST_BYTES = 32 * 1024 * 1024


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

    def __init__(self, clock=time.monotonic, trim: Callable[[int], int] | None = None) -> None:
        libc = _libc()
        self._trim = trim or (getattr(libc, "malloc_trim", None) if libc is not None else None)
        self._clock = clock
        self._last = -TRIM_INTERVAL_S
        self._task: asyncio.Task | None = None
        self._answered = 0  # bytes of answers since the last trim
        self._last_answer = 0.0
        self._quiet: asyncio.Task | None = None  # waits for answers to be quiet, then trims
        self.trims = 0

    def answered(self, size: int) -> None:
        """Called on the event loop for every answer of `size` bytes sent (a fetch frame): after
        ANSWER_BURST_BYTES of them, a trim once no answer was sent for TRIM_INTERVAL_S."""
        if self._trim is None:
            return
        self._answered += size
        self._last_answer = self._clock()
        if self._answered >= ANSWER_BURST_BYTES and (self._quiet is None or self._quiet.done()):
            self._quiet = asyncio.get_running_loop().create_task(self._when_quiet(), name="malloc-trim-answers")

    async def _when_quiet(self) -> None:
        while (wait := self._last_answer + TRIM_INTERVAL_S - self._clock()) > 0:
            await asyncio.sleep(wait)
        self._answered = 0
        self.burst_over()

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
        await cancel_and_wait(self._quiet)
        await cancel_and_wait(self._task)
