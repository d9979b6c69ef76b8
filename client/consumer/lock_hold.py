"""LockHold: how long a consumer may count on a queue's broker lock without hearing from the broker.

The broker drops a lock it has not heard of for its lock expiry (60 s by
default; the grant says how long) and may then grant the queue to another
member of the group. A holder cut off from the broker (a partition, a long
pause of its process) cannot learn of that, and an orderly consumer would
go on calling its listener with the queue's buffered messages while the new
owner does the same, from the committed offset. So the holder counts the
lock as held only for half the expiry after it *sent* the request that the
broker answered with a grant or a renewal of the same ownership (RocketMQ's
client keeps a lock 30 s of the broker's 60, REBALANCE_LOCK_MAX_LIVE_TIME).
Counted from the sending, the holder's deadline comes before the broker's
whatever the request's delay, and a clock step cannot move it (monotonic).

    granted/renewed at t ──── held ────► t + expiry/2 ──── lapsed ──── ... t + expiry: the broker may re-grant
                                         (no new orderly batch starts;   (the holder stopped half an expiry
                                          a renewal is asked at once)     before)

A restarted broker keeps its locks (broker/membership/lock_file.py), and a
promoted replica its master's as copied a second before; a grant not on disk
or not copied yet is gone, and goes to whoever asks first. A holder whose
fetch stream to the broker breaks (a restart or a failover breaks every
connection) so stops counting on its locks there at once (`lapse`) until a
renewal confirms them: the lock kept, it goes on; gone, the queue is lost
and locked again.

`lapsed()` is read by consume threads right before they call an orderly
listener; everything else runs on the consumer's event loop. One hold
belongs to one OwnedQueue (one ownership): the leases of that ownership
share it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

# What a broker that does not tell its lock expiry (an older one) keeps a lock for: RocketMQ's and
# Tidemark's default.
DEFAULT_BROKER_LOCK_EXPIRY_MS = 60_000
# The share of the broker's expiry the holder counts on (RocketMQ: 30 s of 60).
HELD_SHARE = 0.5


class LockHold:
    __slots__ = ("valid_until", "_clock", "_changed")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.valid_until = float("-inf")  # on `clock`; nothing granted yet
        self._clock = clock
        self._changed: asyncio.Event | None = None

    def confirm(self, sent_at: float, expiry_ms: int) -> None:
        """The broker granted or renewed the lock in answer to a request sent at `sent_at` (on this hold's
        clock); `expiry_ms` is what the grant said (0: not said). An answer to an earlier request never
        shortens what a later one confirmed."""
        held_s = (expiry_ms if expiry_ms > 0 else DEFAULT_BROKER_LOCK_EXPIRY_MS) * HELD_SHARE / 1000
        self.valid_until = max(self.valid_until, sent_at + held_s)
        self.wake()

    def lapse(self) -> None:
        """Count on nothing until the broker confirms the lock again (it may have restarted and forgotten it)."""
        self.valid_until = float("-inf")

    def lapsed(self) -> bool:
        """Whether the broker may have let the lock go by now (half its expiry since it last confirmed it)."""
        return self._clock() >= self.valid_until

    def wake(self) -> None:
        """Wake whoever waits (`changed`): the lock was confirmed, or its queue is leaving."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def changed(self, timeout_s: float) -> None:
        """Until the next `wake()` (a confirmation, the queue leaving), or `timeout_s` at most."""
        if self._changed is None:
            self._changed = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._changed.wait()
