"""BlockingClient's lifecycle when shutdown() comes (on another thread) while start() runs: the start gives
up, the client ends SHUTDOWN with its core stopped, and start() raises ClientStateError. The consumers'
cases, with a broker, are in tests/integration/test_consumer_connect.py; here the two a broker cannot time:
a shutdown() arriving after the start's coroutine finished, before start() saw the client RUNNING, and one
whose cancel reaches the loop before the start's coroutine ran at all."""

from __future__ import annotations

import asyncio
import threading

from tidemark.client.errors import ClientStateError
from tidemark.client.runtime import BlockingClient, ClientState, Lifecycle, LoopThread


class Client(BlockingClient):
    def __init__(self) -> None:
        self._loop = LoopThread("lifecycle-test")
        self._life = Lifecycle("test client")
        self.events: list[str] = []

    def start(self) -> Client:
        async def start() -> None:
            self.events.append("started")
        self._start_core(start, timeout=5)
        return self

    def shutdown(self) -> None:
        self._stop_core()

    def _core_stop(self):
        async def stop() -> None:
            self.events.append("stopped")
        return stop, 5


def test_a_shutdown_just_as_the_start_finished_stops_the_started_core(monkeypatch):
    client = Client()
    finished, go_on = threading.Event(), threading.Event()
    to = Lifecycle.to

    def held_before_running(life, new):  # start() waits here once its coroutine has finished
        if new is ClientState.RUNNING:
            finished.set()
            go_on.wait(10)
        to(life, new)
    monkeypatch.setattr(Lifecycle, "to", held_before_running)
    outcome: list[BaseException | None] = []

    def start() -> None:
        try:
            client.start()
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - the test looks at what it was
            outcome.append(e)
    starting = threading.Thread(target=start)
    starting.start()
    assert finished.wait(10)
    stopping = threading.Thread(target=client.shutdown)
    stopping.start()
    client._life.wait(ClientState.STOPPING)  # (shutdown's step, taken at once)
    go_on.set()
    starting.join(10)
    stopping.join(10)
    assert not stopping.is_alive() and client._life.state is ClientState.SHUTDOWN
    assert isinstance(outcome[0], ClientStateError) and "shut down while start() ran" in str(outcome[0])
    assert client.events == ["started", "stopped"] and not client._loop.running


def test_a_start_given_up_before_its_coroutine_ran_still_runs_its_cleanup(monkeypatch):
    """The shutdown's cancel reached the loop in the same turn as the start itself: the coroutine was
    cancelled before its first step, so its cleanup (a consumer's start closing what connect() opened)
    never ran."""
    events: list[str] = []

    class Cleaning(Client):
        def start(self) -> Client:
            async def start() -> None:
                try:
                    events.append("started")
                    await asyncio.Event().wait()
                finally:
                    events.append("cleaned up")
            self._start_core(start, timeout=5)
            return self

    client = Cleaning()
    client._loop.start()
    hold, held = threading.Event(), threading.Event()

    def busy() -> None:  # the loop is busy while both the start and its cancel reach it
        held.set()
        hold.wait(10)
    client._loop.loop.call_soon_threadsafe(busy)
    assert held.wait(5)
    registered = threading.Event()
    on_abort = Lifecycle.on_abort

    def told(life, abort):
        on_abort(life, abort)
        registered.set()
    monkeypatch.setattr(Lifecycle, "on_abort", told)
    outcome: list[BaseException] = []

    def start() -> None:
        try:
            client.start()
        except BaseException as e:  # noqa: BLE001 - the test looks at what it was
            outcome.append(e)
    starting = threading.Thread(target=start)
    starting.start()
    assert registered.wait(5)
    stopping = threading.Thread(target=client.shutdown)
    stopping.start()
    client._life.wait(ClientState.STOPPING)
    hold.set()
    starting.join(10)
    stopping.join(10)
    assert client._life.state is ClientState.SHUTDOWN and isinstance(outcome[0], ClientStateError)
    assert events == ["started", "cleaned up"]
