"""A consumer's start against a broker address that accepts connections and never answers (a hung process,
a black-holing proxy): start() fails after one request timeout, having asked the broker once for its
name, and does not try to leave a group it never joined."""

from __future__ import annotations

import socket
import threading

import pytest

from tidemark.client import ConsumeConcurrentlyStatus, PushConsumer
from tidemark.client.errors import TidemarkError
from tidemark.client.remoting import connection as connection_module


@pytest.fixture
def black_hole():
    """An address that accepts TCP connections and never says a word."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(server.accept()[0])
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for conn in accepted:
        conn.close()


def test_a_start_against_a_broker_that_never_answers_asks_once_and_does_not_leave(black_hole, monkeypatch):
    """Review of the join changes: the start's three steps each discovered in turn behind the cluster lock
    (three request timeouts), then leaving the group discovered a fourth time, though no heartbeat had
    gone out."""
    calls = {"broker_info": 0, "unregister": 0}
    for name in calls:
        original = getattr(connection_module.BrokerConnection, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(connection_module.BrokerConnection, name, counted)
    consumer = PushConsumer(group="g1", brokers=black_hole, request_timeout_s=0.3)
    consumer.subscribe("T")
    consumer.register_message_listener(lambda msgs, ctx: ConsumeConcurrentlyStatus.CONSUME_SUCCESS)
    with pytest.raises(TidemarkError):
        consumer.start()
    assert calls == {"broker_info": 1, "unregister": 0}
