"""The operations layer (broker/operations.py) on a real broker domain in a temp dir, without gRPC: the
rules both protocols share, and the metrics counted once whichever protocol carried the call."""

from __future__ import annotations

import asyncio

import pytest

from tidemark.broker.config import BrokerConfig
from tidemark.broker.controller import BrokerController
from tidemark.broker.errors import InvalidArgumentError, PermissionDeniedError, TopicNotFoundError
from tidemark.broker.operations import (
    MAX_BATCH,
    BatchSequence,
    OffsetPolicy,
    Operations,
    OutgoingMessage,
    PullRequest,
    PullStatus,
    ReceiveRequest,
)
from tidemark.common.protocol import parse_tag_expression, tag_hash
from tidemark.common.records import RecordBatchBuilder, encode_properties


def run(scenario, tmp_path):
    async def main():
        b = BrokerController(BrokerConfig(data_dir=tmp_path, flush_interval_ms=3_600_000))
        b.load()
        await b.start()
        b.topics.create("T", 2)
        try:
            await scenario(b.operations, b)
        finally:
            await b.shutdown()
    asyncio.run(main())


def counted(b: BrokerController, name: str, **labels: str) -> float:
    return b.metrics.registry.get_sample_value(name, labels) or 0.0


def records(n: int, start: int = 0) -> bytes:
    builder = RecordBatchBuilder("T")
    for i in range(n):
        builder.append(b"x" * 10, encode_properties({"UNIQ_KEY": f"M{start + i}"}), tags_code=tag_hash(""))
    return bytes(builder.buffer)


def test_offset_queries_by_policy_check_the_queue_and_land_where_the_policy_says(tmp_path):
    async def scenario(ops: Operations, b: BrokerController):
        for i in range(5):
            await ops.send("T", 1, [OutgoingMessage(body=b"m%d" % i)])
        assert ops.queue_offset("T", 1, OffsetPolicy.EARLIEST) == 0
        assert ops.queue_offset("T", 1, OffsetPolicy.LATEST) == 5
        assert ops.queue_offset("T", 0, OffsetPolicy.LATEST) == 0
        assert ops.queue_offset("T", 1, OffsetPolicy.TIMESTAMP, 0) == 0
        assert ops.queue_offset("T", 1, OffsetPolicy.TIMESTAMP, b.clock_ms() + 60_000) == 5
        with pytest.raises(InvalidArgumentError, match="timestamp must be >= 0"):
            ops.queue_offset("T", 1, OffsetPolicy.TIMESTAMP, -1)
        with pytest.raises(InvalidArgumentError, match="queue id 2 is out of range"):
            ops.queue_offset("T", 2, OffsetPolicy.EARLIEST)
        with pytest.raises(TopicNotFoundError):
            ops.queue_offset("nope", 0, OffsetPolicy.EARLIEST)
    run(scenario, tmp_path)


def test_a_route_is_closed_where_the_topic_or_the_broker_is(tmp_path):
    async def scenario(ops: Operations, b: BrokerController):
        route = ops.route("T")
        assert (route.queue_count, route.queue_readable(1), route.queue_writable(1)) == (2, True, True)
        assert not route.queue_readable(2)
        b.permission.update(readable=True, writable=False)
        route = ops.route("T")
        assert route.readable and not route.writable and not route.queue_writable(0)
        with pytest.raises(PermissionDeniedError):
            await ops.send("T", 0, [OutgoingMessage(body=b"x")])
        b.permission.update(readable=True, writable=True)
        b.topics.update("T", readable=False)
        assert not ops.route("T").queue_readable(0)
    run(scenario, tmp_path)


def test_stored_messages_are_counted_once_and_a_duplicate_batch_is_counted_as_one(tmp_path):
    async def scenario(ops: Operations, b: BrokerController):
        await ops.send("T", 0, [OutgoingMessage(body=b"a"), OutgoingMessage(body=b"b")])
        producer = ops.init_producer("k", "T")
        batch, sequence = records(3), BatchSequence(producer, 0, 0)
        first = ops.append("T", 1, batch, 3, sequence)
        # The topic created at the start is not on disk yet: the batch is acknowledged once it is.
        assert first.durable is not None and b.configs_dirty and not first.put.duplicate
        await first.durable()
        assert not b.configs_dirty
        again = ops.append("T", 1, batch, 3, sequence)  # a retry whose answer was lost
        assert again.durable is None  # async flush, no replica: acknowledged at once
        assert again.put.duplicate and again.put.first_offset == first.put.first_offset
        assert counted(b, "tidemark_messages_in_total", topic="T") == 5
        assert counted(b, "tidemark_duplicate_batches_total") == 1
    run(scenario, tmp_path)


def test_a_receive_asking_more_than_the_broker_hands_out_gets_a_full_batch(tmp_path):
    async def scenario(ops: Operations, b: BrokerController):
        await ops.send("T", 0, [OutgoingMessage(body=b"m%d" % i) for i in range(MAX_BATCH + 8)])
        got = await ops.receive(ReceiveRequest(group="g", topic="T", filter=parse_tag_expression("*"),
                                               batch=MAX_BATCH * 4, invisible_ms=30_000, client_id="c1"))
        assert len(got) == MAX_BATCH
        assert counted(b, "tidemark_messages_out_total", topic="T") == MAX_BATCH
        with pytest.raises(InvalidArgumentError, match="batch size 0"):
            await ops.receive(ReceiveRequest(group="g", topic="T", filter=parse_tag_expression("*"), batch=0,
                                             invisible_ms=30_000, client_id="c1"))
    run(scenario, tmp_path)


def test_redelivery_waits_the_retry_schedule_from_ten_seconds_on(tmp_path):
    async def scenario(ops: Operations, b: BrokerController):
        delays = ops.redelivery_delays_ms()
        assert delays[0] == 10_000 and delays == sorted(delays)
        assert delays == list(b.config.delay_levels_ms[2:])
    run(scenario, tmp_path)


def test_a_pull_with_an_sql92_filter_gets_the_matching_messages_and_moves_past_the_others(tmp_path):
    async def scenario(ops: Operations, b: BrokerController):
        await ops.send("T", 0, [OutgoingMessage(body=b"%d" % i, properties={"n": str(i)}) for i in range(10)])
        sql = PullRequest(group="g", topic="T", queue_id=0, queue_offset=0, subscription="n BETWEEN 3 AND 4",
                          expression_type="SQL92")
        got = await ops.pull(sql)
        assert got.status is PullStatus.FOUND and [m.body for m in got.messages] == [b"3", b"4"]
        assert got.next_begin_offset == 10  # past the skipped messages too
        rest = await ops.pull(PullRequest(group="g", topic="T", queue_id=0, queue_offset=5,
                                          subscription="n BETWEEN 3 AND 4", expression_type="SQL92"))
        assert (rest.status, rest.next_begin_offset) == (PullStatus.NO_MATCHED_MSG, 10)
        with pytest.raises(InvalidArgumentError, match='^SQL92 expression "n BETWEEN 3" at column 12: expected AND'):
            await ops.pull(PullRequest(group="g", topic="T", queue_id=0, queue_offset=0, subscription="n BETWEEN 3",
                                       expression_type="SQL92"))
    run(scenario, tmp_path)
