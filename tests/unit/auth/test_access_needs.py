"""What a read needs (broker/services/access.py): Sub on the topic, and Sub on the group when it has one."""

from __future__ import annotations

from tidemark.broker.auth import Action
from tidemark.broker.auth.guard import on_group, on_topic, retry_topic_owner
from tidemark.broker.services.access import NEEDS
from tidemark.v1 import messaging_pb2


def _fetch(group: str) -> messaging_pb2.FetchRequest:
    request = messaging_pb2.FetchRequest()
    request.open.group, request.open.topic = group, "Orders"
    return request


def test_a_group_read_needs_sub_on_the_group_and_the_topic():
    assert set(NEEDS["Fetch"](_fetch("billing"))) == {on_group("billing", Action.SUB), on_topic("Orders", Action.SUB)}
    pull = messaging_pb2.PullMessageRequest(group="billing", topic="Orders")
    assert set(NEEDS["PullMessage"](pull)) == {on_group("billing", Action.SUB), on_topic("Orders", Action.SUB)}


def test_a_read_without_a_group_needs_sub_on_the_topic_only():
    # Admin.pull, `tidemark message consume` without --group and the Spark source read group-less.
    assert list(NEEDS["Fetch"](_fetch(""))) == [on_topic("Orders", Action.SUB)]
    assert list(NEEDS["PullMessage"](messaging_pb2.PullMessageRequest(topic="Orders"))) == \
        [on_topic("Orders", Action.SUB)]


def test_every_rocketmq5_method_says_what_it_needs():
    """RocketMQ 5's methods have their own table (their names overlap tidemark.v1's, their requests not)."""
    from tidemark.broker.services.access import NEEDS_V2, V2_SERVICE, needs_for
    from tidemark.broker.services.rmq5.service import METHODS, SERVICE

    assert SERVICE == V2_SERVICE
    assert {m.name for m in METHODS} <= set(NEEDS_V2)
    assert needs_for(f"/{SERVICE}/SendMessage") is NEEDS_V2["SendMessage"]


def test_rocketmq5_requests_map_to_topic_and_group_rights():
    from tidemark.broker.services.access import NEEDS_V2
    from tidemark.rmq5.v2 import messaging_pb2 as v2

    def res(name):
        return v2.Resource(name=name)

    send = v2.SendMessageRequest(messages=[v2.Message(topic=res("Orders"))])
    assert list(NEEDS_V2["SendMessage"](send)) == [on_topic("Orders", Action.PUB)]
    receive = v2.ReceiveMessageRequest(group=res("billing"), message_queue=v2.MessageQueue(topic=res("Orders")))
    assert set(NEEDS_V2["ReceiveMessage"](receive)) == {on_group("billing", Action.SUB),
                                                        on_topic("Orders", Action.SUB)}
    settings = v2.TelemetryCommand(settings=v2.Settings(publishing=v2.Publishing(topics=[res("A"), res("B")])))
    assert list(NEEDS_V2["Telemetry"](settings)) == [on_topic("A", Action.PUB), on_topic("B", Action.PUB)]
    assert list(NEEDS_V2["Heartbeat"](v2.HeartbeatRequest(client_type=v2.PRODUCER))) == []


def test_a_pop_groups_retry_topic_belongs_to_the_pop_group():
    """%RETRY%G_T is pop group G's retry topic for topic T (broker/pop/), not a group named G_T: read so once
    G and T exist and no group G_T does; a group that exists keeps its own %RETRY%."""
    groups, topics = {"pop", "a", "a_b"}, {"Orders", "b", "x_y"}

    def owner(topic: str) -> str:
        return retry_topic_owner(topic, groups.__contains__, topics.__contains__)

    assert owner("%RETRY%pop_Orders") == "pop"
    assert owner("%RETRY%pop_x_y") == "pop"  # topic names hold "_" too
    assert owner("%RETRY%a_b") == "a_b"  # group a_b's own retry topic, not a's retries of topic b
    assert owner("%RETRY%pop") == "pop"
    assert owner("%RETRY%pop_Gone") == "pop_Gone"  # no topic Gone: no split to believe
    assert owner("%RETRY%_Orders") == "_Orders"
    # The requirement on_topic gives is the name's reading; the guard asks the broker which group owns it.
    assert on_topic("%RETRY%pop_Orders", Action.SUB).resource.name == "pop_Orders"
    assert on_topic("%RETRY%pop_Orders", Action.SUB).retry_topic == "%RETRY%pop_Orders"
    assert on_topic("%DLQ%pop", Action.GET).retry_topic == ""
