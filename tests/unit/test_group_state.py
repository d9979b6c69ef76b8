"""group_state (client/types.py): Stable, Rebalancing, Empty, Dead from members and committed queues."""

from __future__ import annotations

from tidemark.client.message import MessageQueue
from tidemark.client.types import GroupMember, GroupState, group_state


def q(topic: str, queue_id: int) -> MessageQueue:
    return MessageQueue(topic, "broker-a", queue_id)


def member(client_id: str, owned=(), topics=("T",), model="CLUSTERING", kind="CONSUME_PASSIVELY") -> GroupMember:
    return GroupMember(client_id, "h", tuple((t, "*") for t in topics), tuple(owned), model, kind, False, 0, "AVG")


def test_no_member_is_empty_with_offsets_and_dead_without():
    assert group_state([], [q("T", 0)]) is GroupState.EMPTY
    assert group_state([], []) is GroupState.DEAD


def test_push_members_are_stable_once_every_committed_queue_of_their_topics_has_an_owner():
    queues = [q("T", 0), q("T", 1), q("Old", 0)]  # Old: no member subscribes it any more
    assert group_state([member("a", [q("T", 0)]), member("b", [q("T", 1)])], queues) is GroupState.STABLE
    assert group_state([member("a", [q("T", 0)]), member("b")], queues) is GroupState.REBALANCING
    assert group_state([member("a", [q("T", 0), q("T", 1)]), member("b")], queues) is GroupState.STABLE


def test_members_that_own_no_queues_by_design_are_stable():
    for kw in (dict(model="BROADCASTING"), dict(kind="CONSUME_ACTIVELY"), dict(kind="CONSUME_POP")):
        assert group_state([member("a", **kw)], [q("T", 0)]) is GroupState.STABLE
