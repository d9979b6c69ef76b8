"""The official RocketMQ 5 Python client (`rocketmq-python-client`) against a real Tidemark broker.

The client is imported once per session with HOME pointing at a temporary
directory: at import it creates ~/logs/rocketmq_python/ and logs there. Its
clients run threads and an event loop of their own; every test shuts down
what it starts (`official` closes them even when the test fails).
"""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def rmq(tmp_path_factory):
    """The `rocketmq` package, its log under a temporary HOME (rocketmq_client.log, for a failing test)."""
    home = tmp_path_factory.mktemp("rmq-home")
    before = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    try:
        module = importlib.import_module("rocketmq")
    finally:
        if before is None:
            del os.environ["HOME"]
        else:
            os.environ["HOME"] = before
    module.log_path = Path(home) / "logs" / "rocketmq_python" / "rocketmq_client.log"
    return module


@pytest.fixture
def official(rmq) -> Iterator:
    """Start official clients through `official(client)`; they are shut down after the test.

    The official client opens its telemetry stream from the thread that starts it with grpc.aio, which
    needs that thread's current event loop; after any asyncio.run() in the same thread (an earlier test
    on this pytest worker) there is none, and start-up fails with "failed to receive initial settings".
    Each test gets one (an application calling asyncio.run() first needs the same)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    started = []

    def start(client):
        client.startup()
        started.append(client)
        return client

    yield start
    for client in reversed(started):
        try:
            client.shutdown()
        except Exception:  # a client whose start-up failed half-way may not shut down cleanly
            pass
    asyncio.set_event_loop(None)
    loop.close()
