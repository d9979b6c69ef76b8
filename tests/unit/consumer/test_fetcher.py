"""The Fetcher against a scripted fetch stream (no broker): credit for records the exact tag check drops,
an idle queue's credit gathered into one frame, and records that do not decode are read again rather than
skipped."""

from __future__ import annotations

import asyncio

from tidemark.client.consumer import fetcher as fetcher_module
from tidemark.client.consumer.fetcher import Fetcher, FetchLimits
from tidemark.client.consumer.lease import QueueLease
from tidemark.client.message import MessageQueue
from tidemark.client.remoting.moves import MasterMoves
from tidemark.common.protocol import tag_hash
from tidemark.common.records import RecordBatchBuilder, encode_properties

MQ = MessageQueue("T", "broker-a", 0)


class ScriptedStream:
    usable = True
    address = "127.0.0.1:1"

    def __init__(self, on_records, on_ended, on_broken) -> None:
        self.on_records = on_records
        self.opens: list[tuple[int, int]] = []  # (handle, offset)
        self.credits: list[tuple[int, int, int]] = []
        self.closed: list[int] = []

    def open_queue(self, handle, group, mq, offset, **kw) -> None:
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

    def open_fetch_stream(self, *, on_records, on_ended, on_broken) -> ScriptedStream:
        self.stream = ScriptedStream(on_records, on_ended, on_broken)
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
