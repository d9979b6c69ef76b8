"""Messaging RPCs against a real broker process, over the raw tidemark.v1 stubs.

Raw stubs (not the client library) so every MessageExt field, status code and
error message the broker produces is visible as it is on the wire.
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from brokerproc import BrokerProcess, BrokerStubs, free_port
from grpc_health.v1 import health_pb2
from workload import metric, wait_until

from tidemark.v1 import (
    admin_pb2,
    common_pb2,
    messaging_pb2,
    offsets_pb2,
)

MAX_MESSAGE_SIZE = 4096
METRICS_PORT = free_port()
TIMEOUT = 15
FOUND, NO_NEW_MSG, NO_MATCHED_MSG, OFFSET_ILLEGAL = (messaging_pb2.FOUND, messaging_pb2.NO_NEW_MSG,
                                                    messaging_pb2.NO_MATCHED_MSG, messaging_pb2.OFFSET_ILLEGAL)
# Two tags with the same CRC32, so the consume queue's tags code cannot tell them apart.
COLLIDING_TAGS = ("tag9LY9a", "tagtadTi")


class Api(BrokerStubs):
    @classmethod
    def connect(cls, address: str) -> Api:
        return cls(address)

    def create_topic(self, name: str, queues: int = 4) -> None:
        self.admin.CreateTopic(admin_pb2.CreateTopicRequest(name=name, queue_nums=queues), timeout=TIMEOUT)

    def send(self, topic: str, *messages: common_pb2.Message, queue_id: int | None = None):
        req = messaging_pb2.SendMessageRequest(topic=topic, messages=messages)
        if queue_id is not None:
            req.queue_id = queue_id
        return self.messaging.SendMessage(req, timeout=TIMEOUT)

    def pull(self, topic: str, queue_id: int, offset: int, *, max_nums: int = 32, suspend_ms: int = 0,
             subscription: str = "*"):
        return self.messaging.PullMessage(messaging_pb2.PullMessageRequest(
            topic=topic, queue_id=queue_id, queue_offset=offset, max_msg_nums=max_nums,
            suspend_timeout_ms=suspend_ms, subscription=subscription), timeout=TIMEOUT + suspend_ms / 1000)

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self.offsets.GetMaxOffset(offsets_pb2.QueueRequest(topic=topic, queue_id=queue_id),
                                         timeout=TIMEOUT).offset

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self.offsets.GetMinOffset(offsets_pb2.QueueRequest(topic=topic, queue_id=queue_id),
                                         timeout=TIMEOUT).offset

    def search(self, topic: str, queue_id: int, timestamp: int) -> int:
        return self.offsets.SearchOffsetByTimestamp(offsets_pb2.SearchOffsetByTimestampRequest(
            topic=topic, queue_id=queue_id, timestamp=timestamp), timeout=TIMEOUT).offset

    def topics(self) -> list[str]:
        resp = self.admin.ListTopics(admin_pb2.ListTopicsRequest(include_system=True), timeout=TIMEOUT)
        return sorted(t.name for t in resp.topics)


def msg(body: bytes | str, **kw) -> common_pb2.Message:
    return common_pb2.Message(body=body.encode() if isinstance(body, str) else body, **kw)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def next_ms() -> int:
    """Busy-wait until the wall clock moves to a new millisecond, so store timestamps differ."""
    start = now_ms()
    while now_ms() <= start:
        time.sleep(0.001)
    return now_ms()


def expect_error(call, request, code: grpc.StatusCode, *fragments: str) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=TIMEOUT)
    err = info.value
    assert err.code() == code, f"expected {code}, got {err.code()}: {err.details()}"
    for fragment in fragments:
        assert fragment in err.details(), f"{fragment!r} not in {err.details()!r}"
    return err.details()


@pytest.fixture(scope="module")
def small_broker(tmp_path_factory) -> BrokerProcess:
    b = BrokerProcess(tmp_path_factory.mktemp("messaging") / "data",
                      args=("--max-message-size", str(MAX_MESSAGE_SIZE), "--metrics-port", str(METRICS_PORT))).start()
    yield b
    b.kill()


@pytest.fixture(scope="module")
def api(small_broker) -> Api:
    a = Api.connect(small_broker.address)
    yield a
    a.channel.close()


# -- round trips ---------------------------------------------------------------


def test_send_pull_round_trip_keeps_every_field(api: Api):
    api.create_topic("rt", 4)
    born = now_ms() - 5000
    before = now_ms()
    sent = api.send("rt", msg(b"\x00hello\xff", tags="TagA", keys="order-1 order-2",
                              properties={"color": "blue", "empty": ""}, flag=7, born_timestamp=born,
                              born_host="10.0.0.9:5555"), queue_id=2)
    after = now_ms()
    assert sent.broker_name == "broker-a"
    [result] = sent.results
    assert (result.queue_id, result.queue_offset) == (2, 0)
    assert len(result.msg_id) == 32

    pulled = api.pull("rt", 2, 0)
    assert pulled.status == FOUND
    assert (pulled.next_begin_offset, pulled.min_offset, pulled.max_offset) == (1, 0, 1)
    [m] = pulled.messages
    assert m.topic == "rt" and m.broker_name == "broker-a"
    assert (m.queue_id, m.queue_offset) == (2, 0)
    assert m.msg_id == result.msg_id
    assert m.tags == "TagA"
    assert m.keys == "order-1 order-2"
    # TAGS / KEYS / UNIQ_KEY have their own fields and are not repeated in the map.
    assert dict(m.properties) == {"color": "blue", "empty": ""}
    assert m.body == b"\x00hello\xff"
    assert m.born_timestamp == born
    assert before <= m.store_timestamp <= after
    assert m.reconsume_times == 0
    assert m.flag == 7
    assert m.born_host == "10.0.0.9:5555"
    assert m.commit_log_offset == result.commit_log_offset
    assert m.store_size > len(m.body)

    # ViewMessage reads the same record by queue position.
    viewed = api.messaging.ViewMessage(messaging_pb2.ViewMessageRequest(topic="rt", queue_id=2, queue_offset=0),
                                       timeout=TIMEOUT).message
    assert viewed == m
    # Other queues are untouched.
    assert [api.max_offset("rt", q) for q in range(4)] == [0, 0, 1, 0]


def test_born_timestamp_defaults_to_receive_time_and_queues_rotate(api: Api):
    api.create_topic("rr", 4)
    picked = [api.send("rr", msg(f"m{i}")).results[0].queue_id for i in range(8)]
    # Without a queue id the broker rotates over every write queue.
    assert sorted(picked[:4]) == [0, 1, 2, 3] and picked[4:] == picked[:4]
    m = api.pull("rr", picked[0], 0).messages[0]
    # Born time defaults to when the broker received the send; the store stamps its own time right after.
    assert m.body == b"m0" and 0 < m.born_timestamp <= m.store_timestamp < m.born_timestamp + 1000
    assert m.tags == "" and m.keys == "" and dict(m.properties) == {}


def test_batch_lands_in_one_queue_at_consecutive_offsets(api: Api):
    api.create_topic("batch", 4)
    for i in range(3):
        api.send("batch", msg(f"single-{i}"), queue_id=1)
    batch = [msg(f"b-{i}", tags=f"t{i % 2}", keys=f"k{i}") for i in range(20)]
    results = api.send("batch", *batch, queue_id=1).results
    assert [r.queue_offset for r in results] == list(range(3, 23))
    assert {r.queue_id for r in results} == {1}
    assert len({r.msg_id for r in results}) == 20
    assert [r.commit_log_offset for r in results] == sorted(r.commit_log_offset for r in results)

    pulled = api.pull("batch", 1, 3, max_nums=100)
    assert pulled.status == FOUND and pulled.next_begin_offset == 23
    assert [m.body for m in pulled.messages] == [f"b-{i}".encode() for i in range(20)]
    assert [m.queue_offset for m in pulled.messages] == list(range(3, 23))
    assert [m.msg_id for m in pulled.messages] == [r.msg_id for r in results]
    assert [m.tags for m in pulled.messages] == [f"t{i % 2}" for i in range(20)]

    # A batch without a queue id still goes to one queue, at consecutive offsets.
    free = api.send("batch", *[msg(f"x{i}") for i in range(5)]).results
    q = free[0].queue_id
    assert {r.queue_id for r in free} == {q}
    first = free[0].queue_offset
    assert [r.queue_offset for r in free] == list(range(first, first + 5))

    # max_msg_nums bounds a pull; next_begin_offset continues where it stopped.
    part = api.pull("batch", 1, 0, max_nums=5)
    assert [m.queue_offset for m in part.messages] == [0, 1, 2, 3, 4] and part.next_begin_offset == 5


def test_tag_filter_returns_only_matching_tags(api: Api):
    api.create_topic("tags", 1)
    tags = ["a", "b", "c", "", "a", COLLIDING_TAGS[0], "b", COLLIDING_TAGS[1], "c"]
    api.send("tags", *[msg(f"{i}:{t}", tags=t) for i, t in enumerate(tags)], queue_id=0)

    both = api.pull("tags", 0, 0, subscription="a || b")
    assert both.status == FOUND
    assert [(m.queue_offset, m.tags) for m in both.messages] == [(0, "a"), (1, "b"), (4, "a"), (6, "b")]
    assert both.next_begin_offset == 9
    # Spaces around the separator do not matter.
    assert [m.queue_offset for m in api.pull("tags", 0, 0, subscription=" c||a ").messages] == [0, 2, 4, 8]
    # Same tags code, different tag: the exact check after the hash filter drops the other one.
    exact = api.pull("tags", 0, 0, subscription=COLLIDING_TAGS[1])
    assert [(m.queue_offset, m.tags) for m in exact.messages] == [(7, COLLIDING_TAGS[1])]
    # "*" and "" match everything, untagged messages included.
    assert len(api.pull("tags", 0, 0, subscription="*").messages) == 9
    assert len(api.pull("tags", 0, 0, subscription="").messages) == 9

    # Nothing matches: NO_MATCHED_MSG, and the offset moves past what was examined.
    none = api.pull("tags", 0, 0, subscription="zzz")
    assert none.status == NO_MATCHED_MSG and not none.messages
    assert none.next_begin_offset == 9 and none.max_offset == 9


# -- long polling ---------------------------------------------------------------


def test_long_poll_returns_as_soon_as_a_message_arrives(api: Api, small_broker):
    api.create_topic("lp", 2)
    api.send("lp", msg("old"), queue_id=0)
    outcome: dict = {}

    def poll() -> None:
        started = time.monotonic()
        outcome["response"] = api.pull("lp", 0, 1, suspend_ms=10_000)
        outcome["returned"] = time.monotonic()
        outcome["waited"] = outcome["returned"] - started

    t = threading.Thread(target=poll)
    t.start()
    wait_until(lambda: metric(METRICS_PORT, "tidemark_long_polls_waiting") == 1, 10,
               "the pull to park at the end of the queue")
    assert t.is_alive(), f"the pull did not wait: {outcome}"
    other = Api.connect(small_broker.address)  # another client sends
    try:
        sent_at = time.monotonic()
        other.send("lp", msg("new", tags="x"), queue_id=0)
    finally:
        other.channel.close()
    t.join(15)
    response = outcome["response"]
    assert response.status == FOUND
    assert [(m.queue_offset, m.body) for m in response.messages] == [(1, b"new")]
    assert response.next_begin_offset == 2
    # Woken by the arrival, well before the 10 s suspend timeout.
    assert outcome["returned"] - sent_at < 5.0


def test_long_poll_times_out_with_no_new_msg(api: Api):
    api.create_topic("lp-idle", 1)
    api.send("lp-idle", msg("only"), queue_id=0)
    started = time.monotonic()
    response = api.pull("lp-idle", 0, 1, suspend_ms=1000)
    waited = time.monotonic() - started
    assert response.status == NO_NEW_MSG and not response.messages
    assert (response.next_begin_offset, response.min_offset, response.max_offset) == (1, 0, 1)
    assert 0.9 <= waited < 10
    # Without a suspend timeout the same pull answers at once.
    assert api.pull("lp-idle", 0, 1).status == NO_NEW_MSG


def test_long_poll_with_filter_ignores_non_matching_arrivals(api: Api):
    api.create_topic("lp-tag", 1)
    outcome: dict = {}

    def poll() -> None:
        outcome["response"] = api.pull("lp-tag", 0, 0, suspend_ms=10_000, subscription="wanted")

    t = threading.Thread(target=poll)
    t.start()
    wait_until(lambda: metric(METRICS_PORT, "tidemark_long_polls_waiting") == 1, 10, "the pull to park")
    api.send("lp-tag", msg("skip", tags="other"), queue_id=0)
    # The arrival woke the pull; a scrape runs on the broker's loop after that wake-up, so it sees the
    # pull parked again (or gone, if the non-matching message had ended it).
    wait_until(lambda: api.max_offset("lp-tag", 0) == 1, 10, "the non-matching message stored")
    assert metric(METRICS_PORT, "tidemark_long_polls_waiting") == 1
    assert t.is_alive(), "a non-matching message ended the long poll"
    api.send("lp-tag", msg("take", tags="wanted"), queue_id=0)
    t.join(15)
    response = outcome["response"]
    assert response.status == FOUND
    assert [(m.queue_offset, m.body) for m in response.messages] == [(1, b"take")]


# -- offsets of a queue ----------------------------------------------------------


def test_search_by_timestamp_and_min_max_offsets(api: Api):
    api.create_topic("ts", 2)
    firsts = []
    for round_ in range(3):
        next_ms()
        results = api.send("ts", *[msg(f"{round_}-{i}") for i in range(5)], queue_id=0).results
        firsts.append(results[0].queue_offset)
    stamps = [m.store_timestamp for m in api.pull("ts", 0, 0, max_nums=100).messages]
    assert len(stamps) == 15 and stamps == sorted(stamps)
    round_start = [stamps[o] for o in firsts]
    assert len(set(round_start)) == 3

    assert firsts == [0, 5, 10]
    for offset, stamp in zip(firsts, round_start, strict=True):
        assert api.search("ts", 0, stamp) == offset
        if offset:
            # Any time after the previous round's last store time finds this round's first message.
            assert api.search("ts", 0, stamps[offset - 1] + 1) == offset
            assert api.search("ts", 0, stamps[offset - 1]) < offset
    assert api.search("ts", 0, 0) == 0
    # Later than everything stored: the max offset.
    assert api.search("ts", 0, stamps[-1] + 60_000) == 15
    assert (api.min_offset("ts", 0), api.max_offset("ts", 0)) == (0, 15)
    # An empty queue.
    assert (api.min_offset("ts", 1), api.max_offset("ts", 1), api.search("ts", 1, now_ms())) == (0, 0, 0)


def test_pull_outside_the_queue_is_offset_illegal(api: Api):
    api.create_topic("illegal", 1)
    api.send("illegal", *[msg(str(i)) for i in range(3)], queue_id=0)
    far = api.pull("illegal", 0, 50)
    assert far.status == OFFSET_ILLEGAL and not far.messages
    # As RocketMQ: beyond the max of a queue that starts at 0 (typically re-created), start over at 0.
    assert (far.next_begin_offset, far.min_offset, far.max_offset) == (0, 0, 3)


# -- bad input -------------------------------------------------------------------

BAD_NAME = "bad topic!"
LONG_NAME = "t" * 128


def _queue_state(api: Api, topic: str, queues: int) -> list[int]:
    return [api.max_offset(topic, q) for q in range(queues)]


def test_bad_sends_are_refused_and_change_nothing(api: Api):
    api.create_topic("bad-send", 2)
    api.send("bad-send", msg("kept"), queue_id=0)
    before_topics = api.topics()
    send = api.messaging.SendMessage
    S = messaging_pb2.SendMessageRequest
    IA, NF = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    one = [msg("x")]
    expect_error(send, S(topic=BAD_NAME, messages=one), IA, "topic name", "may only contain")
    expect_error(send, S(topic=LONG_NAME, messages=one), IA, "128 characters", "at most 127")
    expect_error(send, S(topic="", messages=one), IA, "topic name must not be empty")
    expect_error(send, S(topic="no-such-topic", messages=one), NF, "'no-such-topic' does not exist")
    expect_error(send, S(topic="bad-send", queue_id=2, messages=one), IA, "queue id 2 is out of range", "0..1")
    expect_error(send, S(topic="bad-send", queue_id=-1, messages=one), IA, "queue id -1 is out of range")
    expect_error(send, S(topic="bad-send", messages=[]), IA, "empty batch")
    expect_error(send, S(topic="bad-send", messages=[msg(b"x" * MAX_MESSAGE_SIZE)]), IA,
                 f"max_message_size is {MAX_MESSAGE_SIZE}")
    # One oversize message refuses the whole batch: nothing of it is stored.
    expect_error(send, S(topic="bad-send", queue_id=1,
                         messages=[msg("fine"), msg(b"y" * (MAX_MESSAGE_SIZE + 1)), msg("fine too")]),
                 IA, "message 1 of the batch", "max_message_size")
    expect_error(send, S(topic="bad-send", messages=[msg("x", tags="a||b")]), IA, "must not contain '||'")
    expect_error(send, S(topic="bad-send", messages=[msg("x", properties={"k\x01": "v"})]), IA, "control characters")
    assert _queue_state(api, "bad-send", 2) == [1, 0]
    assert api.topics() == before_topics
    assert [m.body for m in api.pull("bad-send", 0, 0).messages] == [b"kept"]


def test_message_just_under_the_limit_is_accepted(api: Api):
    api.create_topic("limit", 1)
    # body + properties (UNIQ_KEY is 8 + 32 characters plus separators) must fit max_message_size.
    body = b"z" * (MAX_MESSAGE_SIZE - 100)
    assert api.send("limit", msg(body), queue_id=0).results[0].queue_offset == 0
    assert api.pull("limit", 0, 0).messages[0].body == body


def test_default_max_message_size_is_4_mib(broker):
    api = Api.connect(broker.address)
    try:
        api.create_topic("big", 1)
        expect_error(api.messaging.SendMessage,
                     messaging_pb2.SendMessageRequest(topic="big", messages=[msg(b"b" * (4 * 1024 * 1024 + 1))]),
                     grpc.StatusCode.INVALID_ARGUMENT, "max_message_size is 4194304")
        assert api.max_offset("big", 0) == 0
        # 3 MiB is fine.
        assert api.send("big", msg(b"b" * (3 * 1024 * 1024)), queue_id=0).results[0].queue_offset == 0
    finally:
        api.channel.close()


def test_bad_pulls_and_offset_queries_are_refused(api: Api):
    api.create_topic("bad-pull", 2)
    api.send("bad-pull", msg("x"), queue_id=0)
    pull = api.messaging.PullMessage
    P = messaging_pb2.PullMessageRequest
    IA, NF = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    expect_error(pull, P(topic=BAD_NAME, queue_id=0), IA, "may only contain")
    expect_error(pull, P(topic="no-such-topic", queue_id=0), NF, "'no-such-topic' does not exist")
    expect_error(pull, P(topic="bad-pull", queue_id=2), IA, "queue id 2 is out of range", "0..1")
    expect_error(pull, P(topic="bad-pull", queue_id=-3), IA, "queue id -3 is out of range")
    expect_error(pull, P(topic="bad-pull", queue_id=0, queue_offset=-1), IA, "queue offset must be >= 0, got -1")
    expect_error(pull, P(topic="bad-pull", queue_id=0, subscription="a || "), IA, "tag expression", "empty tag")
    expect_error(pull, P(topic="bad-pull", queue_id=0, subscription="||"), IA, "empty tag")
    expect_error(pull, P(topic="bad-pull", queue_id=0, max_msg_nums=5000), IA, "max_msg_nums", "5000")
    expect_error(pull, P(topic="bad-pull", queue_id=0, suspend_timeout_ms=-1), IA, "suspend_timeout_ms")
    expect_error(pull, P(topic="bad-pull", queue_id=0, commit_offset=1), IA, "needs a group")

    Q = offsets_pb2.QueueRequest
    for call in (api.offsets.GetMinOffset, api.offsets.GetMaxOffset):
        expect_error(call, Q(topic="no-such-topic", queue_id=0), NF, "does not exist")
        expect_error(call, Q(topic=BAD_NAME, queue_id=0), IA, "may only contain")
        expect_error(call, Q(topic="bad-pull", queue_id=9), IA, "queue id 9 is out of range")
    search = api.offsets.SearchOffsetByTimestamp
    T = offsets_pb2.SearchOffsetByTimestampRequest
    expect_error(search, T(topic="bad-pull", queue_id=0, timestamp=-5), IA, "timestamp must be >= 0")
    expect_error(search, T(topic="bad-pull", queue_id=7, timestamp=0), IA, "queue id 7 is out of range")
    expect_error(search, T(topic="nope", queue_id=0, timestamp=0), NF, "does not exist")
    view = api.messaging.ViewMessage
    V = messaging_pb2.ViewMessageRequest
    expect_error(view, V(topic="bad-pull", queue_id=0, queue_offset=1), NF, "no message at bad-pull:0@1")
    assert _queue_state(api, "bad-pull", 2) == [1, 0]


def test_bad_topic_admin_requests_are_refused(api: Api):
    api.create_topic("dup", 3)
    before = api.topics()
    create = api.admin.CreateTopic
    C = admin_pb2.CreateTopicRequest
    IA = grpc.StatusCode.INVALID_ARGUMENT
    expect_error(create, C(name="dup", queue_nums=8), grpc.StatusCode.ALREADY_EXISTS, "'dup' already exists")
    expect_error(create, C(name="%RETRY%mine", queue_nums=1), IA, "reserved", "'%'")
    expect_error(create, C(name="%DLQ%mine", queue_nums=1), IA, "reserved")
    expect_error(create, C(name=BAD_NAME, queue_nums=1), IA, "may only contain")
    expect_error(create, C(name=LONG_NAME, queue_nums=1), IA, "at most 127")
    expect_error(create, C(name="zero-queues", queue_nums=0), IA, "queue_nums must be between 1 and")
    expect_error(api.admin.DeleteTopic, admin_pb2.DeleteTopicRequest(name="never-made"),
                 grpc.StatusCode.NOT_FOUND, "'never-made' does not exist")
    assert api.topics() == before
    # The duplicate create did not change the existing topic.
    route = api.admin.GetRoute(admin_pb2.GetRouteRequest(topic="dup"), timeout=TIMEOUT)
    [data] = route.queue_datas
    assert (data.read_queue_nums, data.write_queue_nums, data.broker_name) == (3, 3, "broker-a")


def test_broker_still_serves_after_bad_input(api: Api):
    status = api.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    api.create_topic("after", 1)
    assert api.send("after", msg("ok"), queue_id=0).results[0].queue_offset == 0


def test_closed_topics_and_the_schedule_topic_refuse_with_permission_denied(api: Api):
    api.create_topic("closed", 1)
    api.create_topic("target", 1)
    api.send("closed", msg("before"), queue_id=0)
    PD = grpc.StatusCode.PERMISSION_DENIED
    update = api.admin.UpdateTopic
    update(admin_pb2.UpdateTopicRequest(name="closed", readable=False), timeout=TIMEOUT)
    expect_error(api.messaging.PullMessage, messaging_pb2.PullMessageRequest(topic="closed", queue_id=0), PD,
                 "'closed' is not readable")
    update(admin_pb2.UpdateTopicRequest(name="closed", readable=True, writable=False), timeout=TIMEOUT)
    expect_error(api.messaging.SendMessage, messaging_pb2.SendMessageRequest(topic="closed", messages=[msg("x")]),
                 PD, "'closed' is not writable")
    assert [m.body for m in api.pull("closed", 0, 0).messages] == [b"before"]

    # Only the broker writes the schedule topic: a producer message there would be re-put on whatever
    # REAL_TOPIC it names, past that topic's permissions.
    schedule = "SCHEDULE_TOPIC_XXXX"
    before = [api.max_offset(schedule, q) for q in range(18)]
    smuggled = msg("smuggled", properties={"REAL_TOPIC": "closed", "REAL_QID": "0"})
    expect_error(api.messaging.SendMessage, messaging_pb2.SendMessageRequest(
        topic=schedule, queue_id=0, messages=[smuggled]), PD, "schedule topic", "forbidden")
    assert [api.max_offset(schedule, q) for q in range(18)] == before
    # A delayed send is the way in, and lands on the real topic only once due (level 1 = 1 s).
    sent = api.send("target", msg("later", delay_level=1), queue_id=0).results[0]
    assert api.max_offset("target", 0) == 0
    response = api.pull("target", 0, 0, suspend_ms=10_000)
    assert response.status == FOUND and response.messages[0].msg_id == sent.msg_id
    assert api.max_offset("closed", 0) == 1
