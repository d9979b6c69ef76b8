"""QueueWaiters: who waits for a queue to change, and waking them when it does (RocketMQ's
PullRequestHoldService, which is only the first kind).

Two kinds of waiters: a unary pull that reached the end of its queue (held
until a message arrives or its suspend timeout ends, RocketMQ's long polling)
and a fetch stream that serves the queue (a watcher callback, called on every
change for as long as the stream has the queue open). The store calls
notify() after every append; offset resets and lock hand-overs notify too, so
a stream re-checks the queue's owner and reset generation at once.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable

QueueKey = tuple[str, int]


class QueueWaiters:
    def __init__(self) -> None:
        self._waiters: defaultdict[QueueKey, set[asyncio.Future[None]]] = defaultdict(set)
        self._watchers: dict[QueueKey, dict[int, Callable[[], None]]] = {}
        self._next_watch = 0
        self._closed = False

    def notify(self, topic: str, queue_id: int) -> None:
        key = (topic, queue_id)
        waiters = self._waiters.pop(key, None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        watchers = self._watchers.get(key)
        if watchers:
            for callback in list(watchers.values()):
                callback()

    def notify_all(self) -> None:
        """Every queue may have changed (readers of a sync master were bounded for the first time)."""
        for topic, queue_id in {*self._waiters, *self._watchers}:
            self.notify(topic, queue_id)

    def watch(self, topic: str, queue_id: int, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` (on the loop thread) whenever the queue changes; returns the unwatch function."""
        key = (topic, queue_id)
        self._next_watch += 1
        token = self._next_watch
        self._watchers.setdefault(key, {})[token] = callback

        def unwatch() -> None:
            watchers = self._watchers.get(key)
            if watchers is not None:
                watchers.pop(token, None)
                if not watchers:
                    del self._watchers[key]

        return unwatch

    async def wait(self, topic: str, queue_id: int, offset: int, timeout_s: float,
                   max_offset: Callable[[], int]) -> bool:
        """Wait until the queue's max offset exceeds `offset`; False on timeout or shutdown."""
        if max_offset() > offset:
            return True
        if self._closed or timeout_s <= 0:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        key = (topic, queue_id)
        self._waiters[key].add(fut)
        try:
            async with asyncio.timeout(timeout_s):
                while not self._closed and max_offset() <= offset:
                    await fut
                    fut = asyncio.get_running_loop().create_future()
                    self._waiters[key].add(fut)
        except TimeoutError:
            return False
        finally:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(fut)
                if not waiters:
                    del self._waiters[key]
        return not self._closed and max_offset() > offset

    async def wait_any(self, keys: list[QueueKey], timeout_s: float) -> bool:
        """Wait until any of these queues is notified (a message, a reset, a lock released); False on timeout."""
        if self._closed or timeout_s <= 0 or not keys:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for key in keys:
            self._waiters[key].add(fut)
        try:
            async with asyncio.timeout(timeout_s):
                await fut
            return not self._closed
        except TimeoutError:
            return False
        finally:
            for key in keys:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(fut)
                    if not waiters:
                        del self._waiters[key]

    def waiting(self) -> int:
        return sum(len(w) for w in self._waiters.values())

    def watching(self) -> int:
        return sum(len(w) for w in self._watchers.values())

    def close(self) -> None:
        """Release every waiting pull (broker shutdown)."""
        self._closed = True
        for waiters in self._waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        self._waiters.clear()
