"""Bad input changes nothing: every RPC of the four services, fed undecodable bytes, names with control
characters and generated requests, answers a specific status (never UNKNOWN or INTERNAL), logs no
traceback, and leaves topics, messages, groups, offsets, locks and members exactly as they were when it
refuses a request."""

from __future__ import annotations

import os

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rpc_fuzzlib import (
    CLIENT_IDS,
    GROUPS,
    TOPICS,
    call,
    methods,
    name_field_paths,
    request_strategy,
    set_path,
    snapshot,
    valid_name,
)

from tests.brokerproc import BrokerProcess, BrokerStubs
from tidemark.v1 import admin_pb2, common_pb2, membership_pb2, messaging_pb2, offsets_pb2

METHODS = methods()
BY_NAME = {m.name: m for m in METHODS}
# Nothing may expire or time out by itself while the tests compare snapshots.
# (Retried messages wait a day, so no scheduled delivery lands between two snapshots.)
BROKER_ARGS = ("--lock-expiry-ms", "3600000", "--watch-grace-ms", "3600000", "--channel-expired-timeout-ms",
               "3600000", "--max-long-polling-ms", "200", "--delay-levels", " ".join(["1d"] * 18))
REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.ALREADY_EXISTS,
            grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.OUT_OF_RANGE,
            grpc.StatusCode.RESOURCE_EXHAUSTED}
# A stream the broker keeps open (a watch, a fetch waiting for messages) ends at the test's deadline.
STILL_OPEN = {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}


def _identity(b: bytes) -> bytes:
    return b


def seed(stubs: BrokerStubs) -> None:
    """Topics with messages, a group with a member, commits and a lock: state a bad request could damage."""
    have = {t.name for t in stubs.admin.ListTopics(admin_pb2.ListTopicsRequest()).topics}
    for topic in TOPICS[:2]:
        if topic not in have:
            stubs.admin.CreateTopic(admin_pb2.CreateTopicRequest(name=topic, queue_nums=2))
            stubs.messaging.SendMessage(messaging_pb2.SendMessageRequest(
                topic=topic, queue_id=0, messages=[common_pb2.Message(body=b"x", keys="k1", tags="a")] * 3))
    stubs.admin.UpdateBrokerPermission(admin_pb2.UpdateBrokerPermissionRequest(readable=True, writable=True))
    stubs.membership.Heartbeat(membership_pb2.HeartbeatRequest(
        group=GROUPS[0], client_id=CLIENT_IDS[0],
        subscriptions=[common_pb2.Subscription(topic=TOPICS[0], expression="*")]))
    stubs.membership.LockQueues(membership_pb2.LockQueuesRequest(
        group=GROUPS[0], client_id=CLIENT_IDS[0], queues=[common_pb2.MessageQueue(topic=TOPICS[0], queue_id=0)]))
    stubs.offsets.UpdateConsumerOffset(offsets_pb2.UpdateConsumerOffsetRequest(
        commit=offsets_pb2.OffsetCommit(group=GROUPS[0], topic=TOPICS[0], queue_id=0, offset=2)))


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("fuzz") / "data", args=BROKER_ARGS).start()
    with BrokerStubs(broker.address) as stubs:
        seed(stubs)
        yield broker, stubs
    broker.stop()


# A request that would be accepted but for the name under test (what else a method needs to be valid).
BASELINES = {
    "SendMessage": lambda r: r.messages.add(body=b"x"),
    "ResetOffset": lambda r: setattr(r, "to_earliest", True),
    "PullMessage": lambda r: setattr(r, "max_msg_nums", 1),
    "UpdateGroupConfig": lambda r: setattr(r, "retry_max_times", 3),
    "WatchTransactionChecks": lambda r: r.topics.append(TOPICS[0]),
    "EndTransaction": lambda r: setattr(r, "resolution", 1),
}


def _tame(method_name: str, request) -> None:
    """Keep generated requests from waiting: the broker would act after the test stopped watching."""
    if method_name == "LockQueues":
        request.wait_ms = min(max(request.wait_ms, 0), 100)


def _log_problems(broker: BrokerProcess) -> list[str]:
    return [line for line in broker.log_text().splitlines()
            if "Traceback" in line or "event=rpc_error" in line or "event=stream_request_failed" in line]


@pytest.mark.parametrize("payload", [b"\x0a\x05\x61\x62", b"\xff\xff\xff\xff\xff", b"\x08"], ids=repr)
def test_undecodable_bytes_get_invalid_argument_and_change_nothing(fuzz_broker, payload):
    broker, stubs = fuzz_broker
    before = snapshot(stubs)
    codes = {m.name: call(stubs.channel, m, [payload], timeout=1.0) for m in METHODS}
    assert {name: code for name, code in codes.items() if code is not grpc.StatusCode.INVALID_ARGUMENT} == {}
    assert snapshot(stubs) == before
    assert _log_problems(broker) == []
    # At most one line per interval, however many requests were refused.
    assert sum("event=request_undecodable" in line for line in broker.log_text().splitlines()) <= 3


BAD_VALUES = ("fz-t\n", "fz\x00g", "\x1b[2Jfz")
NAME_CASES = [(m.name, path) for m in METHODS if not m.client_streaming
              for path in name_field_paths(m.input_type.DESCRIPTOR)]


@pytest.mark.parametrize(("method_name", "path"), NAME_CASES, ids=lambda v: v if isinstance(v, str) else ".".join(v))
def test_every_name_field_refuses_control_characters(fuzz_broker, method_name, path):
    """Each name field of each request, with every other name valid: INVALID_ARGUMENT quoting the bad
    value, nothing changed. (The streams answer per batch or queue; see the stream tests below.)"""
    _broker, stubs = fuzz_broker
    method = BY_NAME[method_name]
    before = snapshot(stubs)
    for bad in BAD_VALUES:
        request = method.input_type()
        for other in name_field_paths(method.input_type.DESCRIPTOR):
            set_path(request, other, valid_name(other[-1]))
        BASELINES.get(method_name, lambda r: None)(request)
        set_path(request, path, bad)
        code, details = _unary_status(stubs, method, request)
        assert code is grpc.StatusCode.INVALID_ARGUMENT, (bad, code, details)
        assert repr(bad)[1:-1] in details, details
    assert snapshot(stubs) == before


def _unary_status(stubs: BrokerStubs, method, request) -> tuple[grpc.StatusCode, str]:
    try:
        if method.server_streaming:
            for _ in stubs.channel.unary_stream(method.path, request_serializer=_identity,
                                                response_deserializer=_identity)(request.SerializeToString(),
                                                                                timeout=1.0):
                break
        else:
            stubs.channel.unary_unary(method.path, request_serializer=_identity,
                                      response_deserializer=_identity)(request.SerializeToString(), timeout=2.0)
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


@pytest.mark.parametrize("bad", BAD_VALUES, ids=repr)
def test_stream_names_refuse_control_characters(fuzz_broker, bad):
    _broker, stubs = fuzz_broker
    before = snapshot(stubs)
    produced = list(stubs.messaging.Produce(iter([messaging_pb2.ProduceRequest(
        request_id=1, topic=bad, queue_id=0, records=b"", count=1)]), timeout=5))
    assert [r.code for r in produced] == [grpc.StatusCode.INVALID_ARGUMENT.value[0]]
    assert repr(bad)[1:-1] in produced[0].error
    for field in ("topic", "group"):
        open_ = messaging_pb2.FetchOpen(handle=1, group=GROUPS[0], topic=TOPICS[0], queue_id=0,
                                        credit_messages=10, credit_bytes=1 << 20)
        setattr(open_, field, bad)
        ended = [e for r in stubs.messaging.Fetch(iter([messaging_pb2.FetchRequest(open=open_)]), timeout=5)
                 for e in r.ended]
        assert [e.code for e in ended] == [grpc.StatusCode.INVALID_ARGUMENT.value[0]], ended
        assert repr(bad)[1:-1] in ended[0].error
    result = stubs.offsets.CommitOffsets(iter([offsets_pb2.CommitOffsetsRequest(commits=[offsets_pb2.OffsetCommit(
        group=bad, topic=TOPICS[0], queue_id=0, offset=1)])]), timeout=5)
    assert (result.applied, result.rejected) == (0, 1)
    assert result.rejections[0].reason == offsets_pb2.INVALID and repr(bad)[1:-1] in result.rejections[0].message
    assert snapshot(stubs) == before


@st.composite
def fuzz_call(draw):
    method = draw(st.sampled_from(METHODS))
    if draw(st.integers(0, 9)) == 0:
        return method, [draw(st.binary(max_size=32))]
    count = draw(st.integers(1, 3)) if method.client_streaming else 1
    payloads = []
    for _ in range(count):
        request = draw(request_strategy(method.input_type.DESCRIPTOR))
        _tame(method.name, request)
        payloads.append(request.SerializeToString())
    return method, payloads


# The suite runs the same 350 examples every time (about 20 s); TIDEMARK_FUZZ_EXAMPLES=N hunts with N
# fresh random ones.
HUNT = os.environ.get("TIDEMARK_FUZZ_EXAMPLES")


@settings(max_examples=int(HUNT or 350), deadline=None, suppress_health_check=list(HealthCheck),
          derandomize=not HUNT)
@given(case=fuzz_call())
def test_generated_requests_get_specific_statuses_and_refusals_change_nothing(fuzz_broker, case):
    broker, stubs = fuzz_broker
    method, payloads = case
    before = snapshot(stubs)
    code = call(stubs.channel, method, payloads, timeout=0.5 if method.server_streaming else 3.0)
    assert code is grpc.StatusCode.OK or code in REFUSALS or code in STILL_OPEN, (method.name, code)
    if code in REFUSALS:
        after = snapshot(stubs)
        changed = {k: (before.get(k), after.get(k)) for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
        assert changed == {}, (method.name, code, payloads)
    else:
        seed(stubs)  # an accepted request may delete a topic or close the broker; put the seeds back
    assert _log_problems(broker) == []
