"""The Fetcher against a scripted fetch stream (no broker): credit for records the exact tag check drops,
an idle queue's credit gathered into one frame, and records that do not decode are read again rather than
skipped."""

from __future__ import annotations

import asyncio
import time

from tidemark.client.consumer import fetcher as fetcher_module
from tidemark.client.consumer.fetcher import Fetcher, FetchLimits
from tidemark.client.consumer.lease import QueueLease
from tidemark.client.consumer.lock_hold import LockHold
from tidemark.client.errors import UnavailableError
from tidemark.client.message import MessageQueue
from tidemark.client.remoting.moves import MasterMoves
from tidemark.client.remoting.streams import QueueEnd, QueueStart
from tidemark.common.protocol import tag_hash
from tidemark.common.records import RecordBatchBuilder, encode_properties

MQ = MessageQueue("T", "broker-a", 0)
MQ1, MQ2 = MessageQueue("T", "broker-a", 1), MessageQueue("T", "broker-a", 2)


class ScriptedStream:
    usable = True
    address = "127.0.0.1:1"

    def __init__(self, on_records, on_ended, on_broken, on_started) -> None:
        self.on_records = on_records
        self.on_ended = on_ended
        self.on_started = on_started
        self.on_broken = on_broken
        self.opens: list[tuple[int, int]] = []  # (handle, offset)
        self.ahead: list[int] = []  # handles opened after_lock
        self.credits: list[tuple[int, int, int]] = []
        self.closed: list[int] = []

    def open_queue(self, handle, group, mq, offset, **kw) -> None:
        if kw.get("after_lock"):
            self.ahead.append(handle)
        else:
            self.opens.append((handle, offset))

    def credit(self, handle, messages, nbytes, commit_offset=None) -> None:
        self.credits.append((handle, messages, nbytes))

    def close_queue(self, handle) -> None:
        self.closed.append(handle)

    async def close(self) -> None:
        pass


class ScriptedCluster:
    address = "127.0.0.1:1"

    def __init__(self) -> None:
        self.stream: ScriptedStream | None = None
        self.moves = MasterMoves()  # BrokerCluster's: broker-a never moves here

    async def connection(self, broker_name):
        return self

    def suspect(self, broker_name) -> None:
        """BrokerCluster.suspect: nothing to look up here."""

    def open_fetch_stream(self, *, on_records, on_ended, on_broken, on_started) -> ScriptedStream:
        self.stream = ScriptedStream(on_records, on_ended, on_broken, on_started)
        return self.stream


class Sink:
    def __init__(self) -> None:
        self.delivered: list[tuple[list[str], int]] = []

    def on_messages(self, lease, msgs, next_offset) -> None:
        self.delivered.append(([m.tags for m in msgs], next_offset))

    def on_ended(self, lease, end) -> None:
        pass


def records(*tags: str) -> bytes:
    builder = RecordBatchBuilder("T")
    for t in tags:
        builder.append(b"x", encode_properties({"TAGS": t}), tags_code=tag_hash(t))
    return bytes(builder.buffer)


def run(scenario) -> None:
    async def main():
        cluster, sink = ScriptedCluster(), Sink()
        fetcher = Fetcher(cluster=cluster, group="g", subscription=lambda topic: "paid", sink=sink,
                          limits=FetchLimits(messages=100, bytes=10**6, max_span=None, batch_size=32),
                          offset_store=None)
        lease = QueueLease(MQ, client_id="c1", owner_epoch=1, reset_generation=0, start_offset=0)
        await fetcher.start(lease, 0)
        try:
            await scenario(fetcher, cluster.stream, sink)
        finally:
            await fetcher.close()
    asyncio.run(main())


def test_credit_used_by_records_the_exact_tag_check_drops_goes_back_at_once():
    async def scenario(fetcher, stream, sink):
        handle = stream.opens[0][0]
        data = records("paid", "collides-with-paid", "collides-too")  # the broker matched them by hash code
        stream.on_records(handle, 3, data, 3, 3)
        assert sink.delivered == [(["paid"], 3)]
        assert [(h, n) for h, n, _ in stream.credits] == [(handle, 2)]  # nobody else would return it
    run(scenario)


def test_an_idle_queue_returns_its_credit_once_for_everything_consumed_meanwhile(monkeypatch):
    monkeypatch.setattr(fetcher_module, "IDLE_CREDIT_S", 0.05)

    async def scenario(fetcher, stream, sink):
        handle = stream.opens[0][0]
        lease = fetcher._by_handle[handle].lease
        for n in range(1, 4):  # three batches consumed one after another, the cache empty after each
            stream.on_records(handle, 1, records("paid"), n, n)
            fetcher.grant(lease, 1, 100)
        assert stream.credits == []
        for _ in range(300):
            if stream.credits:
                break
            await asyncio.sleep(0.01)
        assert stream.credits == [(handle, 3, 300)]
        fetcher.grant(lease, 30, 3000)  # a quarter of the room (100 messages): at once, as before
        assert stream.credits[1:] == [(handle, 30, 3000)]
    run(scenario)


def test_records_that_do_not_decode_are_read_again_from_where_the_frame_began():
    async def scenario(fetcher, stream, sink):
        handle = stream.opens[0][0]
        stream.on_records(handle, 1, records("paid"), 1, 5)
        stream.on_records(handle, 2, b"\x00\x00\x00\x07torn", 3, 5)
        assert sink.delivered == [(["paid"], 1)] and stream.closed == [handle]
        for _ in range(300):  # reopened after the backoff, from offset 1 (not 3)
            if len(stream.opens) == 2:
                break
            await asyncio.sleep(0.01)
        assert stream.opens[1][1] == 1 and stream.opens[1][0] != handle
    run(scenario)


def granted(mq: MessageQueue, offset: int, epoch: int = 7) -> QueueLease:
    return QueueLease(mq, client_id="c1", owner_epoch=epoch, reset_generation=0, start_offset=offset)


def test_a_queue_opened_ahead_is_read_on_that_handle_when_the_broker_started_it_where_its_lease_starts():
    async def scenario(fetcher, stream, sink):
        fetcher.open_ahead("T", {MQ1}, "c1")
        (handle,) = stream.ahead
        stream.on_started(handle, QueueStart(5, 7, 0))
        stream.on_records(handle, 1, records("paid"), 6, 6)  # before its lease: kept
        assert sink.delivered == []
        await fetcher.start(granted(MQ1, 5), 5, ahead=True)
        assert sink.delivered == [(["paid"], 6)] and fetcher.taken_over == 1
        assert len(stream.opens) == 1 and not stream.closed  # (the run's own queue): no second open
        stream.on_records(handle, 1, records("paid"), 7, 7)
        assert sink.delivered[-1] == (["paid"], 7)
    run(scenario)


def test_a_queue_started_ahead_elsewhere_or_under_another_grant_is_closed_and_opened_as_usual():
    # This client's kept progress (a lease starting past the committed offset), or a grant the lease does
    # not hold: what came ahead is not the lease's.
    async def scenario(fetcher, stream, sink):
        fetcher.open_ahead("T", {MQ1, MQ2}, "c1")
        h1, h2 = stream.ahead
        stream.on_started(h1, QueueStart(5, 7, 0))
        stream.on_started(h2, QueueStart(5, 6, 0))
        stream.on_records(h1, 1, records("paid"), 6, 6)
        await fetcher.start(granted(MQ1, 8), 8, ahead=True)
        await fetcher.start(granted(MQ2, 5), 5, ahead=True)
        assert sorted(stream.closed) == [h1, h2] and stream.opens[1:] == [(h2 + 1, 8), (h2 + 2, 5)]
        assert sink.delivered == [] and fetcher.taken_over == 0
    run(scenario)


def test_a_lease_that_starts_before_the_broker_says_where_it_started_waits_for_its_word():
    async def scenario(fetcher, stream, sink):
        fetcher.open_ahead("T", {MQ1, MQ2}, "c1")
        h1, h2 = stream.ahead
        await fetcher.start(granted(MQ1, 5), 5, ahead=True)
        await fetcher.start(granted(MQ2, 0), 0, ahead=True)
        assert len(stream.opens) == 1  # neither opened again: the broker's answer on each handle decides
        stream.on_started(h1, QueueStart(5, 7, 0))
        stream.on_records(h1, 1, records("paid"), 6, 6)
        assert sink.delivered == [(["paid"], 6)]
        stream.on_ended(h2, QueueEnd("ERROR"))  # (no committed offset, or a broker without after_lock)
        for _ in range(300):
            if len(stream.opens) == 2:
                break
            await asyncio.sleep(0.01)
        assert stream.opens[1][1] == 0 and fetcher.taken_over == 1
        fetcher.open_ahead("T", {MQ1}, "c1")  # no longer wanted ahead of its lock: closed
        (h3,) = stream.ahead[2:]
        fetcher.open_ahead("T", set(), "c1")
        assert stream.closed == [h3]
    run(scenario)


def test_a_lease_stopped_while_it_waits_for_the_broker_s_word_closes_the_handle_opened_ahead():
    # Handed back (or lost) before the broker started the handle: the broker will not start it for this
    # lease now, and nothing else would close it, here or there, before the stream ends.
    async def scenario(fetcher, stream, sink):
        fetcher.open_ahead("T", {MQ1}, "c1")
        (handle,) = stream.ahead
        lease = granted(MQ1, 5)
        await fetcher.start(lease, 5, ahead=True)
        fetcher.stop(lease)
        assert stream.closed == [handle] and fetcher.opened_ahead == 0
        stream.on_started(handle, QueueStart(5, 7, 0))  # (late: dropped)
        stream.on_records(handle, 1, records("paid"), 6, 6)
        assert sink.delivered == [] and len(stream.opens) == 1 and fetcher.taken_over == 0
    run(scenario)


def test_a_lease_that_does_not_start_at_its_grant_s_committed_offset_opens_at_once():
    # No committed offset (consume_from_where decides), or this client's kept progress: the broker would
    # end the handle or start it elsewhere, and waiting for its word would only delay the queue.
    async def scenario(fetcher, stream, sink):
        fetcher.open_ahead("T", {MQ1}, "c1")
        (handle,) = stream.ahead
        await fetcher.start(granted(MQ1, 0), 0, ahead=False)
        assert stream.closed == [handle] and stream.opens[1:] == [(handle + 1, 0)]
        stream.on_started(handle, QueueStart(0, 7, 0))  # (late: nobody waits for it any more)
        stream.on_records(handle, 1, records("paid"), 1, 1)
        assert sink.delivered == [] and fetcher.taken_over == 0
    run(scenario)


def test_a_broken_stream_lapses_the_locks_of_its_broker_s_queues():
    """A broker restart breaks the stream and forgets the locks: count on none until renewed (lock_hold.py)."""
    async def main():
        cluster = ScriptedCluster()
        fetcher = Fetcher(cluster=cluster, group="g", subscription=lambda topic: "*", sink=Sink(),
                          limits=FetchLimits(messages=100, bytes=10**6, max_span=None, batch_size=32),
                          offset_store=None)
        hold = LockHold()
        hold.confirm(sent_at=time.monotonic(), expiry_ms=60_000)
        lease = QueueLease(MQ, client_id="c1", owner_epoch=1, reset_generation=0, start_offset=0, lock=hold)
        await fetcher.start(lease, 0)
        try:
            assert not hold.lapsed()
            cluster.stream.on_broken(UnavailableError("broker-a: connection reset"))
            assert hold.lapsed()
        finally:
            await fetcher.close()
    asyncio.run(main())
