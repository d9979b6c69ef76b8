"""Driver side: turn options and the brokers' offsets into offset ranges, and commit progress.

A batch read plans once, with an Admin it opens and closes. A stream plans every
trigger on the one Python process Spark keeps for the query's source, through a
PlanningClient that keeps one Admin open for the query (closed when Spark stops the
source); the reader objects themselves hold nothing but options and plain dicts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from tidemark.client import Admin
from tidemark.client.errors import NotFoundError, TidemarkError
from tidemark.client.message import MessageQueue
from tidemark.common.logs import get_logger
from tidemark.spark_connector.admission import TriggerGate
from tidemark.spark_connector.offsets import (
    EARLIEST,
    LATEST,
    OffsetRange,
    check_start,
    next_batch_end,
    offsets_from_json,
    offsets_to_json,
    pack_ranges,
    split_ranges,
    waiting_messages,
)
from tidemark.spark_connector.options import ByTimestamp, OffsetKind, OptionError, ReadOptions
from tidemark.spark_connector.queues import QueueRef, Subscription, resolve, unmatched

log = get_logger("tidemark.spark")

Bounds = dict[MessageQueue, tuple[int, int]]
OffsetsJson = dict[str, dict[str, dict[str, int]]]


def _admin(options: ReadOptions) -> Admin:
    return Admin(**options.client_kwargs())


def topic_queues(admin: Admin, topics: tuple[str, ...]) -> list[MessageQueue]:
    """Readable queues of every topic; an unknown topic is an OptionError naming it."""
    mqs: list[MessageQueue] = []
    for topic in topics:
        try:
            mqs.extend(admin.fetch_message_queues(topic))
        except NotFoundError as e:
            raise OptionError(f"tidemark option 'topic': topic {topic!r} does not exist ({e})") from None
    return sorted(mqs)


def subscribed_queues(admin: Admin, subscription: Subscription, *, strict: bool) -> list[MessageQueue]:
    """The readable queues a read covers now. A pattern is matched against the brokers' topics (system
    topics excluded) on every call, so a stream picks up new matching topics; a matching topic deleted
    meanwhile is left out. strict: every assigned queue must exist (OptionError naming the missing ones);
    otherwise a missing assigned queue is left out."""
    if subscription.pattern is None:
        if not subscription.assign:
            return topic_queues(admin, subscription.topics)
        mqs = subscription.select(topic_queues(admin, subscription.topic_names()))
        missing = unmatched(subscription.assign, mqs)
        if strict and missing:
            raise OptionError(f"tidemark option 'assign' names {', '.join(map(str, missing))}, which do not exist "
                              f"(readable queues of the topics: {_describe(admin, subscription.topic_names())})")
        return mqs
    mqs = []
    for topic in admin.list_topics():
        if subscription.covers_topic(topic):
            with contextlib.suppress(NotFoundError):
                mqs.extend(admin.fetch_message_queues(topic))
    return sorted(mqs)


def _describe(admin: Admin, topics: tuple[str, ...]) -> str:
    return ", ".join(f"{mq.topic}/{mq.broker_name}/{mq.queue_id}" for mq in topic_queues(admin, topics)) or "none"


def _bounds(admin: Admin, options: ReadOptions, *, strict: bool = True) -> Bounds:
    return admin.offsets(subscribed_queues(admin, options.subscription, strict=strict))


def _check_known(name: str, spec: Mapping[QueueRef, int], bounds: Bounds) -> None:
    for ref in unmatched(spec, bounds):
        have = ", ".join(f"{q.broker_name}/{q.queue_id}" for q in bounds if q.topic == ref.topic) or "none"
        named = (MessageQueue(ref.topic, ref.broker, ref.queue_id) if ref.broker is not None
                 else f"queue id {ref.queue_id} of {ref.topic} (on any broker)")
        raise OptionError(f"tidemark option {name!r} names {named}, which does not exist "
                          f"(queues of {ref.topic} read: {have})")


def _by_timestamp(admin: Admin, name: str, spec: ByTimestamp, bounds: Bounds, *,
                  left_out: int) -> dict[MessageQueue, int]:
    """Offsets of the first messages stored at or after the times; a queue with none: its max offset
    (Kafka's "latest" strategy). Queues without a time get `left_out` (EARLIEST or LATEST)."""
    if spec.every_queue is not None:
        times = dict.fromkeys(bounds, spec.every_queue)
    else:
        _check_known(name, spec.per_queue, bounds)
        times = resolve(spec.per_queue, bounds)
    out = {}
    for mq, (low, high) in bounds.items():
        out[mq] = admin.search_offset(mq, times[mq]) if mq in times else (low if left_out == EARLIEST else high)
    return out


def start_offsets(admin: Admin, options: ReadOptions, bounds: Bounds) -> dict[MessageQueue, int]:
    """Where the query starts on every queue, checked against the queues' offsets (failOnDataLoss)."""
    spec = options.starting
    fail = options.fail_on_data_loss
    if isinstance(spec, ByTimestamp):
        return _by_timestamp(admin, "startingOffsetsByTimestamp", spec, bounds, left_out=EARLIEST)
    explicit: dict[MessageQueue, int] = {}
    if isinstance(spec, Mapping):
        _check_known("startingOffsets", spec, bounds)
        explicit = resolve(spec, bounds)
    out: dict[MessageQueue, int] = {}
    for mq, (low, high) in bounds.items():
        if spec is OffsetKind.EARLIEST:
            out[mq] = low
        elif spec is OffsetKind.LATEST:
            out[mq] = high
        elif spec is OffsetKind.COMMITTED:
            committed = admin.committed(options.group, mq)  # type: ignore[arg-type]
            out[mq] = low if committed < 0 else check_start(mq, committed, low, high, fail_on_data_loss=fail)
        else:
            value = explicit.get(mq, EARLIEST)
            if value == EARLIEST:
                out[mq] = low
            elif value == LATEST:
                out[mq] = high
            else:
                out[mq] = check_start(mq, value, low, high, fail_on_data_loss=fail)
    return out


def end_offsets(admin: Admin, options: ReadOptions, bounds: Bounds,
                starts: Mapping[MessageQueue, int]) -> dict[MessageQueue, int]:
    spec = options.ending
    if isinstance(spec, ByTimestamp):
        # A time before a queue's start offset is an empty range there, not an error: times say
        # nothing about where each queue's start lies.
        ends = _by_timestamp(admin, "endingOffsetsByTimestamp", spec, bounds, left_out=LATEST)
        return {mq: max(end, starts[mq]) for mq, end in ends.items()}
    if not isinstance(spec, Mapping):
        return {mq: max(high, starts[mq]) for mq, (_, high) in bounds.items()}
    _check_known("endingOffsets", spec, bounds)
    explicit = resolve(spec, bounds)
    out: dict[MessageQueue, int] = {}
    for mq, (_, high) in bounds.items():
        value = explicit.get(mq, LATEST)
        end = high if value == LATEST else value
        if end > high:
            raise OptionError(f"tidemark option 'endingOffsets' asks for {mq} up to {end}, beyond its max offset {high}")
        if end < starts[mq]:
            raise OptionError(f"tidemark option 'endingOffsets' for {mq} is {end}, before its start offset "
                              f"{starts[mq]}")
        out[mq] = end
    return out


def plan_batch(options: ReadOptions) -> list[OffsetRange]:
    """The ranges of a batch read, split for minPartitions."""
    with _admin(options) as admin:
        bounds = _bounds(admin, options)
        starts = start_offsets(admin, options, bounds)
        ends = end_offsets(admin, options, bounds, starts)
    return split_ranges([OffsetRange(mq, starts[mq], ends[mq]) for mq in bounds], options.min_partitions)


# -- streaming ---------------------------------------------------------------------


class PlanningClient:
    """The Admin a stream's planning calls go through: opened on first use and kept, since Spark calls
    a stream reader's methods one at a time on one Python process for the whole query (a client per
    call cost each trigger two connections, one for latestOffset and one for the commit). A call that
    fails closes it (the next opens a new one); close() when the query stops. Pickles without it."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._admin: Admin | None = None

    @contextlib.contextmanager
    def admin(self) -> Iterator[Admin]:
        if self._admin is None:
            self._admin = _admin(self.options).start()
        try:
            yield self._admin
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            admin.shutdown()

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_admin": None}


def initial_offsets(client: PlanningClient) -> OffsetsJson:
    with client.admin() as admin:
        bounds = _bounds(admin, client.options)
        return offsets_to_json(start_offsets(admin, client.options, bounds))


def latest_offsets(client: PlanningClient) -> OffsetsJson:
    with client.admin() as admin:
        bounds = _bounds(admin, client.options, strict=False)
    return offsets_to_json({mq: high for mq, (_, high) in bounds.items()})


def next_offsets(client: PlanningClient, start: OffsetsJson, *, max_rows: int | None, target: OffsetsJson | None,
                 gate: TriggerGate | None = None) -> tuple[OffsetsJson, OffsetsJson]:
    """(end offset of the next micro-batch, latest offsets seen); see offsets.next_batch_end. A gate
    (minOffsetsPerTrigger) that holds the batch back leaves every known queue where it is."""
    options = client.options
    with client.admin() as admin:
        bounds = _bounds(admin, options, strict=False)
    starts = offsets_from_json(start)
    if gate is not None and not gate.admit(waiting_messages(starts, bounds)):
        # Queues new to the stream still join (at their min offset, no rows), as in next_batch_end:
        # their messages count towards the gate from the next trigger on.
        end = {**starts, **{mq: low for mq, (low, _) in bounds.items() if mq not in starts}}
    else:
        end = next_batch_end(starts, bounds, max_rows=max_rows,
                             target=None if target is None else offsets_from_json(target),
                             fail_on_data_loss=options.fail_on_data_loss)
    return offsets_to_json(end), offsets_to_json({mq: high for mq, (_, high) in bounds.items()})


def stream_ranges(options: ReadOptions, start: OffsetsJson, end: OffsetsJson) -> list[OffsetRange]:
    """Ranges of one micro-batch: queues known at both ends, moved forward (pure, no network)."""
    starts, ends = offsets_from_json(start), offsets_from_json(end)
    ranges = [OffsetRange(mq, starts[mq], e) for mq, e in sorted(ends.items()) if mq in starts and e > starts[mq]]
    return split_ranges(ranges, options.min_partitions)


def stream_tasks(options: ReadOptions, start: OffsetsJson, end: OffsetsJson,
                 slots: int | None) -> list[tuple[OffsetRange, ...]]:
    """The ranges of one micro-batch grouped into its Spark tasks: one wave of the application's task
    slots (offsets.pack_ranges), but never fewer tasks than minPartitions asks for; one task per range
    when the slots are unknown (pure, no network)."""
    ranges = stream_ranges(options, start, end)
    if slots is None:
        return [(r,) for r in ranges]
    return pack_ranges(ranges, max(slots, options.min_partitions or 1))


def commit_offsets(client: PlanningClient, end: OffsetsJson) -> bool:
    """Store processed offsets as the group's committed offsets (consume stats, lag); False if that failed."""
    options = client.options
    if not (options.commit_offsets and options.group):
        return True
    offsets = offsets_from_json(end)
    if not offsets:
        return True
    try:
        with client.admin() as admin:
            admin.commit(options.group, offsets)
    except TidemarkError as e:
        # The checkpoint, not the broker, is the source of truth; the next commit catches up.
        log.warning("tidemark offset commit failed", event="spark_commit_failed", group=options.group, error=e)
        return False
    return True
