"""One broker per data dir, and a memory bound under a flood of large requests (real broker processes)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from brokerproc import BrokerProcess, BrokerStubs, free_port
from workload import wait_until

from bench.memory_flood import flood, status_kib
from tidemark.client import Admin, InvalidArgumentError, Message, Producer
from tidemark.v1 import admin_pb2, common_pb2, messaging_pb2

MiB = 1024 * 1024


def _files(data_dir: Path) -> dict[str, str]:
    """Every file of a data dir with its content hash, but the checkpoint: the running broker's own flush
    timer rewrites it (CI at 0b9145e saw it change while the second broker was refused)."""
    return {str(p.relative_to(data_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(data_dir.rglob("*")) if p.is_file() and p.name != "checkpoint"}


def test_a_second_broker_on_the_same_data_dir_exits_at_once_naming_the_holder(tmp_path):
    first = BrokerProcess(tmp_path / "data").start()
    try:
        with BrokerStubs(first.address) as stubs:
            stubs.admin.CreateTopic(admin_pb2.CreateTopicRequest(name="kept", queue_nums=2))
            stubs.messaging.SendMessage(messaging_pb2.SendMessageRequest(
                topic="kept", queue_id=0, messages=[common_pb2.Message(body=b"one")]))
        before = _files(tmp_path / "data")
        second = subprocess.run(
            [sys.executable, "-m", "tidemark.broker.app", "--data-dir", str(tmp_path / "data"), "--port", str(free_port()),
             "--broker-name", "broker-a"], capture_output=True, text=True, timeout=60)
        assert second.returncode == 1
        lines = second.stderr.strip().splitlines()
        assert lines[-1] == (f"tidemark broker: data dir {tmp_path / 'data'} is in use by another broker "
                             f"(pid {first.proc.pid}); stop it or give this broker its own --data-dir")
        assert "Traceback" not in second.stderr
        assert _files(tmp_path / "data") == before  # topics.json, offsets and the log untouched
        with BrokerStubs(first.address) as stubs:
            topics = stubs.admin.ListTopics(admin_pb2.ListTopicsRequest()).topics
            assert [t.name for t in topics] == ["kept"]
    finally:
        first.kill()
    # kill -9 leaves no stale lock: the kernel dropped it with the process.
    BrokerProcess(tmp_path / "data", port=first.port).start().stop()


# Peak anonymous memory the broker may reach under the flood below, above its memory at rest. The
# default limits (max_request_bytes = max_message_size + 64 KiB, 64 MiB of request bytes in flight)
# keep it near 150 MiB on this machine; before them it was over 1.2 GiB (docs/benchmarks.md).
FLOOD_BOUND_MIB = 320


def test_memory_stays_bounded_under_a_flood_of_large_requests_and_returns_after(tmp_path):
    broker = BrokerProcess(tmp_path / "data").start()
    pid = broker.proc.pid
    try:
        with BrokerStubs(broker.address) as stubs:
            stubs.admin.CreateTopic(admin_pb2.CreateTopicRequest(name="flood", queue_nums=4))
        at_rest = status_kib(pid, "RssAnon")
        # 6 threads send 60 MiB batches (far too large), 8 single 5 MiB messages (just too large),
        # 12 batches of 3.9 MiB (at the limit), all at once.
        codes = flood(broker.address)
        peak = status_kib(pid, "VmHWM") - status_kib(pid, "RssFile")
        assert codes.get("OK", 0) > 0 and codes.get("RESOURCE_EXHAUSTED", 0) >= 6 * 2 + 8 * 5, codes
        assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, codes
        assert (peak - at_rest) / 1024 < FLOOD_BOUND_MIB, (peak, at_rest)
        # The burst's buffers go back: the broker settles near where it started.
        wait_until(lambda: (status_kib(pid, "RssAnon") - at_rest) / 1024 < 128, 20,
                   "broker memory back within 128 MiB of its memory at rest")
        assert "Traceback" not in broker.log_text()
    finally:
        broker.stop()


def test_batches_stay_within_max_message_size_and_oversize_requests_are_not_retried(broker):
    """RocketMQ's rule: a batch is at most max_message_size. The producer refuses a larger send_batch at
    once, splits async batches before they pass it, and a request over the broker's max_request_bytes
    fails with InvalidArgumentError rather than being retried as an overload."""
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("Big", 1)
    body = b"b" * (900 * 1024)
    # A batch_size above the limit and a long linger: only the limit can close these batches early.
    with Producer(brokers=broker.address, batch_size=64 * MiB, linger_ms=60_000) as producer:
        with pytest.raises(InvalidArgumentError, match="a batch of 5 messages is .* at most max_message_size"):
            producer.send_batch([Message("Big", body) for _ in range(5)])
        futures = [producer.send_async(Message("Big", body)) for _ in range(12)]
        offsets = sorted(f.result(30).queue_offset for f in futures[:8])
        assert offsets == list(range(8))  # two full batches of 4 went without waiting for the linger
    with Producer(brokers=broker.address, max_message_size=8 * MiB) as lenient:  # a client that thinks bigger
        with pytest.raises(InvalidArgumentError, match="larger than max"):
            lenient.send(Message("Big", b"x" * (5 * MiB)))
