"""A real broker on a full disk: refused writes, visible trouble, and recovery without a restart.

The broker's data dir is a tmpfs of 8 MiB (root only: `mount -t tmpfs`). A
filler file takes most of it and sends take the rest, until the broker
answers UNAVAILABLE. Then: health NOT_SERVING, the persistence metrics, topic
creation refused and not half-applied, a consumer offset commit refused too
(UNAVAILABLE, not applied) with the offsets' failing state visible. Deleting
the filler must bring writes back by themselves (no restart), with every
acknowledged message readable at its offset and commits accepted again, and a
restart after that must be clean. Every wait polls observable state against a
deadline.

This test used to assert that a commit on a full disk is "still committed in
memory" (RocketMQ's contract). That guarantee was stated wrong: such a commit
was acknowledged although the offset journal could not take it, so a kill -9
before the next snapshot lost it. A commit the journal cannot take is now
refused like a send and not applied (test_fault_defects_broker.py checks it on
every commit path, across a kill -9).
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from brokerproc import BrokerStubs, free_port
from grpc_health.v1 import health_pb2
from workload import scrape, wait_until

from tidemark.v1 import admin_pb2, common_pb2, messaging_pb2, offsets_pb2

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")

TIMEOUT = 15
DISK_BYTES = 8 * 1024 * 1024
BODY = b"d" * 900
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def small_disk(tmp_path: Path):
    """An 8 MiB tmpfs, unmounted after the test (request it before broker_factory: brokers die first)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(path: Path, leave: int) -> None:
    """Write zeros to `path` until at most `leave` bytes are free on its file system."""
    chunk = b"\0" * 65536
    with open(path, "wb") as f:
        while (free := os.statvfs(path.parent).f_bavail * os.statvfs(path.parent).f_frsize) > leave:
            try:
                f.write(chunk[: max(4096, min(len(chunk), free - leave))])
                f.flush()
            except OSError as e:
                assert e.errno == errno.ENOSPC
                return


class Api(BrokerStubs):
    def send(self, topic: str, queue_id: int, n: int, tag: str) -> list[tuple[int, bytes]]:
        bodies = [f"{tag}-{i}-".encode() + BODY for i in range(n)]
        resp = self.messaging.SendMessage(messaging_pb2.SendMessageRequest(
            topic=topic, queue_id=queue_id, messages=[common_pb2.Message(body=b) for b in bodies]), timeout=TIMEOUT)
        return [(r.queue_offset, b) for r, b in zip(resp.results, bodies, strict=True)]

    def health_status(self) -> int:
        return self.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT).status

    def topics(self) -> set[str]:
        return {t.name for t in self.admin.ListTopics(admin_pb2.ListTopicsRequest(), timeout=TIMEOUT).topics}

    def create_topic(self, name: str, queues: int = 1) -> None:
        self.admin.CreateTopic(admin_pb2.CreateTopicRequest(name=name, queue_nums=queues), timeout=TIMEOUT)

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.offsets.UpdateConsumerOffset(offsets_pb2.UpdateConsumerOffsetRequest(commit=offsets_pb2.OffsetCommit(
            group=group, topic=topic, queue_id=queue_id, offset=offset)), timeout=TIMEOUT)

    def query(self, group: str, topic: str, queue_id: int) -> int:
        return self.offsets.QueryConsumerOffset(offsets_pb2.QueryConsumerOffsetRequest(
            group=group, topic=topic, queue_id=queue_id), timeout=TIMEOUT).offset

    def read_all(self, topic: str, queue_id: int) -> list[tuple[int, bytes]]:
        out, offset = [], 0
        while True:
            resp = self.messaging.PullMessage(messaging_pb2.PullMessageRequest(
                topic=topic, queue_id=queue_id, queue_offset=offset, max_msg_nums=256), timeout=TIMEOUT)
            if resp.status != messaging_pb2.FOUND:
                assert resp.status == messaging_pb2.NO_NEW_MSG, resp
                return out
            out.extend((m.queue_offset, m.body) for m in resp.messages)
            offset = resp.next_begin_offset


def send_until_refused(api: Api, topic: str, queues: int) -> tuple[dict[int, list[tuple[int, bytes]]], grpc.RpcError]:
    """Send batches round-robin until the broker refuses one; the acknowledged messages per queue."""
    acked: dict[int, list[tuple[int, bytes]]] = {q: [] for q in range(queues)}
    deadline = time.monotonic() + 60
    i = 0
    while time.monotonic() < deadline:
        q = i % queues
        try:
            acked[q] += api.send(topic, q, 7, f"b{i}")
        except grpc.RpcError as e:
            return acked, e
        i += 1
    raise AssertionError("the disk never filled up")


def failing(metrics_port: int, part: str) -> float:
    return scrape(metrics_port).get(("tidemark_persistence_failing", (("part", part),)), -1.0)


def assert_all_readable(api: Api, topic: str, acked: dict[int, list[tuple[int, bytes]]]) -> None:
    for q, mine in acked.items():
        assert [o for o, _ in mine] == list(range(len(mine))), f"queue {q}: offsets are not consecutive"
        assert api.read_all(topic, q) == mine, f"queue {q}: stored messages differ from the acknowledged ones"


def test_a_full_disk_refuses_writes_visibly_and_they_resume_by_themselves_when_space_returns(
    small_disk, broker_factory
):
    metrics_port = free_port()
    broker = broker_factory(data_dir=small_disk, args=(
        "--flush", "sync", "--commitlog-segment-size", str(1024 * 1024), "--metrics-port", str(metrics_port),
        "--flush-consumer-offset-interval-ms", "200"))
    filler = small_disk / "filler"
    topic, queues = "full", 2
    with Api(broker.address) as api:
        api.create_topic(topic, queues)
        api.commit("watchers", topic, 0, 0)  # the group's config exists before the disk fills
        assert api.health_status() == SERVING and failing(metrics_port, "store") == 0

        fill(filler, leave=600 * 1024)
        acked, refused = send_until_refused(api, topic, queues)
        assert sum(map(len, acked.values())) > 0
        assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused
        assert "disk full" in refused.details() and "retry later" in refused.details(), refused.details()
        wait_until(lambda: api.health_status() == NOT_SERVING, TIMEOUT, "health NOT_SERVING")
        assert failing(metrics_port, "store") == 1

        # Refused again, for the same reason, without a restart in between.
        with pytest.raises(grpc.RpcError) as again:
            api.send(topic, 1, 1, "again")
        assert again.value.code() == grpc.StatusCode.UNAVAILABLE and "disk full" in again.value.details()
        # topics.json cannot take the new topic: UNAVAILABLE, and the topic does not half-exist.
        fill(small_disk / "filler-2", leave=0)  # the cut-back batch gave a few pages back
        with pytest.raises(grpc.RpcError) as create:
            api.create_topic("later")
        assert create.value.code() == grpc.StatusCode.UNAVAILABLE, create.value
        assert "disk full" in create.value.details() and "retry later" in create.value.details()
        assert "later" not in api.topics()
        # A commit the offset journal cannot take is refused and not applied (those that still fit in the
        # journal's last page are journalled, so acknowledged); the failing offsets show.
        last = 0
        for i in range(400):
            try:
                api.commit("watchers", topic, 0, 1 + i % 2)  # always a change: always a journal record
            except grpc.RpcError as e:
                refused = e
                break
            last = 1 + i % 2
        else:
            pytest.fail("no commit was refused on a full disk")
        assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused
        assert "disk full" in refused.details() and "not applied" in refused.details(), refused.details()
        assert api.query("watchers", topic, 0) == last
        wait_until(lambda: failing(metrics_port, "consumer_offsets") == 1, TIMEOUT, "offsets failing")

        filler.unlink()
        (small_disk / "filler-2").unlink()
        wait_until(lambda: api.health_status() == SERVING, TIMEOUT, "health SERVING again")
        for part in ("store", "config_files", "consumer_offsets"):
            wait_until(lambda part=part: failing(metrics_port, part) == 0, TIMEOUT, f"{part} not failing")
        for q in range(queues):
            acked[q] += api.send(topic, q, 3, "after")
        api.create_topic("later")
        api.commit("watchers", topic, 0, len(acked[0]) - 3)  # accepted again
        assert_all_readable(api, topic, acked)

    log = broker.log_text()
    assert log.count("event=store_not_writable") == 1 and log.count("event=store_writable") == 1, log[-3000:]
    # The offsets' failure is logged once, by whichever writer met the full disk first: the 5 s snapshot timer
    # or the commit's journal append (CI at f6c3bf6 saw only the journal's).
    snapshot, journal = log.count("event=offsets_persist_failed"), log.count("event=offsets_journal_failed")
    assert snapshot <= 1 and journal <= 1 and snapshot + journal >= 1, (snapshot, journal)

    assert broker.stop() == 0
    restarted_at = len(broker.log_text())
    broker.start()
    after = broker.log_text()[restarted_at:]
    assert "not shut down cleanly" not in after and "event=commitlog_truncated" not in after
    with Api(broker.address) as api:
        assert_all_readable(api, topic, acked)
        assert "later" in api.topics()
        assert api.query("watchers", topic, 0) == len(acked[0]) - 3


def test_a_graceful_stop_on_a_full_disk_loses_no_acknowledged_message(small_disk, broker_factory):
    broker = broker_factory(data_dir=small_disk, args=("--commitlog-segment-size", str(1024 * 1024)))
    filler = small_disk / "filler"
    topic = "stop-full"
    with Api(broker.address) as api:
        api.create_topic(topic, 1)
        fill(filler, leave=300 * 1024)
        acked, refused = send_until_refused(api, topic, 1)
        assert refused.code() == grpc.StatusCode.UNAVAILABLE
    fill(small_disk / "filler-2", leave=0)  # not even room for the checkpoint
    broker.stop()  # may not be clean (the checkpoint cannot be written); must not lose anything
    filler.unlink()
    (small_disk / "filler-2").unlink()
    broker.start()
    with Api(broker.address) as api:
        assert_all_readable(api, topic, acked)
        acked[0] += api.send(topic, 0, 2, "after")
        assert_all_readable(api, topic, acked)
