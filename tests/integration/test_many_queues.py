"""16,000 consume queues under `ulimit -n 1024`: a real broker process starts, serves sends and pulls
on queues spread over all topics (more than its open-file cache holds), keeps its fds under the
cap, and recovers after kill -9 under the same cap.

The data dir (2,000 topics x 8 queues, one message each) is written in-process through the store
API (bench.many_queues.populate), which is much faster than 16,000 sends over gRPC.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from brokerproc import BrokerProcess, BrokerStubs
from grpc_health.v1 import health_pb2

from bench.many_queues import populate, topic_name
from tidemark.v1 import common_pb2, messaging_pb2, offsets_pb2

TOPICS, QUEUES_PER_TOPIC = 2000, 8
NOFILE = 1024
CACHE = 512  # the default max_open_consume_queue_files
TOUCHED = 640  # queues sent to and pulled from: more than the cache holds
TIMEOUT = 15

_LIMITED = ("import os, resource, sys; n = int(sys.argv[1]); "
            "resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)); os.execv(sys.argv[2], sys.argv[2:])")


class LimitedBroker(BrokerProcess):
    """A broker whose RLIMIT_NOFILE is set just before exec (no preexec_fn in a process with gRPC threads)."""

    def command(self) -> list[str]:
        return [sys.executable, "-c", _LIMITED, str(NOFILE), *super().command()]


def fds(pid: int) -> list[str]:
    paths = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            paths.append(os.readlink(f"/proc/{pid}/fd/{name}"))
        except FileNotFoundError:
            pass
    return paths


def check_fds(broker: BrokerProcess) -> None:
    pid = broker.proc.pid  # the launchers exec, so this is the broker itself
    limits = open(f"/proc/{pid}/limits").read()
    assert any(line.startswith("Max open files") and line.split()[3:5] == [str(NOFILE)] * 2
               for line in limits.splitlines()), limits
    held = fds(pid)
    assert len(held) < NOFILE
    # The cache's fds, plus at most one the flush thread holds while it fsyncs.
    assert sum("/consumequeue/" in p for p in held) <= CACHE + 1


def touched_queues() -> list[tuple[str, int]]:
    return [(topic_name(i * TOPICS // TOUCHED), i % QUEUES_PER_TOPIC) for i in range(TOUCHED)]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("many-queues") / "data"
    with pytest.MonkeyPatch.context() as patch:
        # Scratch data: fsyncing 16,000 new files proves nothing here and costs tens of seconds
        # on a busy disk. The broker under test fsyncs for real.
        patch.setattr(os, "fsync", lambda fd: None)
        populate(data, topics=TOPICS, queues_per_topic=QUEUES_PER_TOPIC)
    assert sum(1 for _ in (data / "consumequeue").iterdir()) == TOPICS
    return data


def test_16000_queues_start_serve_and_recover_under_ulimit_1024(data_dir):
    broker = LimitedBroker(data_dir)
    try:
        broker.start(timeout=60)
        check_fds(broker)
        with BrokerStubs(broker.address) as api:
            health = api.health.Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            for topic, queue_id in touched_queues():
                sent = api.messaging.SendMessage(messaging_pb2.SendMessageRequest(
                    topic=topic, queue_id=queue_id, messages=[common_pb2.Message(body=b"second")]),
                    timeout=TIMEOUT)
                assert sent.results[0].queue_offset == 1
            # Pull in the same order: the first queues' files were evicted since their send.
            for topic, queue_id in touched_queues():
                pulled = api.messaging.PullMessage(messaging_pb2.PullMessageRequest(
                    topic=topic, queue_id=queue_id, queue_offset=0, max_msg_nums=8), timeout=TIMEOUT)
                assert [m.body for m in pulled.messages] == [f"{topic}/{queue_id}".encode(), b"second"]
            untouched = api.offsets.GetMaxOffset(offsets_pb2.QueueRequest(
                topic=topic_name(1), queue_id=3), timeout=TIMEOUT)
            assert untouched.offset == 1
        check_fds(broker)

        broker.kill()  # kill -9: recovery replays the sends under the same cap
        broker.start(timeout=60)
        check_fds(broker)
        with BrokerStubs(broker.address) as api:
            for topic, queue_id in touched_queues()[::37]:
                pulled = api.messaging.PullMessage(messaging_pb2.PullMessageRequest(
                    topic=topic, queue_id=queue_id, queue_offset=1, max_msg_nums=8), timeout=TIMEOUT)
                assert [m.body for m in pulled.messages] == [b"second"]
        assert "unclean" in broker.log_text() or "store_unclean" in broker.log_text()
    finally:
        broker.kill()
