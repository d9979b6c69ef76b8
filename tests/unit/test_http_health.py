"""/healthz (broker/server.py `_http_health`, answered on the metrics thread): unhealthy while starting or
stopping, while a part cannot write, and while the event loop that serves every request is stuck."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

from tidemark.broker import server
from tidemark.broker.server import BrokerServer


def broker_with(loop: asyncio.AbstractEventLoop, *, serving: bool = True, failing: dict | None = None):
    persistence = SimpleNamespace(failing_parts=lambda: dict(failing or {}))
    return SimpleNamespace(_serving=serving, _loop=loop, controller=SimpleNamespace(persistence=persistence))


def running_loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    return loop, thread


def test_healthy_only_when_serving_writable_and_the_loop_answers(monkeypatch):
    monkeypatch.setattr(server, "HEALTH_LOOP_TIMEOUT_S", 0.3)
    loop, thread = running_loop()
    try:
        assert BrokerServer._http_health(broker_with(loop)) == (True, "")
        assert BrokerServer._http_health(broker_with(loop, serving=False)) == (False, "starting or stopping")
        assert BrokerServer._http_health(broker_with(loop, failing={"store": "disk full"})) == (
            False, "store: disk full")
        release = threading.Event()
        loop.call_soon_threadsafe(lambda: release.wait(5))  # a callback that blocks the loop
        time.sleep(0.05)
        ok, why = BrokerServer._http_health(broker_with(loop))
        assert not ok and "event loop did not answer" in why
        release.set()
        assert BrokerServer._http_health(broker_with(loop)) == (True, "")  # answers again
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
    assert BrokerServer._http_health(broker_with(loop)) == (False, "starting or stopping")  # closed loop
