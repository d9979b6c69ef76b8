"""SQL92 property filters against a real broker process, through the raw Tidemark v1 stubs: a pull and a fetch
stream with an SQL92 subscription get exactly the matching messages, the group's lag reaches 0 (skipped
messages advance its offsets), a consumer's heartbeat registers the subscription as SQL92, and a bad
expression is INVALID_ARGUMENT naming the column, at subscribe time and at pull time."""

from __future__ import annotations

import threading

import grpc
import pytest
from brokerproc import BrokerStubs

from tidemark.client import Admin, MessageSelector
from tidemark.v1 import admin_pb2, common_pb2, membership_pb2, messaging_pb2

TIMEOUT = 10
SQL = "region = 'eu' AND amount > 100"
ROWS = [(region, amount) for amount in ("50", "150", "abc", "101") for region in ("eu", "us", "")]


def wanted(region: str, amount: str) -> bool:
    return region == "eu" and amount.isdigit() and int(amount) > 100


@pytest.fixture(scope="module")
def stubs(module_broker):
    with BrokerStubs(module_broker.address) as s:
        yield s


def setup_topic(stubs: BrokerStubs, topic: str, copies: int = 1) -> list[tuple[str, str]]:
    """One queue of ROWS (a message without a region has none), `copies` times over; the rows as sent."""
    stubs.admin.CreateTopic(admin_pb2.CreateTopicRequest(name=topic, queue_nums=1), timeout=TIMEOUT)
    sent = ROWS * copies
    messages = [common_pb2.Message(body=f"{i}".encode(), tags="t",
                                   properties={"amount": amount, **({"region": region} if region else {})})
                for i, (region, amount) in enumerate(sent)]
    stubs.messaging.SendMessage(messaging_pb2.SendMessageRequest(topic=topic, queue_id=0, messages=messages),
                                timeout=TIMEOUT)
    return sent


def pull(stubs: BrokerStubs, topic: str, offset: int, *, group: str = "", subscription: str = SQL,
         commit: int | None = None, max_nums: int = 4):
    request = messaging_pb2.PullMessageRequest(group=group, topic=topic, queue_id=0, queue_offset=offset,
                                               max_msg_nums=max_nums, subscription=subscription,
                                               expression_type=common_pb2.SQL92)
    if commit is not None:
        request.commit_offset = commit
    return stubs.messaging.PullMessage(request, timeout=TIMEOUT)


def test_a_pull_gets_exactly_the_matching_messages_and_the_group_reaches_lag_0(stubs, module_broker):
    sent = setup_topic(stubs, "SqlPull", copies=3)
    offset, got = 0, []
    while True:
        answer = pull(stubs, "SqlPull", offset, group="g-sql-pull", commit=offset)
        got += [(m.properties.get("region", ""), m.properties["amount"]) for m in answer.messages]
        if answer.next_begin_offset == offset:
            break
        offset = answer.next_begin_offset
    assert got == [row for row in sent if wanted(*row)] and len(got) == 6
    assert offset == len(sent)  # the skipped messages were passed over too
    with Admin(brokers=module_broker.address) as admin:
        [stats] = admin.consume_stats("g-sql-pull", "SqlPull")
    assert (stats.consumer_offset, stats.lag) == (len(sent), 0)


def test_a_fetch_stream_sends_only_the_matching_records(stubs):
    sent = setup_topic(stubs, "SqlFetch", copies=2)
    outbox = [messaging_pb2.FetchRequest(open=messaging_pb2.FetchOpen(
        handle=1, group="g-sql-fetch", topic="SqlFetch", queue_id=0, offset=0, subscription=SQL,
        expression_type=common_pb2.SQL92, credit_messages=100, credit_bytes=10**6, batch_size=32))]
    done = threading.Event()

    def requests():
        yield from outbox
        done.wait(TIMEOUT)

    call = stubs.messaging.Fetch(requests(), timeout=TIMEOUT)
    try:
        frame = next(call)
    finally:
        done.set()
        call.cancel()
    [part] = frame.records
    assert (part.handle, part.count, part.next_offset) == (1, sum(wanted(*r) for r in sent), len(sent))


def test_a_bad_expression_is_refused_with_its_column(stubs):
    stubs.admin.CreateTopic(admin_pb2.CreateTopicRequest(name="SqlBad", queue_nums=1), timeout=TIMEOUT)
    with pytest.raises(grpc.RpcError) as caught:
        pull(stubs, "SqlBad", 0, subscription="region = 'eu' AND amount >")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == ('SQL92 expression "region = \'eu\' AND amount >" at column 27: '
                                      'expected a value')
    heartbeat = membership_pb2.HeartbeatRequest(client_id="c-sql", group="g-sql-bad", subscriptions=[
        common_pb2.Subscription(topic="SqlBad", expression="a != 1", expression_type=common_pb2.SQL92)])
    with pytest.raises(grpc.RpcError) as caught:
        stubs.membership.Heartbeat(heartbeat, timeout=TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "at column 3: '!=' is not SQL92; use '<>'" in caught.value.details()


def test_a_heartbeat_registers_an_sql92_subscription(stubs, module_broker):
    selector = MessageSelector.by_sql("a BETWEEN 1 AND 5")
    stubs.membership.Heartbeat(membership_pb2.HeartbeatRequest(client_id="c-sql", group="g-sql-member", subscriptions=[
        common_pb2.Subscription(topic="SqlMember", expression=selector.expression, expression_type=common_pb2.SQL92),
        common_pb2.Subscription(topic="SqlOther", expression="x || y")]), timeout=TIMEOUT)
    described = stubs.admin.DescribeGroup(admin_pb2.DescribeGroupRequest(group="g-sql-member"), timeout=TIMEOUT)
    [member] = described.members
    assert [(s.topic, s.expression, s.expression_type) for s in member.subscriptions] == [
        ("SqlMember", "a BETWEEN 1 AND 5", common_pb2.SQL92), ("SqlOther", "x || y", common_pb2.TAG)]


def test_tidemark_consumers_and_admin_select_by_sql(stubs, module_broker):
    """The client API: PushConsumer and PullConsumer subscribed with MessageSelector.by_sql get exactly the
    matching messages and their groups reach lag 0; Admin.pull takes a selector too; a bad condition is
    refused at subscribe time with its column."""
    import time

    from tidemark.client import InvalidArgumentError, PullConsumer, PushConsumer
    from tidemark.client.consumer.listener import ConsumeConcurrentlyStatus

    sent = setup_topic(stubs, "SqlClients", copies=3)
    expected = sorted(str(i) for i, row in enumerate(sent) if wanted(*row))
    selector = MessageSelector.by_sql(SQL)
    address = module_broker.address
    with Admin(brokers=address) as admin:
        mq = admin.fetch_message_queues("SqlClients")[0]
        assert sorted(m.body.decode() for m in admin.pull(mq, 0, max_nums=64, subscription=selector).messages) \
            == expected

    got, done = [], threading.Event()

    def listener(msgs, ctx):
        got.extend(m.body.decode() for m in msgs)
        if len(got) >= len(expected):
            done.set()
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    push = PushConsumer(group="sql-push", brokers=address, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    with pytest.raises(InvalidArgumentError, match="column"):
        push.subscribe("SqlClients", MessageSelector.by_sql("amount >"))
    push.subscribe("SqlClients", selector)
    push.register_message_listener(listener)
    push.start()
    try:
        assert done.wait(20), f"got {sorted(got)} of {expected}"
    finally:
        push.shutdown()
    assert sorted(got) == expected

    pull_consumer = PullConsumer(group="sql-pull", brokers=address, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    pull_consumer.subscribe("SqlClients", selector)
    pull_consumer.start()
    try:
        pulled: list[str] = []
        deadline = time.monotonic() + 20
        while len(pulled) < len(expected) and time.monotonic() < deadline:
            pulled.extend(m.body.decode() for m in pull_consumer.poll(timeout=1.0))
        pull_consumer.commit()
    finally:
        pull_consumer.shutdown()
    assert sorted(pulled) == expected
    with Admin(brokers=address) as admin:
        for group in ("sql-push", "sql-pull"):
            stats = admin.consume_stats(group, "SqlClients")
            deadline = time.monotonic() + 15
            while sum(s.lag for s in stats) and time.monotonic() < deadline:  # the push group commits in the back
                time.sleep(0.2)
                stats = admin.consume_stats(group, "SqlClients")
            assert sum(s.lag for s in stats) == 0, (group, stats)
