"""Executor side: read the messages [start, end) of one queue with a lite pull consumer.

The consumer is created here, inside a Spark task, and shut down before the
task ends; nothing of it is pickled. Offsets are checked as messages arrive: a
gap (retention deleted messages while the task ran) or a queue that no longer
reaches `end` (re-created) is data loss, handled per failOnDataLoss.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

from client import Admin, PullConsumer
from client.errors import InvalidArgumentError
from client.message import ConsumeFromWhere, MessageExt, MessageQueue
from spark_connector.offsets import DataLossError, OffsetRange, check_start, describe_loss
from tidemark.protocol import parse_tag_expression

log = logging.getLogger("tidemark.spark")

# Readers never commit (assign mode, auto_commit off); they still use a group of their
# own so that the user's group only ever holds the offsets the stream's commit() sets.
# Tags are filtered here, not by the broker: a broker-side filter would skip offsets,
# which the gap check below could not tell from data loss.
READER_GROUP = "tidemark-spark-reader"
MAX_PULL_BATCH = 1024  # PullConsumerSettings allows 1..1024
POLL_STEP_S = 1.0


@dataclass(frozen=True, slots=True)
class FetchSettings:
    brokers: str
    fail_on_data_loss: bool
    poll_timeout_s: float
    tag_expression: str = "*"


def fetch_range(settings: FetchSettings, rng: OffsetRange) -> Iterator[list[MessageExt]]:
    """Lists of messages of rng in offset order (filtered by tag expression); every offset once."""
    if rng.size <= 0:
        return
    tags = parse_tag_expression(settings.tag_expression)
    consumer = PullConsumer(group=READER_GROUP, brokers=settings.brokers, auto_commit=False,
                            pull_batch_size=max(1, min(MAX_PULL_BATCH, rng.size)),
                            pull_threshold_for_queue=2 * MAX_PULL_BATCH,
                            consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                            broker_suspend_max_time_ms=1000)
    consumer.assign([rng.mq])
    consumer.start()
    try:
        expected = _seek(consumer, settings, rng)
        deadline = time.monotonic() + settings.poll_timeout_s
        while expected < rng.end:
            msgs = consumer.poll(POLL_STEP_S)
            if not msgs:
                if time.monotonic() >= deadline:
                    expected = _stalled(settings, rng, expected)
                    deadline = time.monotonic() + settings.poll_timeout_s
                continue
            deadline = time.monotonic() + settings.poll_timeout_s
            batch: list[MessageExt] = []
            for m in msgs:
                offset = m.queue_offset
                if offset < expected:
                    continue  # already delivered (a pull raced the seek)
                if offset >= rng.end:
                    break
                if offset > expected:
                    _gap(settings, rng.mq, expected, offset)
                expected = offset + 1
                if tags.matches_tag(m.tags):
                    batch.append(m)
            if batch:
                yield batch
            if msgs[-1].queue_offset >= rng.end - 1:
                break
    finally:
        consumer.shutdown()


def _seek(consumer: PullConsumer, settings: FetchSettings, rng: OffsetRange) -> int:
    try:
        consumer.seek(rng.mq, rng.start)
        return rng.start
    except InvalidArgumentError:
        low, high = _bounds(settings.brokers, rng.mq)
    start = check_start(rng.mq, rng.start, low, high, fail_on_data_loss=settings.fail_on_data_loss)
    if start >= rng.end or (start == low and rng.start > high):
        # Nothing of this range survives (or the queue was re-created: its data is read by later batches).
        return rng.end
    consumer.seek(rng.mq, start)
    return start


def _gap(settings: FetchSettings, mq: MessageQueue, expected: int, got: int) -> None:
    message = (f"{mq}: offsets {expected}..{got - 1} disappeared while the task was reading (retention "
               f"deleted them)")
    if settings.fail_on_data_loss:
        raise DataLossError(f"{message}. Set option failOnDataLoss=false to skip lost messages.")
    log.warning("tidemark data loss while reading event=data_loss %s", message)


def _stalled(settings: FetchSettings, rng: OffsetRange, expected: int) -> int:
    """No message for poll_timeout: decide between data loss and a broker that cannot deliver."""
    low, high = _bounds(settings.brokers, rng.mq)
    if high < rng.end or expected < low:
        message = describe_loss(rng.mq, rng.end if high < rng.end else expected, low, high)
        if settings.fail_on_data_loss:
            raise DataLossError(f"{message} (reading [{rng.start}, {rng.end}) stopped at {expected}). "
                                f"Set option failOnDataLoss=false to skip lost messages.")
        log.warning("tidemark data loss while reading event=data_loss %s", message)
        return rng.end
    raise TimeoutError(f"{rng.mq}: no message at offset {expected} within {settings.poll_timeout_s:.0f}s "
                       f"(reading [{rng.start}, {rng.end}); queue offsets [{low}, {high}]) from {settings.brokers}; "
                       f"raise option pollTimeoutMs or check the broker")


def _bounds(brokers: str, mq: MessageQueue) -> tuple[int, int]:
    with Admin(brokers=brokers) as admin:
        return admin.offsets([mq])[mq]
