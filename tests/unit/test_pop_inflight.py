"""What a pop group has in flight: the ledger keeps each delivery's receive time (journal and snapshot,
older files without it still load), the per-queue summary, and the client's slow/stuck verdict."""

from __future__ import annotations

import json

from tidemark.broker.disk.segments import frame
from tidemark.broker.pop.handles import QueueKey
from tidemark.broker.pop.inflight import summarize
from tidemark.broker.pop.journal import decode_events, encode_event
from tidemark.broker.pop.ledger import PopLedger, Popped
from tidemark.client.group_status import PopCondition, pop_condition, worst_pop_condition
from tidemark.client.message import MessageQueue
from tidemark.client.types import PopQueueInflight

K = QueueKey("g", "T", 0)


def test_a_pop_records_when_it_handed_out_and_the_journal_and_snapshot_keep_it():
    events: list = []
    ledger = PopLedger(sink=events.extend)
    ledger.ensure_queue(K, 0)
    ledger.pop(K, [(0, 1), (1, 1)], 2, now_ms=5_000, invisible_ms=30_000, client_id="c")
    assert {e.received_ms for e in ledger.inflight(K).values()} == {5_000}
    replayed = PopLedger()
    assert all(replayed.apply(e) for e in decode_events(b"".join(encode_event(e) for e in events)).items)
    assert replayed.inflight(K)[1].received_ms == 5_000
    assert PopLedger.from_snapshot(ledger.snapshot()).inflight(K)[0].received_ms == 5_000


def test_files_written_before_the_receive_time_was_kept_still_load():
    old_popped = [3, "g", "T", 0, 0, 1, 30_000, "c", 0, 0, [0, 1, 1]]  # 7 fields after the key
    [event] = decode_events(frame(json.dumps(old_popped).encode())).items
    assert isinstance(event, Popped) and event.received_ms == 0
    ledger = PopLedger()
    ledger.ensure_queue(K, 0)
    assert ledger.apply(event) and ledger.inflight(K)[0].received_ms == 0
    doc = ledger.snapshot()
    del doc["queues"][0]["inflight"][0][-1]  # a snapshot row of 7 values
    assert PopLedger.from_snapshot(doc).inflight(K)[0].received_ms == 0
    [row] = summarize(ledger, [K], 1_000, lambda topic, queue_id: 1)
    assert (row.inflight, row.oldest_received_ms, row.earliest_invisible_until_ms) == (1, 0, 30_000)


def test_the_summary_counts_redeliveries_overdue_entries_and_what_waits():
    ledger = PopLedger()
    ledger.ensure_queue(K, 0)
    ledger.pop(K, [(0, 1), (1, 3)], 2, now_ms=1_000, invisible_ms=10_000, client_id="c")
    ledger.pop(K, [(2, 1)], 3, now_ms=4_000, invisible_ms=60_000, client_id="c")
    [row] = summarize(ledger, [K], 12_000, lambda topic, queue_id: 10)
    assert (row.topic, row.queue_id, row.inflight, row.redelivered, row.max_attempt, row.overdue) == ("T", 0, 3, 1, 3, 2)
    assert (row.oldest_received_ms, row.earliest_invisible_until_ms, row.latest_invisible_until_ms) == \
        (1_000, 11_000, 64_000)
    assert (row.pending_redelivery, row.waiting) == (0, 7)
    ledger.redeliver_in_place(K, 0, ledger.inflight(K)[0].pop_id)  # FIFO expiry
    [row] = summarize(ledger, [K], 12_000, lambda topic, queue_id: 3)
    assert (row.inflight, row.pending_redelivery, row.waiting) == (2, 1, 0)


def _q(**kw) -> PopQueueInflight:
    fields = dict(inflight=0, oldest_received_ms=0, earliest_invisible_until_ms=0, latest_invisible_until_ms=0,
                  redelivered=0, max_attempt=0, overdue=0, pending_redelivery=0, waiting=0)
    return PopQueueInflight(MessageQueue("T", "b", 0), **{**fields, **kw})


def test_slow_consumers_hold_first_deliveries_stuck_ones_see_them_come_back():
    assert pop_condition(_q()) is PopCondition.IDLE
    assert pop_condition(_q(inflight=4, max_attempt=1)) is PopCondition.CONSUMING
    assert pop_condition(_q(inflight=4, max_attempt=1, waiting=100)) is PopCondition.SLOW
    assert pop_condition(_q(inflight=4, max_attempt=1, overdue=1)) is PopCondition.RETRYING
    assert pop_condition(_q(inflight=1, redelivered=1, max_attempt=2)) is PopCondition.RETRYING
    assert pop_condition(_q(pending_redelivery=1)) is PopCondition.RETRYING
    assert pop_condition(_q(inflight=1, redelivered=1, max_attempt=2, overdue=1)) is PopCondition.STUCK
    assert pop_condition(_q(inflight=1, redelivered=1, max_attempt=3)) is PopCondition.STUCK
    assert worst_pop_condition(["idle", None, "stuck", "slow"]) is PopCondition.STUCK
    assert worst_pop_condition([None]) is None
