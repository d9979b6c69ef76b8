"""The Spark source's executor-side read (tidemark.spark_connector.fetch.fetch_range) rides through a broker outage
longer than pollTimeoutMs: it waits for the broker instead of failing the task."""

from __future__ import annotations

import logging
import threading

import pytest
from brokerproc import BrokerProcess
from workload import wait_until

from tidemark.client import Admin, Message, Producer
from tidemark.spark_connector.fetch import FetchSettings, fetch_range
from tidemark.spark_connector.offsets import OffsetRange


def test_a_stalled_read_keeps_waiting_while_no_broker_answers(monkeypatch):
    """Mid-read, the reader keeps reopening; when a poll timeout passes, the stall check cannot ask the
    broker for the queue's bounds either, and says: nothing decided, keep waiting (not a failed task)."""
    from tidemark.client.errors import TlsHandshakeError, UnavailableError
    from tidemark.client.message import MessageQueue
    from tidemark.spark_connector import fetch

    settings = FetchSettings(brokers="127.0.0.1:1", fail_on_data_loss=True, poll_timeout_s=1.0)
    rng = OffsetRange(MessageQueue("Outage", "broker-a", 0), 0, 100)
    monkeypatch.setattr(fetch, "_bounds", lambda s, mq: (_ for _ in ()).throw(UnavailableError("down")))
    assert fetch._stalled(settings, rng, 40) == 40
    monkeypatch.setattr(fetch, "_bounds", lambda s, mq: (_ for _ in ()).throw(TlsHandshakeError("untrusted")))
    with pytest.raises(TlsHandshakeError):  # waiting cannot fix a refused handshake
        fetch._stalled(settings, rng, 40)


def test_a_read_waits_for_a_broker_that_is_down_longer_than_the_poll_timeout(tmp_path):
    broker = BrokerProcess(tmp_path / "data").start()
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("Outage", 1)
        mq = admin.fetch_message_queues("Outage")[0]
    with Producer(brokers=broker.address) as producer:
        for i in range(50):
            producer.send(Message("Outage", b"m%d" % i), queue=mq)
    broker.kill()  # down before the task starts, and for several poll timeouts
    rows: list[int] = []
    failure: list[BaseException] = []

    def task() -> None:
        try:
            settings = FetchSettings(brokers=broker.address, fail_on_data_loss=True, poll_timeout_s=1.0)
            for batch in fetch_range(settings, OffsetRange(mq, 0, 50)):
                rows.extend(batch.column("queue_offset").to_pylist())
        except BaseException as e:  # the task's outcome, checked below
            failure.append(e)

    waits = _Events("fetch_broker_unreachable")
    logging.getLogger("tidemark.spark").addHandler(waits)
    reader = threading.Thread(target=task)
    reader.start()
    try:
        wait_until(lambda: waits.count >= 3, 60, "three poll timeouts spent waiting for the broker")
        assert reader.is_alive() and not failure  # the task did not fail
        broker.start()
        reader.join(60)
    finally:
        logging.getLogger("tidemark.spark").removeHandler(waits)
        broker.kill()
    assert not reader.is_alive() and failure == []
    assert rows == list(range(50))



class _Events(logging.Handler):
    """Counts the log records of one event (tidemark.common.logs keeps the event name on the record)."""

    def __init__(self, event: str) -> None:
        super().__init__(logging.DEBUG)
        self.event = event
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "tm_event", None) == self.event:
            self.count += 1
