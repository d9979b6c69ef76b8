"""FIFO per message group in the pop ledger (broker/pop/fifo.py): an unfinished message holds back only
the later messages of its own group; redelivery in place; the committed offset never passes an unfinished
message; the journal and the snapshot keep groups and held messages.

The property test drives the ledger as the broker does (ready redeliveries, then a window of new messages
from a store of messages with groups, some filtered out) through random pops, acks, expiries, dead letters
and restarts, against a model that knows every message's group and status."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tidemark.broker.pop.handles import QueueKey
from tidemark.broker.pop.inflight import summarize
from tidemark.broker.pop.journal import decode_events, encode_event
from tidemark.broker.pop.ledger import Pending, PopLedger, Popped, PopSettings

K = QueueKey("g", "T", 0)
MIN = 60_000


def ledger_with(*, cap=100, events=None) -> PopLedger:
    ledger = PopLedger(PopSettings(max_inflight_per_queue=cap), sink=events.extend if events is not None else None)
    ledger.ensure_queue(K, 0)
    return ledger


def fifo_pop(ledger, groups, *, limit=8, now=0, invisible=MIN):
    """A FIFO pop as the broker makes it: the ready redeliveries, then every stored message from the cursor
    (groups[offset] is the message group of each offset)."""
    redeliver = [p.offset for p in ledger.fifo_ready(K, limit)]
    cursor = ledger.cursor(K)
    fresh = [(o, 1, groups[o]) for o in range(cursor, len(groups))]
    return ledger.pop_fifo(K, redeliver, fresh, len(groups), limit=limit, now_ms=now, invisible_ms=invisible,
                           client_id="c")


def offsets(result) -> list[int]:
    return [h.offset for h in result.handles]


def test_an_unacked_message_holds_back_only_its_own_group():
    groups = ["a", "b", "a", "c", "b", "a"]
    ledger = ledger_with()
    first = fifo_pop(ledger, groups[:2], limit=1)  # a@0
    assert offsets(first) == [0]
    # a is busy: a@2 and a@5 wait (held in place), b and c flow.
    assert offsets(fifo_pop(ledger, groups)) == [1, 3, 4]
    assert [(p.offset, p.held) for p in ledger.pending(K)] == [(2, True), (5, True)]
    assert ledger.cursor(K) == 6 and ledger.watermark(K) == 0
    assert ledger.ack(first.handles[0]) == 1  # the committed offset stops at b@1, still in flight
    assert offsets(fifo_pop(ledger, groups)) == [2, 5]  # a's next ones, in order, ahead of nothing else


def test_an_expired_message_comes_back_in_place_before_the_later_ones_of_its_group():
    groups = ["a", "a", "b"]
    ledger = ledger_with()
    r = fifo_pop(ledger, groups[:1], invisible=1000)
    assert offsets(fifo_pop(ledger, groups)) == [2]  # a@1 held behind a@0
    (e,) = [e for e in ledger.expired(1000) if e.offset == 0]
    ledger.redeliver_in_place(K, 0, e.entry.pop_id)
    again = fifo_pop(ledger, groups, now=1000)
    assert [(h.offset, h.attempt) for h in again.handles] == [(0, 2), (1, 1)]
    assert r.handles[0].pop_id != again.handles[0].pop_id


def test_a_busy_groups_backlog_is_held_once_and_the_cursor_moves_past_it():
    ledger = ledger_with(cap=4)
    fifo_pop(ledger, [""], limit=1)
    # Messages without a group are one group: they wait, in order, but are read once, not at every pop.
    assert fifo_pop(ledger, ["", "", ""]).handles == () and ledger.cursor(K) == 3
    assert [p.offset for p in ledger.pending(K)] == [1, 2] and ledger.watermark(K) == 0
    # Up to the cap (in flight + held): then the queue takes nothing new, whatever the group.
    assert fifo_pop(ledger, ["", "", "", "", "x", "y"]).handles == () and ledger.cursor(K) == 4
    assert ledger.room(K) == 0 and fifo_pop(ledger, ["", "", "", "", "x", "y"]).handles == ()
    assert ledger.cursor(K) == 4


def test_entries_of_no_recorded_group_block_every_group():
    ledger = ledger_with()
    ledger.pop(K, [(0, 1)], 1, now_ms=0, invisible_ms=MIN, client_id="c")  # a concurrent pop: group unknown
    assert fifo_pop(ledger, ["x", "y"]).handles == ()
    ledger.ack(ledger.expired(10**12)[0].handle)
    assert offsets(fifo_pop(ledger, ["x", "y"])) == [1]


def test_an_entry_of_no_recorded_group_waiting_again_holds_back_the_later_entries_of_every_group():
    ledger = ledger_with()
    fifo_pop(ledger, ["b"], limit=1)  # b@0 in flight, its group recorded
    ledger.pop(K, [(1, 1)], 2, now_ms=0, invisible_ms=1000, client_id="c")  # x@1 by a concurrent pop: unrecorded
    assert fifo_pop(ledger, ["b", "x", "c"]).handles == ()  # c@2 held: x@1 may be of any group
    [x] = ledger.expired(1000)
    ledger.redeliver_in_place(K, x.offset, x.entry.pop_id)  # x@1 waits again, still of no recorded group
    assert ledger.fifo_ready(K, 8) == []  # c@2's group is free, but x@1 before it waits for b@0
    ledger.ack(ledger.expired(10**12)[0].handle)
    assert [p.offset for p in ledger.fifo_ready(K, 8)] == [1, 2]


def test_redeliveries_that_skip_one_of_their_group_or_a_busy_group_are_refused():
    groups = ["a", "a", "b", "a"]
    ledger = ledger_with()
    fifo_pop(ledger, groups, limit=3, invisible=0)  # a@0, a@1, b@2
    for e in ledger.expired(0):
        ledger.redeliver_in_place(K, e.offset, e.entry.pop_id)
    with pytest.raises(ValueError, match="not the first"):
        ledger.pop_fifo(K, [1], [], 4, limit=8, now_ms=0, invisible_ms=MIN, client_id="c")
    ledger.pop_fifo(K, [0], [], 3, limit=8, now_ms=0, invisible_ms=MIN, client_id="c")
    with pytest.raises(ValueError, match="not the first"):
        ledger.pop_fifo(K, [1], [], 3, limit=8, now_ms=0, invisible_ms=MIN, client_id="c")


def test_the_in_flight_cap_counts_held_messages():
    ledger = ledger_with(cap=3)
    fifo_pop(ledger, ["a"], limit=1)
    r = fifo_pop(ledger, ["a", "a", "b", "c"])
    assert offsets(r) == [2] and ledger.cursor(K) == 3 and ledger.room(K) == 0  # a@0, a@1 held, b@2

    row = summarize(ledger, [K], 0, lambda topic, queue_id: 4)[0]
    assert (row.inflight, row.pending_redelivery, row.waiting) == (2, 0, 2)  # a@1 held, c@3 after the cursor


def test_groups_and_held_messages_survive_the_journal_and_the_snapshot():
    events: list = []
    ledger = ledger_with(events=events)
    fifo_pop(ledger, ["a"], limit=1)
    fifo_pop(ledger, ["a", "a", "b", "a", "é"])
    popped = [e for e in events if isinstance(e, Popped)]
    assert popped[-1].groups == ("b", "é") and [h[0] for h in popped[-1].held] == [1, 3]
    data = b"".join(encode_event(e) for e in events)
    assert decode_events(data).items == events
    again = PopLedger()
    assert all(again.apply(e) for e in events) and again.snapshot() == ledger.snapshot()
    doc = ledger.snapshot()
    restored = PopLedger.from_snapshot(doc)
    assert restored.snapshot() == doc
    assert restored.pending(K) == [Pending(1, 1, 0, "a"), Pending(3, 1, 0, "a")]
    assert offsets(fifo_pop(restored, ["a", "a", "b", "a", "é"])) == []  # a@0 still in flight


def test_a_pop_without_groups_is_written_in_the_older_shape():
    e = Popped(K, 0, 2, 5, "c", False, 0, ((0, 7, 1), (1, 8, 1)), 3)
    assert encode_event(e)[8:] == b'[3,"g","T",0,0,2,5,"c",0,0,[0,7,1,1,8,1],3]'
    ledger = ledger_with()
    ledger.pop(K, [(0, 1)], 1, now_ms=0, invisible_ms=MIN, client_id="c")
    assert [len(row) for row in ledger.snapshot()["queues"][0]["inflight"]] == [8]


# -- the rule, for any interleaving ------------------------------------------------------------------------

GROUPS = ["a", "b", "c", ""]


class FifoModel(RuleBasedStateMachine):
    @initialize(cap=st.sampled_from([4, 1000]))
    def start(self, cap):
        self.settings = PopSettings(max_inflight_per_queue=cap)
        self.events: list = []
        self.ledger = PopLedger(self.settings, sink=self.events.extend)
        self.ledger.ensure_queue(K, 0)
        self.store: list[tuple[str, bool]] = []  # (group, matches the filter) per offset
        self.done: set[int] = set()  # acked, filtered out or dead-lettered
        self.inflight: dict = {}  # offset -> current handle
        self.pending: set[int] = set()
        self.unrecorded: set[int] = set()  # unfinished offsets whose group the ledger does not know
        self.first_deliveries: dict[str, list[int]] = {g: [] for g in GROUPS}
        self.now = 0
        self.last_watermark = 0

    def group(self, offset: int) -> str:
        return self.store[offset][0]

    def recorded(self, offset: int) -> str | None:
        return None if offset in self.unrecorded else self.group(offset)

    def expected_ready(self, limit: int) -> list[int]:
        """fifo.ready's rule, entry by entry: groups with nothing in flight; an entry of no recorded group
        only when nothing is in flight, and nothing after it before it."""
        busy = {self.recorded(o) for o in self.inflight}
        out, stopped = [], set()
        if None in busy:
            return out
        for o in sorted(self.pending):
            g = self.recorded(o)
            if g is None:
                if self.inflight or stopped:
                    break
            elif g in stopped or g in busy:
                stopped.add(g)
                continue
            out.append(o)
        return out[:limit]

    @rule(group=st.sampled_from(GROUPS), matches=st.sampled_from([True, True, True, False]))
    def send(self, group, matches):
        self.store.append((group, matches))

    @rule(limit=st.integers(1, 4), window=st.integers(0, 8))
    def pop(self, limit, window):
        busy = {self.group(o) for o in self.inflight}
        ready = self.ledger.fifo_ready(K, limit)
        assert [p.offset for p in ready] == self.expected_ready(limit)
        cursor = self.ledger.cursor(K)
        end = min(cursor + window, len(self.store))
        fresh = [(o, 1, self.group(o)) for o in range(cursor, end) if self.store[o][1]]
        result = self.ledger.pop_fifo(K, [p.offset for p in ready], fresh, end, limit=limit, now_ms=self.now,
                                      invisible_ms=1000, client_id="c")
        handed: set[int] = set()
        for h in result.handles:
            g = self.group(h.offset)
            assert g not in busy, "a message of a group with a message in flight"
            earlier = [o for o in range(h.offset) if self.group(o) == g and self.store[o][1]
                       and o not in self.done and o not in handed]
            assert earlier == [], f"{h.offset} of {g!r} handed out before {earlier}"
            if h.attempt == 1 and h.offset not in self.pending:
                self.first_deliveries[g].append(h.offset)
            handed.add(h.offset)
            self.pending.discard(h.offset)
            self.inflight[h.offset] = h
        assert len(handed) <= limit and cursor <= result.next_cursor <= end
        for o in range(cursor, result.next_cursor):
            if not self.store[o][1]:
                self.done.add(o)
            elif o not in handed:
                self.pending.add(o)  # held back behind its group
        if len(handed) < limit and self.ledger.room(K) > 0:
            # Under the cap the cursor moves past every message read (none is read again at the next pop),
            # and nothing waits but behind an unfinished message of its own group in flight: no group holds
            # back another.
            assert result.next_cursor == end, "messages of busy groups left to be read again"
            if not self.unrecorded:
                busy = {self.group(o) for o in self.inflight}
                assert all(self.group(o) in busy for o in self.pending), "a waiting message of a free group"

    @rule(limit=st.integers(1, 4), window=st.integers(0, 8))
    def concurrent_pop(self, limit, window):
        """The group is no longer orderly: pending entries go first, in offset order, whatever their group,
        then new messages from the cursor, whose group the ledger does not record."""
        first = self.ledger.first_pending(K, limit)
        assert [p.offset for p in first] == sorted(self.pending)[:limit]
        cursor = self.ledger.cursor(K)
        end = min(cursor + window, len(self.store))
        room = min(limit - len(first), self.ledger.room(K))
        fresh = [o for o in range(cursor, end) if self.store[o][1]][:max(room, 0)]
        next_cursor = cursor if room <= 0 else fresh[-1] + 1 if len(fresh) == room else end  # the service's read
        taken = [(p.offset, p.attempt) for p in first] + [(o, 1) for o in fresh]
        result = self.ledger.pop(K, taken, next_cursor, now_ms=self.now, invisible_ms=1000, client_id="c")
        assert [(h.offset, h.attempt) for h in result.handles] == taken and result.next_cursor == next_cursor
        for h in result.handles:
            self.pending.discard(h.offset)
            self.inflight[h.offset] = h
        self.unrecorded.update(fresh)
        self.done.update(o for o in range(cursor, next_cursor) if not self.store[o][1])

    @precondition(lambda self: self.inflight)
    @rule(data=st.data())
    def ack(self, data):
        offset = data.draw(st.sampled_from(sorted(self.inflight)))
        self.ledger.ack(self.inflight.pop(offset))
        self.done.add(offset)
        self.unrecorded.discard(offset)

    @rule(limit=st.integers(1, 3))
    def expire(self, limit):
        self.now += 1000
        for e in self.ledger.expired(self.now, limit):
            assert self.ledger.redeliver_in_place(K, e.offset, e.entry.pop_id).attempt == e.entry.attempt + 1
            del self.inflight[e.offset]
            self.pending.add(e.offset)

    @precondition(lambda self: self.inflight or self.pending)
    @rule(data=st.data())
    def dead_letter(self, data):
        offset = data.draw(st.sampled_from(sorted([*self.inflight, *self.pending])))
        pop_id = self.inflight.pop(offset).pop_id if offset in self.inflight else \
            next(p.pop_id for p in self.ledger.pending(K) if p.offset == offset)
        self.ledger.revived(K, offset, pop_id)
        self.pending.discard(offset)
        self.done.add(offset)
        self.unrecorded.discard(offset)

    @rule()
    def restart(self):
        doc = self.ledger.snapshot()
        self.ledger = PopLedger.from_snapshot(doc, self.settings, sink=self.events.extend)
        assert self.ledger.snapshot() == doc

    @invariant()
    def the_ledger_holds_what_the_model_holds(self):
        assert set(self.ledger.inflight(K)) == set(self.inflight)
        assert {p.offset for p in self.ledger.pending(K)} == self.pending
        assert all(p.group == self.recorded(p.offset) for p in self.ledger.pending(K))

    @invariant()
    def first_deliveries_of_each_group_come_in_store_order(self):
        for delivered in self.first_deliveries.values():
            assert delivered == sorted(delivered)

    @invariant()
    def the_committed_offset_passes_finished_messages_only_and_never_moves_back(self):
        watermark = self.ledger.watermark(K)
        assert all(o in self.done for o in range(watermark))
        assert watermark == min([*self.inflight, *self.pending, self.ledger.cursor(K)])
        assert watermark >= self.last_watermark
        self.last_watermark = watermark

    @invariant()
    def replaying_the_journal_gives_the_live_state(self):
        again = PopLedger(self.settings)
        for e in decode_events(b"".join(encode_event(e) for e in self.events)).items:
            assert again.apply(e)
        assert again.snapshot() == self.ledger.snapshot()


FifoModel.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
TestFifoModel = FifoModel.TestCase


# -- the broker's receive, across a restart ------------------------------------------------------------


def test_a_slow_group_holds_back_only_itself_and_a_restart_keeps_every_group_in_order(tmp_path):
    from test_pop_service import request

    from tidemark.broker.config import BrokerConfig
    from tidemark.broker.controller import BrokerController
    from tidemark.broker.ingest.send import OutgoingMessage

    async def life(scenario):
        b = BrokerController(BrokerConfig(data_dir=tmp_path, flush_interval_ms=3_600_000))
        b.load()
        await b.start()
        try:
            await scenario(b)
        finally:
            await b.shutdown()

    def bodies(got):
        return [r.message.body.decode() for r in got]

    async def first(b):
        b.topics.create("T", 1)
        b.groups.update("g", consume_orderly=True)
        for body in ["slow-0", "a-0", "slow-1", "a-1", "b-0", "slow-2", "a-2"]:
            group = body.split("-")[0]
            await b.sender.send("T", 0, [OutgoingMessage(body=body.encode(), properties={"__SHARDINGKEY": group})])
        [slow] = await b.pop.receive(request(batch=1))
        assert bodies([slow]) == ["slow-0"]
        got = await b.pop.receive(request(batch=32))
        assert bodies(got) == ["a-0", "a-1", "b-0", "a-2"], "the slow group's messages wait, the others flow"
        for r in got:
            b.pop.ack("g", "T", r.handle)
        assert b.offsets.query("g", "T", 0) <= 0, "the committed offset stays at the unacked slow-0"
        assert await b.pop.receive(request(batch=32)) == []
        state["slow"] = slow.handle

    async def second(b):  # after a restart: slow-0 still in flight, slow-1 and slow-2 still held, in order
        assert await b.pop.receive(request(batch=32)) == []
        b.pop.ack("g", "T", state["slow"])
        got = await b.pop.receive(request(batch=32))
        assert bodies(got) == ["slow-1", "slow-2"] and b.offsets.query("g", "T", 0) == 2
        for r in got:
            b.pop.ack("g", "T", r.handle)
        assert b.offsets.query("g", "T", 0) == 7

    state: dict = {}
    asyncio.run(life(first))
    asyncio.run(life(second))
