"""MessageGroups: orderly consumption per message group (one worker per group, order per group, a
suspended group holds back only itself), with the ProcessQueue's commit offset (never past an
unfinished message, never back)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tidemark.client.consumer.message_groups import NO_GROUP, MessageGroups, group_of
from tidemark.client.consumer.process_queue import ProcessQueue
from tidemark.client.errors import InvalidArgumentError
from tidemark.client.message import Message, MessageExt, MessageQueue
from tidemark.client.producer.selector import SelectMessageQueueByHash, route_by_group
from tidemark.common.protocol import PropertyKey


def msg(offset: int, group: str = NO_GROUP) -> MessageExt:
    props = {PropertyKey.SHARDING_KEY: group} if group else {}
    return MessageExt(topic="t", broker_name="broker-a", queue_id=0, queue_offset=offset, msg_id=f"id-{offset}",
                      body=b"x", properties=props, store_size=1)


def offsets(batch) -> list[int]:
    return [m.queue_offset for m in batch]


def test_messages_without_a_group_are_one_group_taken_in_offset_order():
    groups = MessageGroups()
    assert groups.add([msg(0), msg(1), msg(2)]) == [NO_GROUP]
    assert group_of(msg(0)) == NO_GROUP
    assert offsets(groups.take(NO_GROUP, 2)) == [0, 1]
    assert groups.add([msg(3)]) == []  # the group's worker is still there: it takes them
    assert offsets(groups.take(NO_GROUP, 5)) == [2, 3]
    assert groups.take(NO_GROUP, 5) == []
    assert groups.stop(NO_GROUP) is False and not groups.busy


def test_a_suspended_group_holds_back_only_itself():
    groups, pq = MessageGroups(), ProcessQueue()
    pulled = [msg(0, "slow"), msg(1, "a"), msg(2, "slow"), msg(3, "b"), msg(4, "a")]
    pq.put_messages(pulled)
    assert groups.add(pulled) == ["slow", "a", "b"]
    first = groups.take("slow", 1)
    groups.put_back("slow", [m.replace(reconsume_times=1) for m in first])  # suspended: its worker waits
    done = []
    for group in ("a", "b"):
        while batch := groups.take(group, 1):
            done += offsets(batch)
            assert pq.remove_messages(batch) == 0  # the slow group's first message holds the commit
    assert done == [1, 4, 3] and groups.waiting("slow") == 2
    again = groups.take("slow", 1)
    assert offsets(again) == [0] and again[0].reconsume_times == 1  # the same batch first, in place
    assert pq.remove_messages(again) == 2
    assert pq.remove_messages(groups.take("slow", 1)) == 5


def test_messages_added_while_a_worker_ends_are_handed_to_a_new_one():
    groups = MessageGroups()
    groups.add([msg(0, "g")])
    assert offsets(groups.take("g", 1)) == [0]
    assert groups.take("g", 1) == []  # the worker is ending ...
    assert groups.add([msg(1, "g")]) == []  # ... and still counts: no second worker
    assert groups.stop("g") is True and groups.claim("g") and not groups.claim("g")
    assert offsets(groups.take("g", 1)) == [1]


def test_a_stopped_group_waits_for_a_claim_and_repulled_offsets_are_ignored():
    groups = MessageGroups()
    groups.add([msg(0, "g"), msg(1, "h")])
    batch = groups.take("g", 1)
    groups.put_back("g", batch)  # skipped: the consumer was suspended
    assert groups.stop("g") is True and not groups.has_worker("g")
    assert groups.add([msg(0, "g"), msg(1, "h")]) == []  # seen already
    assert groups.unclaimed() == ["g"] and groups.has_worker("g")
    assert offsets(groups.take("g", 5)) == [0]
    with pytest.raises(ValueError):
        groups.take("g", 0)


class MessageGroupsModel(RuleBasedStateMachine):
    """Workers of a consume service, driven in any interleaving: pulls, takes, successes, suspends,
    skips (a worker that ends with its batch put back), ends of workers whose group ran dry."""

    def __init__(self) -> None:
        super().__init__()
        self.groups, self.pq = MessageGroups(), ProcessQueue()
        self.next_offset = 0
        self.sent: dict[str, list[int]] = {}
        self.consumed: dict[str, list[int]] = {}
        self.suspends: dict[int, int] = {}  # offset -> times its batch was suspended
        # group -> its worker's batch out ([] none, None: its take came back empty, the worker is ending)
        self.workers: dict[str, list[MessageExt] | None] = {}
        self.committed = -1

    def _unfinished(self) -> list[int]:
        return [o for g, sent in self.sent.items() for o in sent[len(self.consumed.get(g, [])):]]

    @rule(picks=st.lists(st.sampled_from([NO_GROUP, "a", "b", "c"]), min_size=1, max_size=4),
          repull=st.booleans())
    def pull(self, picks, repull):
        batch = [msg(self.next_offset + i, g) for i, g in enumerate(picks)]
        if repull and self.next_offset:
            batch.insert(0, msg(self.next_offset - 1, picks[0]))  # already seen: must be ignored
            self.pq.put_messages(batch[1:])
        else:
            self.pq.put_messages(batch)
        self.next_offset += len(picks)
        for i, g in enumerate(picks):
            self.sent.setdefault(g, []).append(self.next_offset - len(picks) + i)
        for g in self.groups.add(batch):
            assert g not in self.workers, f"a second worker for group {g!r}"
            self.workers[g] = []

    def _idle_workers(self):
        return sorted(g for g, out in self.workers.items() if out == [])

    def _busy_workers(self):
        return sorted(g for g, out in self.workers.items() if out)

    @precondition(lambda self: self._idle_workers())
    @rule(data=st.data(), size=st.integers(1, 3))
    def take(self, data, size):
        g = data.draw(st.sampled_from(self._idle_workers()))
        batch = self.groups.take(g, size)
        if not batch:
            self.workers[g] = None
            return
        done = len(self.consumed.get(g, []))
        assert offsets(batch) == self.sent[g][done:done + len(batch)], "a group's messages out of order"
        for m in batch:
            assert m.reconsume_times == self.suspends.get(m.queue_offset, 0)
        self.workers[g] = batch

    @precondition(lambda self: self._busy_workers())
    @rule(data=st.data())
    def succeed(self, data):
        g = data.draw(st.sampled_from(self._busy_workers()))
        batch, self.workers[g] = self.workers[g], []
        self.consumed.setdefault(g, []).extend(offsets(batch))
        offset = self.pq.remove_messages(batch)
        if offset >= 0:
            assert offset >= self.committed, "the commit offset moved back"
            unfinished = self._unfinished()
            assert offset <= min(unfinished, default=self.next_offset), "committed past an unfinished message"
            self.committed = offset

    @precondition(lambda self: self._busy_workers())
    @rule(data=st.data())
    def suspend(self, data):
        g = data.draw(st.sampled_from(self._busy_workers()))
        batch, self.workers[g] = self.workers[g], []
        for m in batch:
            self.suspends[m.queue_offset] = self.suspends.get(m.queue_offset, 0) + 1
        self.groups.put_back(g, [m.replace(reconsume_times=m.reconsume_times + 1) for m in batch])

    @precondition(lambda self: self._busy_workers())
    @rule(data=st.data())
    def skip(self, data):
        g = data.draw(st.sampled_from(self._busy_workers()))
        self.groups.put_back(g, self.workers.pop(g))
        assert self.groups.stop(g) is True
        assert self.groups.claim(g)  # resumed: a new worker
        self.workers[g] = []

    @precondition(lambda self: any(out is None for out in self.workers.values()))
    @rule(data=st.data())
    def end(self, data):
        g = data.draw(st.sampled_from(sorted(g for g, out in self.workers.items() if out is None)))
        del self.workers[g]
        if self.groups.stop(g):
            assert self.groups.claim(g)
            self.workers[g] = []

    @invariant()
    def every_waiting_message_has_a_worker_and_none_is_lost(self):
        for g, sent in self.sent.items():
            out = self.workers.get(g) or []
            left = len(sent) - len(self.consumed.get(g, []))
            assert self.groups.waiting(g) + len(out) == left
            if self.groups.waiting(g):
                assert g in self.workers and self.groups.has_worker(g)
        assert self.committed <= min(self._unfinished(), default=self.next_offset)


TestMessageGroupsModel = MessageGroupsModel.TestCase
TestMessageGroupsModel.settings = settings(max_examples=30, stateful_step_count=30, deadline=None)


# -- the producer's side: Message.message_group ------------------------------------------------


@pytest.mark.parametrize("group", ["", "   ", "g" * 65, "a\x01b", "tab\there", 7])
def test_a_bad_message_group_is_refused_when_the_message_is_made(group):
    with pytest.raises(InvalidArgumentError):
        Message("T", b"x", message_group=group)


def test_the_group_is_the_sharding_key_property_both_ways():
    m = Message("T", b"x", message_group="order-1")
    assert m.properties == {PropertyKey.SHARDING_KEY: "order-1"}
    copy = Message(m.topic, m.body, properties={**m.properties, "traceparent": "t"})  # copies keep the group
    assert copy.message_group == "order-1" and Message("T", b"x").message_group is None
    with pytest.raises(InvalidArgumentError, match="differs"):
        Message("T", b"x", properties={PropertyKey.SHARDING_KEY: "a"}, message_group="b")


def test_a_grouped_message_without_queue_or_selector_is_routed_by_the_hash_of_its_group():
    queues = [MessageQueue("T", "broker-a", i) for i in range(8)]
    grouped, plain = Message("T", b"x", message_group="order-7"), Message("T", b"x")
    selector = route_by_group([grouped], None, None)
    assert selector.select(queues, grouped, None) == SelectMessageQueueByHash().select(queues, None, "order-7")
    assert route_by_group([plain], None, None) is None
    assert route_by_group([grouped], queues[0], None) is None  # an explicit queue or selector wins
    mine = SelectMessageQueueByHash()
    assert route_by_group([grouped], None, mine) is mine


def test_a_batch_routed_by_group_must_hold_one_group():
    """Review: a batch went where its first message's group goes, so another group's message in it left
    its group's queue and that group's order was lost."""
    a, b, plain = (Message("T", b"x", message_group="a"), Message("T", b"x", message_group="b"),
                   Message("T", b"x"))
    assert route_by_group([a, a], None, None) is not None
    for batch in ([a, b], [plain, a], [a, plain]):
        with pytest.raises(InvalidArgumentError, match="several message groups"):
            route_by_group(batch, None, None)
    assert route_by_group([a, b], MessageQueue("T", "broker-a", 0), None) is None  # the caller named the queue


@pytest.mark.parametrize("stored", ["", "g" * 65, "line\nbreak"])
def test_a_stored_sharding_key_that_is_no_group_stays_a_plain_property(stored):
    """Review: other producers store what they like under __SHARDINGKEY; a copy of such a message (a retry
    sent back, a DLQ requeue) was refused when made, so it could never be sent back."""
    m = Message("T", b"x", properties={PropertyKey.SHARDING_KEY: stored})
    assert m.message_group is None and m.properties == {PropertyKey.SHARDING_KEY: stored}
    # The broker's FIFO rule reads the raw property as the group: its messages still share a queue.
    queues = [MessageQueue("T", "broker-a", i) for i in range(8)]
    assert route_by_group([m], None, None).select(queues, m, None) == \
        SelectMessageQueueByHash().select(queues, None, stored)
