"""FetchSession against a real store and offset table (no gRPC): credit, long polling, filters, ends."""

from __future__ import annotations

import asyncio

import pytest

from tidemark.broker.config import BrokerConfig
from tidemark.broker.controller import BrokerController
from tidemark.broker.delivery.fetch import MAX_SCAN, MAX_SCAN_PROPERTIES, EndReason, OpenQueue
from tidemark.broker.errors import (
    FailedPreconditionError,
    FencedError,
    InvalidArgumentError,
    NotFoundError,
)
from tidemark.broker.offsets import Fence
from tidemark.broker.offsets.commits import ResetKind, ResetTarget
from tidemark.common.protocol import tag_hash
from tidemark.common.records import RecordBatchBuilder, encode_properties, record_spans


def run(scenario):
    """Run scenario(broker) on a fresh broker domain (store, offsets, locks) in a temp dir."""
    def go(tmp_path):
        async def main():
            b = BrokerController(BrokerConfig(data_dir=tmp_path, flush_interval_ms=3_600_000))
            b.load()
            await b.start()
            b.topics.create("T", 2)
            try:
                await scenario(b)
            finally:
                await b.shutdown()
        asyncio.run(main())
    return go


def send(b: BrokerController, queue_id: int, n: int, tags: str = "", start: int = 0, **extra: str) -> None:
    builder = RecordBatchBuilder("T")
    for i in range(n):
        props = {"UNIQ_KEY": f"M{queue_id}-{start + i}", **({"TAGS": tags} if tags else {}), **extra}
        builder.append(b"x" * 10, encode_properties(props), tags_code=tag_hash(tags))
    b.sender.append_records("T", queue_id, bytes(builder.buffer), n)


async def frame(session, timeout: float = 2.0):
    return await asyncio.wait_for(session.next_frame(), timeout)


def offsets_of(part) -> list[int]:
    import struct
    return [struct.unpack_from(">q", part.data, s + 20)[0] for s, _ in record_spans(part.data)]


def test_credit_bounds_what_is_sent_and_more_credit_resumes(tmp_path):
    async def scenario(b):
        send(b, 0, 20)
        s = b.fetch_session()
        s.open(OpenQueue(1, "", "T", 0, 0, credit_messages=5, credit_bytes=10**6, batch_size=32))
        f = await frame(s)
        assert [p.count for p in f.records] == [5] and offsets_of(f.records[0]) == list(range(5))
        with pytest.raises(asyncio.TimeoutError):
            await frame(s, 0.2)  # no credit left: nothing more, however much is stored
        s.credit(1, 100, 10**6)
        f = await frame(s)
        assert sum(p.count for p in f.records) == 15 and f.records[-1].next_offset == 20
    run(scenario)(tmp_path)


def test_long_polling_on_the_stream_and_queues_take_turns(tmp_path):
    async def scenario(b):
        s = b.fetch_session()
        for h, q in ((1, 0), (2, 1)):
            s.open(OpenQueue(h, "", "T", q, 0, credit_messages=100, credit_bytes=10**6, batch_size=2))
        waiting = asyncio.ensure_future(s.next_frame())
        await asyncio.sleep(0.05)
        assert not waiting.done()  # nothing stored yet: the stream waits
        send(b, 0, 5)
        send(b, 1, 5)
        f = await asyncio.wait_for(waiting, 2)
        f2 = [] if sum(p.count for p in f.records) == 10 else (await frame(s)).records
        handles = [p.handle for p in f.records + f2]
        assert handles[:4] == [1, 2, 1, 2] or handles[:4] == [2, 1, 2, 1]  # two at a time, in turn
        assert sum(p.count for p in f.records + f2) == 10
    run(scenario)(tmp_path)


def test_filtered_entries_move_the_position_once_caught_up(tmp_path):
    async def scenario(b):
        send(b, 0, 1, tags="paid")
        send(b, 0, 2, tags="shipped", start=1)
        s = b.fetch_session()
        s.open(OpenQueue(1, "g", "T", 0, 0, subscription="paid", credit_messages=100, credit_bytes=10**6,
                         batch_size=32))
        f = await frame(s)
        assert [(p.count, p.next_offset) for p in f.records] == [(1, 3)]
        send(b, 0, 2, tags="shipped", start=3)
        f = await frame(s)  # only skipped entries: an empty part that moves the position
        assert [(p.count, p.next_offset) for p in f.records] == [(0, 5)]
    run(scenario)(tmp_path)


def test_a_filtered_run_longer_than_one_scan_is_crossed_without_new_arrivals(tmp_path):
    async def scenario(b):
        send(b, 0, MAX_SCAN * 2 + 10, tags="shipped")
        send(b, 0, 1, tags="paid", start=MAX_SCAN * 2 + 10)
        s = b.fetch_session()
        s.open(OpenQueue(1, "g", "T", 0, 0, subscription="paid", credit_messages=100, credit_bytes=10**6,
                         batch_size=32))
        f = await frame(s)  # producers idle: the session keeps scanning by itself
        assert [(p.count, p.next_offset) for p in f.records] == [(1, MAX_SCAN * 2 + 11)]
    run(scenario)(tmp_path)


def test_an_sql92_filter_sends_exactly_the_matching_records(tmp_path):
    async def scenario(b):
        send(b, 0, 3, region="us")
        send(b, 0, 2, start=3, region="eu", amount="150")
        send(b, 0, 2, start=5, region="eu", amount="50")
        s = b.fetch_session()
        s.open(OpenQueue(1, "g", "T", 0, 0, subscription="region = 'eu' AND amount > 100", credit_messages=100,
                         credit_bytes=10**6, batch_size=32, expression_type="SQL92"))
        f = await frame(s)
        assert [(p.count, p.next_offset) for p in f.records] == [(2, 7)] and offsets_of(f.records[0]) == [3, 4]
        send(b, 0, 2, start=7, region="us")
        f = await frame(s)  # only skipped entries: an empty part that moves the position
        assert [(p.count, p.next_offset) for p in f.records] == [(0, 9)]
        # A long run that matches nothing is crossed window by window.
        send(b, 0, MAX_SCAN_PROPERTIES * 3, start=9, region="us")
        send(b, 0, 1, start=9 + MAX_SCAN_PROPERTIES * 3, region="eu", amount="101")
        f = await frame(s)
        while not sum(p.count for p in f.records):
            f = await frame(s)
        assert f.records[-1].next_offset == 10 + MAX_SCAN_PROPERTIES * 3
    run(scenario)(tmp_path)


def test_a_bad_sql92_filter_ends_its_handle_with_the_column(tmp_path):
    async def scenario(b):
        send(b, 0, 3)
        s = b.fetch_session()
        s.open(OpenQueue(1, "g", "T", 0, 0, subscription="a >", credit_messages=1, credit_bytes=1,
                         expression_type="SQL92"))
        s.open(OpenQueue(2, "g", "T", 0, 0, subscription="*", credit_messages=1, credit_bytes=1,
                         expression_type="7"))
        f = await frame(s)
        ends = {e.handle: e for e in f.ended}
        assert isinstance(ends[1].error, InvalidArgumentError)
        assert str(ends[1].error) == 'SQL92 expression "a >" at column 4: expected a value'
        assert isinstance(ends[2].error, InvalidArgumentError) and "not one of TAG, SQL92" in str(ends[2].error)
    run(scenario)(tmp_path)


def test_a_queue_ends_when_its_lock_goes_to_another_client(tmp_path):
    async def scenario(b):
        send(b, 0, 3)
        [grant] = await b.lock_queues("g", "A", [("T", 0)])
        s = b.fetch_session()
        s.open(OpenQueue(1, "g", "T", 0, 0, fence=Fence("A", grant.owner_epoch), credit_messages=100,
                         credit_bytes=10**6, batch_size=32))
        assert (await frame(s)).records[0].count == 3
        b.unlock_queues("g", "A", [("T", 0)])
        await b.lock_queues("g", "B", [("T", 0)])
        f = await frame(s)
        assert [(e.handle, e.reason) for e in f.ended] == [(1, EndReason.ERROR)]
        assert isinstance(f.ended[0].error, FencedError)
        send(b, 0, 1, start=3)
        with pytest.raises(asyncio.TimeoutError):
            await frame(s, 0.2)  # nothing more reaches the old owner
    run(scenario)(tmp_path)


def test_an_admin_reset_ends_the_queue_with_the_new_offset_and_generation(tmp_path):
    async def scenario(b):
        send(b, 0, 10)
        s = b.fetch_session()
        s.open(OpenQueue(1, "g", "T", 0, 10, fence=Fence("A", None, 0), credit_messages=100,
                         credit_bytes=10**6, batch_size=32))
        await b.commits.reset("g", "T", 0, ResetTarget(ResetKind.OFFSET, 4), dry_run=False)
        f = await frame(s)
        [end] = f.ended
        assert (end.reason, end.next_offset) == (EndReason.OFFSET_RESET, 4) and end.reset_generation > 0
    run(scenario)(tmp_path)


def test_bad_opens_and_illegal_offsets_end_with_a_reason_and_change_nothing(tmp_path):
    async def scenario(b):
        send(b, 0, 3)
        s = b.fetch_session()
        s.open(OpenQueue(1, "g", "Nope", 0, 0, credit_messages=1, credit_bytes=1))
        s.open(OpenQueue(2, "g", "T", 9, 0, credit_messages=1, credit_bytes=1))
        s.open(OpenQueue(3, "g", "T", 0, 0, credit_messages=1, credit_bytes=1, batch_size=5000))
        s.open(OpenQueue(4, "g", "T", 0, 7, credit_messages=1, credit_bytes=1))
        f = await frame(s)
        ends = {e.handle: e for e in f.ended}
        assert isinstance(ends[1].error, NotFoundError)
        assert isinstance(ends[2].error, InvalidArgumentError) and isinstance(ends[3].error, InvalidArgumentError)
        # Past the max of a queue that starts at 0: RocketMQ's rule sends the reader back to 0 (re-created).
        assert (ends[4].reason, ends[4].next_offset) == (EndReason.OFFSET_ILLEGAL, 0)
        assert b.offsets.query("g", "T", 0) == -1 and b.groups.get("g") is None
    run(scenario)(tmp_path)


def test_commits_ride_on_credit_and_a_stale_owner_cannot_commit(tmp_path):
    async def scenario(b):
        send(b, 0, 10)
        [grant] = await b.lock_queues("g", "A", [("T", 0)])
        s = b.fetch_session()
        s.open(OpenQueue(1, "g", "T", 0, 0, fence=Fence("A", grant.owner_epoch), credit_messages=4,
                         credit_bytes=10**6, batch_size=32))
        await frame(s)
        s.credit(1, 4, 10**6, commit_offset=4)
        assert b.offsets.query("g", "T", 0) == 4
        other = b.fetch_session()
        other.open(OpenQueue(7, "g", "T", 0, 4, fence=Fence("B", grant.owner_epoch - 1), credit_messages=1,
                             credit_bytes=10**6))
        f = await frame(other)
        assert isinstance(f.ended[0].error, FencedError) and b.offsets.query("g", "T", 0) == 4
    run(scenario)(tmp_path)


def test_a_queue_opened_after_lock_starts_at_the_committed_offset_once_its_client_holds_the_lock(tmp_path):
    # A handover's new owner opens the queue ahead of its lock: nothing is served while the old owner
    # holds it, nor once it let go; with the grant, the committed offset (the old owner's final commit)
    # under the grant's fence, before the records.
    async def scenario(b):
        send(b, 0, 10)
        (old,) = await b.lock_queues("G", "c1", [("T", 0)])
        s = b.fetch_session()
        s.open(OpenQueue(1, "G", "T", 0, 0, fence=Fence("c2", 0), credit_messages=100, credit_bytes=10**6,
                         after_lock=True))
        waiting = asyncio.ensure_future(s.next_frame())
        await asyncio.sleep(0.05)
        assert not waiting.done()  # held by another client
        assert not b.unlock_queues("G", "c1", [("T", 0)], [("T", 0, 4, Fence("c1", old.owner_epoch))])
        await asyncio.sleep(0.05)
        assert not waiting.done()  # free, but not c2's
        (grant,) = await b.lock_queues("G", "c2", [("T", 0)])
        f = await asyncio.wait_for(waiting, 2)
        assert [(st.handle, st.offset, st.owner_epoch, st.reset_generation) for st in f.started] == [
            (1, 4, grant.owner_epoch, 0)]
        assert offsets_of(f.records[0]) == list(range(4, 10))
        # Served under the grant's fence: once the queue goes to another client, the handle ends fenced.
        b.unlock_queues("G", "c2", [("T", 0)])
        await b.lock_queues("G", "c3", [("T", 0)])
        send(b, 0, 1, start=10)
        f = await frame(s)
        assert [e.handle for e in f.ended] == [1] and isinstance(f.ended[0].error, FencedError)
    run(scenario)(tmp_path)


def test_a_queue_opened_after_lock_without_a_committed_offset_ends_for_the_client_to_open(tmp_path):
    async def scenario(b):
        send(b, 1, 3)
        await b.lock_queues("G", "c2", [("T", 1)])
        s = b.fetch_session()
        s.open(OpenQueue(1, "G", "T", 1, 0, fence=Fence("c2", 0), credit_messages=100, credit_bytes=10**6,
                         after_lock=True))
        s.open(OpenQueue(2, "G", "T", 1, 0, credit_messages=100, credit_bytes=10**6, after_lock=True))
        f = await frame(s)
        assert not f.records and not f.started
        ended = {e.handle: e.error for e in f.ended}
        assert isinstance(ended[1], FailedPreconditionError) and not isinstance(ended[1], FencedError)
        assert isinstance(ended[2], InvalidArgumentError)  # no fence naming the client
    run(scenario)(tmp_path)


@pytest.mark.parametrize("open_first", [True, False], ids=["opened-before-the-grant", "opened-after-the-commit"])
def test_a_queue_opened_after_lock_starts_where_the_grant_said_whatever_was_committed_since(tmp_path, open_first):
    # The grant told the new owner "no committed offset"; the owner starts by its own rule and tells the
    # broker that start at once, on a unary call that may come before the fetch stream's next frame and
    # before its close of this handle; and the open ahead itself, a stream frame, may reach the broker only
    # after the grant and that commit (nothing orders the two). Started at that commit, the handle would
    # serve a queue the client reads again on a handle of its own: it ends, as it would have at the grant.
    async def scenario(b):
        send(b, 0, 3)
        s = b.fetch_session()

        def open_ahead() -> None:
            s.open(OpenQueue(1, "G", "T", 0, 0, fence=Fence("c2", 0), credit_messages=100, credit_bytes=10**6,
                             after_lock=True))
        if open_first:
            open_ahead()
        (grant,) = await b.lock_queues("G", "c2", [("T", 0)])
        b.commits.commit("G", "T", 0, 0, Fence("c2", grant.owner_epoch))  # (ownership.py's _recommit)
        assert b.offsets.query("G", "T", 0) == 0
        if not open_first:
            open_ahead()
        f = await frame(s)
        assert not f.records and not f.started
        [end] = f.ended
        assert isinstance(end.error, FailedPreconditionError) and not isinstance(end.error, FencedError)
    run(scenario)(tmp_path)


def test_a_queue_opened_after_lock_starts_when_its_client_takes_the_lock_back_under_the_same_epoch(tmp_path):
    # Released and locked again with nobody in between keeps the owner epoch: still a new grant, which
    # starts the waiting handle at once (not at the next record stored).
    async def scenario(b):  # (nothing stored: no record's notify wakes the handle)
        (first,) = await b.lock_queues("G", "c2", [("T", 0)])
        b.unlock_queues("G", "c2", [("T", 0)], [("T", 0, 0, Fence("c2", first.owner_epoch))])
        s = b.fetch_session()
        s.open(OpenQueue(1, "G", "T", 0, 0, fence=Fence("c2", 0), credit_messages=100, credit_bytes=10**6,
                         after_lock=True))
        waiting = asyncio.ensure_future(s.next_frame())
        await asyncio.sleep(0.05)
        assert not waiting.done()
        (again,) = await b.lock_queues("G", "c2", [("T", 0)])
        assert again.owner_epoch == first.owner_epoch
        f = await asyncio.wait_for(waiting, 2)
        assert [(st.offset, st.owner_epoch) for st in f.started] == [(0, first.owner_epoch)]
    run(scenario)(tmp_path)


def test_a_queue_opened_after_lock_whose_client_let_the_lock_go_before_the_stream_started_it_ends(tmp_path):
    # Granted and let go before the stream's next frame (a quick rebalance back, a lease that could not
    # start): the handle must not wait for a lock its client already had, woken by every record stored,
    # for as long as the stream lasts. It ends, fenced; the client opens the queue again if it wants it.
    async def scenario(b):
        send(b, 0, 3)
        (old,) = await b.lock_queues("G", "c1", [("T", 0)])
        assert not b.unlock_queues("G", "c1", [("T", 0)], [("T", 0, 2, Fence("c1", old.owner_epoch))])
        s = b.fetch_session()
        s.open(OpenQueue(1, "G", "T", 0, 0, fence=Fence("c2", 0), credit_messages=100, credit_bytes=10**6,
                         after_lock=True))
        await b.lock_queues("G", "c2", [("T", 0)])  # (the stream builds no frame in between)
        b.unlock_queues("G", "c2", [("T", 0)])
        f = await frame(s)
        assert not f.started and not f.records
        assert [e.handle for e in f.ended] == [1] and isinstance(f.ended[0].error, FencedError)
        assert s.open_queues == 0 and b.hold.watching() == 0
    run(scenario)(tmp_path)


def test_a_queue_opened_after_lock_starts_at_the_latest_grant_s_offset(tmp_path):
    # Granted, let go with a final commit and granted again under the same epoch before the stream's next
    # frame: the second grant's answer told the client the final commit, and the handle starts there.
    async def scenario(b):
        send(b, 0, 10)
        await b.lock_queues("G", "c1", [("T", 0)])
        b.unlock_queues("G", "c1", [("T", 0)], [("T", 0, 2, None)])
        s = b.fetch_session()
        s.open(OpenQueue(1, "G", "T", 0, 0, fence=Fence("c2", 0), credit_messages=100, credit_bytes=10**6,
                         after_lock=True))
        (first,) = await b.lock_queues("G", "c2", [("T", 0)])  # (the stream builds no frame in between)
        assert b.held_queue("G", first).consumer_offset == 2
        b.unlock_queues("G", "c2", [("T", 0)], [("T", 0, 5, Fence("c2", first.owner_epoch))])
        (again,) = await b.lock_queues("G", "c2", [("T", 0)])
        assert again.owner_epoch == first.owner_epoch and b.held_queue("G", again).consumer_offset == 5
        f = await frame(s)
        assert [(st.offset, st.owner_epoch) for st in f.started] == [(5, again.owner_epoch)]
        assert offsets_of(f.records[0]) == list(range(5, 10))
    run(scenario)(tmp_path)
