"""Crash recovery of the message store, against a real broker process killed with SIGKILL.

Every acknowledged message (sync flush) must be readable at its queue offset
after a restart, and bytes past a torn or corrupt commit-log tail must never be
served. Damage is applied to the files the way docs/architecture.md describes
them: commitlog/ segments named by their 20-digit start offset, records
beginning with total size + magic + CRC.
"""

from __future__ import annotations

import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from brokerproc import BrokerStubs
from workload import wait_until

from tidemark.v1 import (
    admin_pb2,
    common_pb2,
    messaging_pb2,
    offsets_pb2,
)

TIMEOUT = 15
MESSAGE_MAGIC = -626843481  # the record magic, as in the store's codec (RocketMQ's MESSAGE_MAGIC_CODE)


@dataclass(frozen=True)
class Acked:
    queue_id: int
    queue_offset: int
    msg_id: str
    body: bytes
    commit_log_offset: int


class Api(BrokerStubs):
    def create_topic(self, name: str, queues: int) -> None:
        self.admin.CreateTopic(admin_pb2.CreateTopicRequest(name=name, queue_nums=queues), timeout=TIMEOUT)

    def send(self, topic: str, queue_id: int, body: bytes, keys: str = "") -> Acked:
        resp = self.messaging.SendMessage(messaging_pb2.SendMessageRequest(
            topic=topic, queue_id=queue_id, messages=[common_pb2.Message(body=body, keys=keys)]), timeout=TIMEOUT)
        r = resp.results[0]
        return Acked(r.queue_id, r.queue_offset, r.msg_id, body, r.commit_log_offset)

    def send_batch(self, topic: str, queue_id: int, bodies: list[bytes]) -> list[Acked]:
        resp = self.messaging.SendMessage(messaging_pb2.SendMessageRequest(
            topic=topic, queue_id=queue_id, messages=[common_pb2.Message(body=b) for b in bodies]), timeout=TIMEOUT)
        return [Acked(r.queue_id, r.queue_offset, r.msg_id, b, r.commit_log_offset)
                for r, b in zip(resp.results, bodies, strict=True)]

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self.offsets.GetMaxOffset(offsets_pb2.QueueRequest(topic=topic, queue_id=queue_id),
                                         timeout=TIMEOUT).offset

    def read_all(self, topic: str, queue_id: int) -> list[common_pb2.MessageExt]:
        """Every message of a queue from offset 0, asserting the pulls end cleanly at the max offset."""
        out: list[common_pb2.MessageExt] = []
        offset = 0
        while True:
            resp = self.messaging.PullMessage(messaging_pb2.PullMessageRequest(
                topic=topic, queue_id=queue_id, queue_offset=offset, max_msg_nums=256), timeout=TIMEOUT)
            if resp.status != messaging_pb2.FOUND:
                assert resp.status == messaging_pb2.NO_NEW_MSG, resp
                assert offset == resp.max_offset
                return out
            out.extend(resp.messages)
            offset = resp.next_begin_offset


def segments(data_dir: Path) -> list[Path]:
    return sorted(p for p in (data_dir / "commitlog").iterdir() if len(p.name) == 20 and p.name.isdigit())


def segment_of(data_dir: Path, commit_log_offset: int) -> Path:
    return [p for p in segments(data_dir) if int(p.name) <= commit_log_offset][-1]


# -- kill -9 during a stream of sends ---------------------------------------------


def test_kill_during_sync_send_stream_keeps_every_acknowledged_message(broker_factory):
    broker = broker_factory(args=("--flush", "sync"))
    topic, queues = "stream", 4
    with Api(broker.address) as api:
        api.create_topic(topic, queues)
    acked: list[Acked] = []
    lock = threading.Lock()
    errors: list[grpc.RpcError] = []

    def produce(queue_id: int) -> None:
        with Api(broker.address) as api:
            i = 0
            while True:
                try:
                    a = api.send(topic, queue_id, f"q{queue_id}-{i}".encode() + b"." * 200, keys=f"k{i}")
                except grpc.RpcError as e:
                    errors.append(e)
                    return
                with lock:
                    acked.append(a)
                i += 1

    threads = [threading.Thread(target=produce, args=(q,), daemon=True) for q in range(queues)]
    for t in threads:
        t.start()
    wait_until(lambda: len(acked) >= 400, 30, "400 acknowledged sends")
    broker.kill()
    for t in threads:
        t.join(20)
    assert len(errors) == queues, "every producer should see the broker die"
    with lock:
        snapshot = list(acked)

    broker.start()
    assert "not shut down cleanly" in broker.log_text()
    with Api(broker.address) as api:
        for q in range(queues):
            mine = sorted((a for a in snapshot if a.queue_id == q), key=lambda a: a.queue_offset)
            # Each producer sends one message at a time, so its i-th ack is at offset i.
            assert [a.queue_offset for a in mine] == list(range(len(mine)))
            stored = api.read_all(topic, q)
            assert len(stored) >= len(mine)
            assert [m.queue_offset for m in stored] == list(range(len(stored)))
            for a in mine:
                m = stored[a.queue_offset]
                assert (m.msg_id, m.body, m.commit_log_offset) == (a.msg_id, a.body, a.commit_log_offset)
            # Anything stored past the last ack is a whole message of the same stream (sent, ack lost).
            for m in stored:
                assert m.body == f"q{q}-{m.queue_offset}".encode() + b"." * 200
                assert m.keys == f"k{m.queue_offset}"
            # The queue continues after what it kept; nothing is overwritten.
            new = api.send(topic, q, b"after-restart")
            assert new.queue_offset == len(stored)
            assert api.read_all(topic, q)[-1].body == b"after-restart"


# -- a torn or corrupt tail --------------------------------------------------------


def _tear(path: Path, cut: int) -> None:
    os.truncate(path, cut)


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def _flip(path: Path, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0xFF]))


# name -> (damage(last segment, position of the last record in it, its size), does the last record survive)
DAMAGE = {
    "last-record-cut-mid-way": (lambda seg, pos, size: _tear(seg, pos + size // 2), False),
    "last-record-cut-inside-its-size-field": (lambda seg, pos, size: _tear(seg, pos + 3), False),
    "last-record-body-byte-flipped": (lambda seg, pos, size: _flip(seg, pos + size - 1), False),
    "garbage-appended": (lambda seg, pos, size: _append(
        seg, struct.pack(">iiI", 300, MESSAGE_MAGIC, 12345) + os.urandom(1000)), True),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_torn_commitlog_tail_is_cut_and_never_served(broker_factory, damage):
    # Small segments so the log spans several files; a checkpoint that never advances past the
    # load (huge flush interval) so recovery has to validate every record it keeps. kill -9
    # leaves the page cache intact, so the damage a power cut would do is applied by hand.
    broker = broker_factory(args=("--commitlog-segment-size", "16384", "--flush-interval-ms", "600000"))
    topic = "torn"
    with Api(broker.address) as api:
        api.create_topic(topic, 2)
        sent = []
        for i in range(12):
            bodies = [f"m{i}-{j}-".encode() + os.urandom(150).hex().encode() for j in range(8)]
            sent.extend(api.send_batch(topic, i % 2, bodies))
    broker.kill()
    data_dir = broker.data_dir
    assert len(segments(data_dir)) >= 2
    last = sent[-1]
    seg = segment_of(data_dir, last.commit_log_offset)
    pos = last.commit_log_offset - int(seg.name)
    size = seg.stat().st_size - pos  # the last record ends the last segment
    assert seg == segments(data_dir)[-1] and size > len(last.body)
    apply, last_survives = DAMAGE[damage]
    apply(seg, pos, size)

    broker.start()
    survivors = sent if last_survives else sent[:-1]
    assert "truncated the commit log" in broker.log_text()
    with Api(broker.address) as api:
        for q in (0, 1):
            expected = [a for a in survivors if a.queue_id == q]
            stored = api.read_all(topic, q)
            assert api.max_offset(topic, q) == len(expected)
            assert [(m.queue_offset, m.msg_id, m.body) for m in stored] == \
                   [(a.queue_offset, a.msg_id, a.body) for a in expected]
        # New sends go where the kept log ends.
        new = api.send(topic, last.queue_id, b"after-repair")
        assert new.queue_offset == len([a for a in survivors if a.queue_id == last.queue_id])
        assert new.commit_log_offset == (last.commit_log_offset if not last_survives
                                         else last.commit_log_offset + size)
    if damage != "garbage-appended":
        return
    # The repaired log stays valid through another crash: no garbage left behind the new record.
    broker.kill()
    broker.start()
    with Api(broker.address) as api:
        stored = api.read_all(topic, last.queue_id)
        assert (stored[-1].queue_offset, stored[-1].body) == (new.queue_offset, b"after-repair")
        assert [m.body for m in stored[:-1]] == [a.body for a in survivors if a.queue_id == last.queue_id]


def test_lost_consume_queue_entries_are_rebuilt_from_the_commitlog(broker_factory):
    # Consume-queue files of 8 entries; a checkpoint that stays at the load so recovery replays everything.
    broker = broker_factory(args=("--consume-queue-entries-per-file", "8", "--flush-interval-ms", "600000"))
    topic = "cq"
    with Api(broker.address) as api:
        api.create_topic(topic, 3)
        sent = {q: api.send_batch(topic, q, [f"q{q}-{i}".encode() for i in range(21)]) for q in range(3)}
    broker.kill()
    cq = broker.data_dir / "consumequeue" / topic
    files = {q: sorted((cq / str(q)).iterdir()) for q in range(3)}
    assert [len(f) for f in files.values()] == [3, 3, 3]
    os.truncate(files[0][-1], 2 * 20 + 7)  # queue 0: a torn entry, the rest of its last file lost
    files[1][-1].unlink()  # queue 1: its last file lost
    for f in files[2]:  # queue 2: every file lost
        f.unlink()

    broker.start()
    with Api(broker.address) as api:
        for q in range(3):
            stored = api.read_all(topic, q)
            assert [(m.queue_offset, m.msg_id, m.body, m.commit_log_offset) for m in stored] == \
                   [(a.queue_offset, a.msg_id, a.body, a.commit_log_offset) for a in sent[q]]
            assert api.send(topic, q, b"next").queue_offset == 21
