"""What a read needs (broker/services/access.py): Sub on the topic, and Sub on the group when it has one."""

from __future__ import annotations

from broker.auth import Action
from broker.auth.guard import on_group, on_topic
from broker.services.access import NEEDS
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
