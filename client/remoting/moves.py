"""MasterMoves: who hears that another address serves a broker name now, and calls given up when it does.

A BrokerCluster tells its `moves` whenever the address serving a broker name
changes (an elected or promoted master, a replica standing in per the name
servers), however it learnt it: a look after a failed call (`suspect`), a route
or cluster refresh. Parts of a client that keep something at the old address
listen (a consumer's fetch streams and group membership move at once), and
calls that would otherwise wait out their timeout on a paused master are given
up (`until`): nothing waits for a periodic refresh to find the new master.
Confined to the client's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tidemark.client.errors import UnavailableError

T = TypeVar("T")

Listener = Callable[[str, str], None]  # (broker name, the address serving it now)


class MasterMoves:
    def __init__(self) -> None:
        self._listeners: list[Listener] = []

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call listener(broker_name, address) on the event loop at every move; returns what stops it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def tell(self, broker_name: str, address: str) -> None:
        """`address` serves `broker_name` now."""
        for listener in list(self._listeners):
            listener(broker_name, address)

    def clear(self) -> None:
        self._listeners.clear()

    async def until(self, broker_name: str, call: Awaitable[T]) -> T:
        """`call` to the broker serving broker_name, given up (a retriable UnavailableError) as soon as
        another address serves the name: a call standing on a paused master waits out its whole timeout,
        and holds up whatever waits for it (a rebalance pass, every change of a consumer's queues)."""
        moved: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        stop = self.listen(lambda name, address: None if name != broker_name or moved.done()
                           else moved.set_result(address))
        task = asyncio.ensure_future(call)
        # Read by task.result() below, unless the caller is cancelled first (a consumer shutting down):
        # the call's error then has nobody to go to, and must not be reported as never retrieved.
        task.add_done_callback(_retrieved)
        try:
            await asyncio.wait((task, moved), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop()
            if not task.done():
                task.cancel()
                await asyncio.wait((task,))
        if task.cancelled() and moved.done():
            raise UnavailableError(f"the master of {broker_name} moved to {moved.result()} during the call")
        return task.result()


def _retrieved(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()
