"""PullRequestHoldService: pulls that reach the end of a queue wait here for new messages.

The store calls notify() after every dispatch; a waiting pull wakes as soon as
its queue grows past the offset it asked for, or when its suspend timeout ends.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable


class PullRequestHoldService:
    def __init__(self) -> None:
        self._waiters: defaultdict[tuple[str, int], set[asyncio.Future[None]]] = defaultdict(set)
        self._closed = False

    def notify(self, topic: str, queue_id: int, max_offset: int) -> None:
        waiters = self._waiters.pop((topic, queue_id), None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

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
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            return False
        finally:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(fut)
                if not waiters:
                    del self._waiters[key]
        return not self._closed and max_offset() > offset

    def waiting(self) -> int:
        return sum(len(w) for w in self._waiters.values())

    def close(self) -> None:
        """Release every waiting pull (broker shutdown)."""
        self._closed = True
        for waiters in self._waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        self._waiters.clear()
