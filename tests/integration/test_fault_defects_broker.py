"""Defects a hostile-input and disk-fault run found in the broker, each pinned by a real broker process.

- A commit the offset journal cannot take (a full disk) is refused with UNAVAILABLE and not applied, on
  every path a commit arrives by, and a kill -9 brings no refused commit back and loses no acknowledged one.
- A commit for a new group whose config cannot be written changes nothing (no offset, no group).
- A refused send creates no topic (a %RETRY% topic, an auto-created user topic).
- HandBackOffsets refuses names no other RPC accepts, and applies nothing of such a call.
- A bad commit inside a CommitOffsets message is a rejection; the stream and the other commits go on.
- Anonymous Health/List and undecodable reflection requests on an --auth broker get a proper answer and
  leave a few log lines, not a traceback each.

Every wait polls observable state against a deadline.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
from pathlib import Path

import grpc
import pytest
from brokerproc import BrokerStubs
from test_disk_full import DISK_BYTES, Api, fill
from workload import wait_until

from tidemark.common.auth import Credentials
from tidemark.common.records import RecordBatchBuilder, encode_properties
from tidemark.v1 import (
    admin_pb2,
    common_pb2,
    messaging_pb2,
    offsets_pb2,
    replication_pb2,
    replication_pb2_grpc,
)

TIMEOUT = 15
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
# No offset snapshot while a test runs: the journal alone decides what survives a kill -9.
NO_SNAPSHOT = ("--flush-consumer-offset-interval-ms", "3600000")


def _identity(b: bytes) -> bytes:
    return b


@pytest.fixture
def small_disk(tmp_path: Path):
    """test_disk_full's 8 MiB tmpfs, unmounted after the test (request it before broker_factory)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def groups_of(api: BrokerStubs) -> set[str]:
    return {g.group for g in api.admin.ListGroups(admin_pb2.ListGroupsRequest(), timeout=TIMEOUT).groups}


def topics_of(api: BrokerStubs) -> set[str]:
    return {t.name for t in api.admin.ListTopics(admin_pb2.ListTopicsRequest(include_system=True),
                                                 timeout=TIMEOUT).topics}


def _commit_pb(group: str, topic: str, offset: int, **fence) -> offsets_pb2.OffsetCommit:
    commit = offsets_pb2.OffsetCommit(group=group, topic=topic, queue_id=0, offset=offset)
    if fence:
        commit.fence.CopyFrom(common_pb2.CommitFence(**fence))
    return commit


# -- the four ways a commit arrives; each returns None when answered OK, the RpcError when refused --------


def unary_commit(api: Api, group: str, topic: str, value: int) -> grpc.RpcError | None:
    try:
        api.commit(group, topic, 0, value)
    except grpc.RpcError as e:
        return e
    return None


def stream_commit(api: Api, group: str, topic: str, value: int) -> grpc.RpcError | None:
    try:
        answer = api.offsets.CommitOffsets(iter([offsets_pb2.CommitOffsetsRequest(
            commits=[_commit_pb(group, topic, value)])]), timeout=TIMEOUT)
    except grpc.RpcError as e:
        return e
    assert (answer.applied, answer.rejected) == (1, 0), answer
    return None


def pull_commit(api: Api, group: str, topic: str, value: int) -> grpc.RpcError | None:
    try:
        api.messaging.PullMessage(messaging_pb2.PullMessageRequest(
            group=group, topic=topic, queue_id=0, queue_offset=0, max_msg_nums=1, commit_offset=value),
            timeout=TIMEOUT)
    except grpc.RpcError as e:
        return e
    return None


def fetch_commit(api: Api, group: str, topic: str, value: int) -> grpc.RpcError | None | str:
    """A commit riding on a credit frame (no answer of its own; RocketMQ drops a bad piggybacked commit and
    serves on): the same credit grants one message, so the frame that brings it shows the commit was
    handled. Applied: the offset shows; refused: it does not, and the stream still serves ("dropped")."""
    requests: queue.Queue = queue.Queue()
    requests.put(messaging_pb2.FetchRequest(open=messaging_pb2.FetchOpen(
        handle=1, group=group, topic=topic, queue_id=0, offset=0, batch_size=1)))
    requests.put(messaging_pb2.FetchRequest(credit=messaging_pb2.FetchCredit(
        handle=1, messages=1, bytes=1 << 20, commit_offset=value)))
    call = api.messaging.Fetch(iter(requests.get, None), timeout=TIMEOUT)
    try:
        for response in call:
            if any(r.count for r in response.records):
                break
        else:
            return call
        return None if api.query(group, topic, 0) == value else "dropped"
    except grpc.RpcError as e:
        return e
    finally:
        requests.put(None)
        call.cancel()


@needs_root
def test_commits_the_offset_journal_cannot_take_are_refused_and_not_applied_and_a_kill_9_agrees(
    small_disk, broker_factory
):
    broker = broker_factory(data_dir=small_disk, args=("--commitlog-segment-size", str(1024 * 1024), *NO_SNAPSHOT))
    topic, group = "journal-full", "journalled"
    history: list[tuple[str, int, str]] = []  # (path, offset, "ok" | "refused"), in order
    with Api(broker.address) as api:
        api.create_topic(topic, 1)
        api.send(topic, 0, 8, "m")
        api.commit(group, topic, 0, 1)  # the group's config exists before the disk fills
        acked = 1
        fill(small_disk / "filler", leave=0)
        for path, commit in (("UpdateConsumerOffset", unary_commit), ("CommitOffsets", stream_commit),
                             ("PullMessage", pull_commit), ("Fetch", fetch_commit)):
            fill(small_disk / f"filler-{path}", leave=0)  # whatever a failed write gave back
            # Every accepted commit adds a record to the journal's last page; one of them finds it full.
            for _ in range(400 if path == "UpdateConsumerOffset" else 40):
                value = 2 if acked != 2 else 3  # always a change: always a journal record
                error = commit(api, group, topic, value)
                if error is None:
                    history.append((path, value, "ok"))
                    acked = value
                    continue
                history.append((path, value, "refused"))
                if error == "dropped":  # a piggybacked commit: refused without an answer, the queue still served
                    assert api.query(group, topic, 0) == acked, f"{path}: a refused commit was applied"
                    break
                assert error.code() == grpc.StatusCode.UNAVAILABLE, (path, error.code(), error.details())
                assert "disk full" in error.details() and "offset journal" in error.details(), error.details()
                assert "not applied" in error.details(), error.details()
                assert api.query(group, topic, 0) == acked, f"{path}: a refused commit was applied"
                break
            else:
                pytest.fail(f"{path}: no commit was refused on a full disk ({len(history)} commits answered OK); "
                            f"log: {broker.log_text()[-1500:]}")
    assert "commits are still applied" not in broker.log_text()

    broker.kill()
    for filler in small_disk.glob("filler*"):
        filler.unlink()
    broker.start()
    with Api(broker.address) as api:
        assert api.query(group, topic, 0) == acked, history[-8:]


@needs_root
def test_a_commit_for_a_new_group_whose_config_cannot_be_written_changes_nothing(small_disk, broker_factory):
    broker = broker_factory(data_dir=small_disk, args=("--commitlog-segment-size", str(1024 * 1024), *NO_SNAPSHOT))
    topic = "groups-full"
    with Api(broker.address) as api:
        api.create_topic(topic, 1)
        api.send(topic, 0, 4, "m")
        for n, commit in enumerate((unary_commit, stream_commit)):
            group = f"newcomer-{n}"
            fill(small_disk / f"filler-{n}", leave=0)
            error = commit(api, group, topic, 3)
            assert error is not None, f"{commit.__name__}: a new group's commit was answered OK on a full disk"
            assert error.code() == grpc.StatusCode.UNAVAILABLE, (error.code(), error.details())
            assert "disk full" in error.details() and "not applied" in error.details(), error.details()
            assert api.query(group, topic, 0) == -1, f"{commit.__name__}: the refused commit was applied"
            assert group not in groups_of(api)
    broker.kill()
    for filler in small_disk.glob("filler*"):
        filler.unlink()
    broker.start()
    with Api(broker.address) as api:
        for group in ("newcomer-0", "newcomer-1"):
            assert api.query(group, topic, 0) == -1
            assert group not in groups_of(api)


def test_a_refused_send_creates_no_topic(broker_factory):
    broker = broker_factory(args=("--auto-create-topic",))
    refused = {
        "%RETRY%late-group": [dict(queue_id=99, messages=[common_pb2.Message(body=b"x")]),
                              dict(messages=[common_pb2.Message(body=b"x", delay_level=99)]),
                              dict(messages=[common_pb2.Message(body=b"x", properties={"RECONSUME_TIME": "x"})]),
                              dict(messages=[common_pb2.Message(body=b"x", properties={"TRAN_MSG": "true"})])],
        "auto-user-topic": [dict(queue_id=99, messages=[common_pb2.Message(body=b"x")]),
                            dict(messages=[common_pb2.Message(body=b"x", delay_level=99)]),
                            dict(messages=[common_pb2.Message(body=b"x", properties={"": "empty key"})])],
    }
    with BrokerStubs(broker.address) as api:
        before = topics_of(api)
        for topic, requests in refused.items():
            for fields in requests:
                with pytest.raises(grpc.RpcError) as e:
                    api.messaging.SendMessage(messaging_pb2.SendMessageRequest(topic=topic, **fields), timeout=TIMEOUT)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (topic, fields, e.value.details())
                assert topics_of(api) == before, f"refused send {fields} to {topic!r} created a topic"
        # The record-batch path (Produce) too: a batch for a queue the new topic would not have.
        builder = RecordBatchBuilder("auto-batch-topic")
        builder.append(b"x", encode_properties({"UNIQ_KEY": "batch-1"}))
        [answer] = list(api.messaging.Produce(iter([messaging_pb2.ProduceRequest(
            request_id=1, topic="auto-batch-topic", queue_id=99, count=1, records=bytes(builder.buffer))]),
            timeout=TIMEOUT))
        assert answer.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], answer
        assert topics_of(api) == before, "a refused batch created its topic"
        # ... and a malformed batch for a queue the topic would have (refused by the store's checks).
        [answer] = list(api.messaging.Produce(iter([messaging_pb2.ProduceRequest(
            request_id=2, topic="auto-batch-topic", queue_id=0, count=2, records=bytes(builder.buffer))]),
            timeout=TIMEOUT))
        assert answer.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], answer
        assert topics_of(api) == before, "a malformed batch created its topic"
        # The same sends, valid, still create what they should.
        api.messaging.SendMessage(messaging_pb2.SendMessageRequest(
            topic="%RETRY%late-group", messages=[common_pb2.Message(body=b"x")]), timeout=TIMEOUT)
        assert "%RETRY%late-group" in topics_of(api)
    broker.stop()
    broker.start()
    with BrokerStubs(broker.address) as api:
        assert topics_of(api) == before | {"%RETRY%late-group"}


def test_hand_back_offsets_refuses_names_no_other_rpc_accepts_and_applies_nothing_of_the_call(broker_factory):
    broker = broker_factory()
    with BrokerStubs(broker.address) as api:
        api.admin.CreateTopic(admin_pb2.CreateTopicRequest(name="t", queue_nums=1), timeout=TIMEOUT)
        replication = replication_pb2_grpc.ReplicationServiceStub(api.channel)
        for bad in ("t@g\n", "t@f:G", "t\t@g", "x" * 300 + "@g"):
            doc = json.dumps({"offsetTable": {"t@good": {"0": 1}, bad: {"0": 1}}}).encode()
            with pytest.raises(grpc.RpcError) as e:
                replication.HandBackOffsets(replication_pb2.ReplicaMetadata(offsets_json=doc), timeout=TIMEOUT)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
            assert repr(bad)[:40] in e.value.details(), e.value.details()
            assert groups_of(api) == set(), f"{bad!r}: the call applied some of its entries"
        # A valid hand-back still moves the master forward.
        answer = replication.HandBackOffsets(replication_pb2.ReplicaMetadata(
            offsets_json=b'{"offsetTable": {"t@good": {"0": 1}}}'), timeout=TIMEOUT)
        assert answer.advanced == 1
    broker.stop()
    broker.start()
    with BrokerStubs(broker.address) as api:
        assert groups_of(api) == {"good"}


def test_a_bad_commit_in_a_commit_offsets_message_is_rejected_and_the_stream_goes_on(broker):
    topic, group = "stream-commits", "streamer"
    with BrokerStubs(broker.address) as api:
        api.admin.CreateTopic(admin_pb2.CreateTopicRequest(name=topic, queue_nums=1), timeout=TIMEOUT)
        api.messaging.SendMessage(messaging_pb2.SendMessageRequest(
            topic=topic, queue_id=0, messages=[common_pb2.Message(body=b"x")] * 5), timeout=TIMEOUT)
        bad_fence = _commit_pb(group, topic, 2, client_id="bad id\n")
        answer = api.offsets.CommitOffsets(iter([
            offsets_pb2.CommitOffsetsRequest(commits=[_commit_pb(group, topic, 1), bad_fence,
                                                      _commit_pb(group, "no-such-topic", 1),
                                                      _commit_pb(group, topic, 3)]),
            offsets_pb2.CommitOffsetsRequest(commits=[_commit_pb(group, topic, 4)]),
        ]), timeout=TIMEOUT)
        assert (answer.applied, answer.rejected) == (3, 2), answer
        assert [r.commit.offset for r in answer.rejections] == [2, 1]
        assert all(r.reason == offsets_pb2.INVALID for r in answer.rejections), answer
        assert "client id" in answer.rejections[0].message, answer.rejections[0].message
        got = api.offsets.QueryConsumerOffset(offsets_pb2.QueryConsumerOffsetRequest(
            group=group, topic=topic, queue_id=0), timeout=TIMEOUT)
        assert got.offset == 4


ROOT = Credentials("root", "root-secret-1")
CALLS = 300


def test_anonymous_health_list_and_undecodable_reflection_requests_do_not_flood_the_log(broker_factory):
    broker = broker_factory(args=("--auth", "--init-user", f"{ROOT.access_key}:{ROOT.secret_key}"))
    from grpc_health.v1 import health_pb2

    with BrokerStubs(broker.address) as api:  # anonymous: health and reflection are open services
        wait_until(lambda: api.health.Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT).status
                   == health_pb2.HealthCheckResponse.SERVING, TIMEOUT, "health SERVING")
        start = Path(broker.log_path).stat().st_size
        listed = api.health.List(health_pb2.HealthListRequest(), timeout=TIMEOUT)
        assert listed.statuses[""].status == health_pb2.HealthCheckResponse.SERVING
        assert listed.statuses["tidemark.v1.MessagingService"].status == health_pb2.HealthCheckResponse.SERVING
        for _ in range(CALLS - 1):
            api.health.List(health_pb2.HealthListRequest(), timeout=TIMEOUT)
        reflection = api.channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=_identity, response_deserializer=_identity)
        for _ in range(CALLS):
            with pytest.raises(grpc.RpcError) as e:
                for _ in reflection(iter([b"\xff\xff\xff"]), timeout=TIMEOUT):
                    pass
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.value.code(), e.value.details())
        # The reflection service still answers good requests.
        good = b"\x3a\x00"  # ServerReflectionRequest(list_services="")
        answers = list(reflection(iter([good]), timeout=TIMEOUT))
        assert answers and b"tidemark.v1.MessagingService" in answers[0]
    with open(broker.log_path, "rb") as f:
        f.seek(start)
        written = f.read()
    assert b"Traceback" not in written, written[:3000].decode("utf-8", "replace")
    assert len(written) < 8 * 1024, f"{2 * CALLS} calls wrote {len(written)} bytes of log:\n" \
                                    f"{written[:3000].decode('utf-8', 'replace')}"
