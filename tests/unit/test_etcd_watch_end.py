"""A task that ends its etcd watch in a `finally` ends even when the watch's cancellation never answers
(broker/cluster/etcd_members.py end_watch). aetcd's Watch.cancel() can wait for ever once the watch's
member was left behind: a controller-mode master stopping on SIGTERM waited there until it was killed 30 s
later, and nobody took over meanwhile (the fault checker's controller scenario)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

from tidemark.broker.cluster.election import Election
from tidemark.broker.cluster.switchover import Switchover
from tidemark.common.scheduler import cancel_and_wait


class StuckWatch:
    """A watch of a member left behind: no event comes, and cancelling it never returns."""

    def __init__(self) -> None:
        self.cancels = 0

    def __aiter__(self):
        return self

    async def __anext__(self):
        await asyncio.Event().wait()

    async def cancel(self) -> None:
        self.cancels += 1
        await asyncio.Event().wait()


class Client:
    """The two calls a switchover watch makes."""

    def __init__(self) -> None:
        self.watches: list[StuckWatch] = []

    async def watch(self, key: bytes) -> StuckWatch:
        self.watches.append(StuckWatch())
        return self.watches[-1]

    async def get(self, key: bytes) -> None:
        return None


def ends_within(seconds: float, scenario: Callable[[], Awaitable[None]]) -> None:
    """Run the scenario on a loop of its own thread: one that hangs fails the test instead of hanging it
    (cancel_and_wait, like a stopping broker, waits for its tasks however it is cancelled)."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(scenario())
        except BaseException as e:  # handed to the test's thread
            failure.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s for a watch's cancellation"
    if failure:
        raise failure[0]


def test_a_master_s_switchover_watch_ends_when_cancelled_though_its_watch_never_cancels():
    async def scenario() -> None:
        client = Client()
        election = Election(client, "DefaultCluster", "broker-a", 1, "127.0.0.1:1", ttl_s=2)
        switchover = Switchover(client, election, timeout_s=5)
        task = asyncio.get_running_loop().create_task(switchover.serve(object(), lambda why: None))
        while not client.watches:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # waiting for a request now
        await cancel_and_wait(task)  # (before: for ever)
        assert task.cancelled() and client.watches[0].cancels == 1

    ends_within(10, scenario)


def test_a_replica_s_watch_of_the_master_key_ends_when_closed_though_its_watch_never_cancels():
    async def scenario() -> None:
        client = Client()
        election = Election(client, "DefaultCluster", "broker-a", 1, "127.0.0.1:1", ttl_s=2)

        async def view():
            return type("View", (), {"master": None})()

        election.view = view
        masters = election.watch()
        assert await anext(masters) is None
        await masters.aclose()  # (before: for ever)
        assert client.watches[0].cancels == 1

    ends_within(10, scenario)
