"""Driver side: turn options and the brokers' offsets into offset ranges, and commit progress.

Every function opens its own Admin client and closes it before returning, so the
reader objects that call them hold nothing but options and plain dicts.
"""

from __future__ import annotations

from collections.abc import Mapping

from client import Admin
from client.errors import NotFoundError, TidemarkError
from client.message import MessageQueue
from spark_connector.offsets import (
    EARLIEST,
    LATEST,
    OffsetRange,
    check_start,
    next_batch_end,
    offsets_from_json,
    offsets_to_json,
    split_ranges,
)
from spark_connector.options import OffsetKind, OptionError, ReadOptions
from tidemark.logs import get_logger

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


def _bounds(admin: Admin, options: ReadOptions) -> Bounds:
    return admin.offsets(topic_queues(admin, options.topics))


def _check_known(name: str, spec: Mapping[MessageQueue, int], bounds: Bounds) -> None:
    for mq in spec:
        if mq not in bounds:
            have = ", ".join(f"{q.broker_name}/{q.queue_id}" for q in bounds if q.topic == mq.topic) or "none"
            raise OptionError(f"tidemark option {name!r} names {mq}, which does not exist "
                              f"(queues of {mq.topic}: {have})")


def start_offsets(admin: Admin, options: ReadOptions, bounds: Bounds) -> dict[MessageQueue, int]:
    """Where the query starts on every queue, checked against the queues' offsets (failOnDataLoss)."""
    spec = options.starting
    fail = options.fail_on_data_loss
    if options.starting_timestamp is not None:
        return {mq: admin.search_offset(mq, options.starting_timestamp) for mq in bounds}
    if isinstance(spec, Mapping):
        _check_known("startingOffsets", spec, bounds)
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
            value = spec.get(mq, EARLIEST)  # type: ignore[union-attr]
            if value == EARLIEST:
                out[mq] = low
            elif value == LATEST:
                out[mq] = high
            else:
                out[mq] = check_start(mq, value, low, high, fail_on_data_loss=fail)
    return out


def end_offsets(options: ReadOptions, bounds: Bounds, starts: Mapping[MessageQueue, int]) -> dict[MessageQueue, int]:
    spec = options.ending
    if not isinstance(spec, Mapping):
        return {mq: max(high, starts[mq]) for mq, (_, high) in bounds.items()}
    _check_known("endingOffsets", spec, bounds)
    out: dict[MessageQueue, int] = {}
    for mq, (_, high) in bounds.items():
        value = spec.get(mq, LATEST)
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
    ends = end_offsets(options, bounds, starts)
    return split_ranges([OffsetRange(mq, starts[mq], ends[mq]) for mq in bounds], options.min_partitions)


# -- streaming ---------------------------------------------------------------------


def initial_offsets(options: ReadOptions) -> OffsetsJson:
    with _admin(options) as admin:
        bounds = _bounds(admin, options)
        return offsets_to_json(start_offsets(admin, options, bounds))


def latest_offsets(options: ReadOptions) -> OffsetsJson:
    with _admin(options) as admin:
        return offsets_to_json({mq: high for mq, (_, high) in _bounds(admin, options).items()})


def next_offsets(options: ReadOptions, start: OffsetsJson, *, max_rows: int | None,
                 target: OffsetsJson | None) -> tuple[OffsetsJson, OffsetsJson]:
    """(end offset of the next micro-batch, latest offsets seen); see offsets.next_batch_end."""
    with _admin(options) as admin:
        bounds = _bounds(admin, options)
    end = next_batch_end(offsets_from_json(start), bounds, max_rows=max_rows,
                         target=None if target is None else offsets_from_json(target),
                         fail_on_data_loss=options.fail_on_data_loss)
    return offsets_to_json(end), offsets_to_json({mq: high for mq, (_, high) in bounds.items()})


def stream_ranges(options: ReadOptions, start: OffsetsJson, end: OffsetsJson) -> list[OffsetRange]:
    """Ranges of one micro-batch: queues known at both ends, moved forward (pure, no network)."""
    starts, ends = offsets_from_json(start), offsets_from_json(end)
    ranges = [OffsetRange(mq, starts[mq], e) for mq, e in sorted(ends.items()) if mq in starts and e > starts[mq]]
    return split_ranges(ranges, options.min_partitions)


def commit_offsets(options: ReadOptions, end: OffsetsJson) -> bool:
    """Store processed offsets as the group's committed offsets (consume stats, lag); False if that failed."""
    if not (options.commit_offsets and options.group):
        return True
    offsets = offsets_from_json(end)
    if not offsets:
        return True
    try:
        with _admin(options) as admin:
            admin.commit(options.group, offsets)
    except TidemarkError as e:
        # The checkpoint, not the broker, is the source of truth; the next commit catches up.
        log.warning("tidemark offset commit failed", event="spark_commit_failed", group=options.group, error=e)
        return False
    return True
