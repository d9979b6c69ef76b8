"""Offset arithmetic of the connector, free of Spark and of the network.

Offsets are consume-queue indexes; an offset names the next message to read, so
a range [start, end) holds end - start messages. Streaming offsets live in
Spark's checkpoint as JSON with string keys:

    {"topic": {"broker-a": {"0": 120, "1": 98}}}
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tidemark.client.errors import InvalidArgumentError, TidemarkError
from tidemark.client.message import MessageQueue
from tidemark.common.logs import get_logger

log = get_logger("tidemark.spark")

# Sentinels accepted in startingOffsets / endingOffsets JSON (Kafka's -2 / -1; options.py).
EARLIEST = -2
LATEST = -1


class OffsetFormatError(InvalidArgumentError):
    """An offsets JSON document does not have the {"topic": {"broker": {"queueId": offset}}} shape."""


class DataLossError(TidemarkError, RuntimeError):
    """Messages the query should read are gone (retention) or the queue was re-created."""


def offsets_to_json(offsets: Mapping[MessageQueue, int]) -> dict[str, dict[str, dict[str, int]]]:
    """Nested dict with string keys, sorted, so equal positions always serialize equally."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for mq in sorted(offsets):
        out.setdefault(mq.topic, {}).setdefault(mq.broker_name, {})[str(mq.queue_id)] = int(offsets[mq])
    return out


def offsets_from_json(doc: Any) -> dict[MessageQueue, int]:
    """Inverse of offsets_to_json; OffsetFormatError says what is wrong. (Offsets in options, which may
    name a queue id on every broker and use sentinels, are parsed by queues.parse_queue_values.)"""
    if not isinstance(doc, dict):
        raise OffsetFormatError(f'expected a JSON object {{"topic": {{"broker": {{"queueId": offset}}}}}}, '
                                f"got {type(doc).__name__}")
    out: dict[MessageQueue, int] = {}
    for topic, brokers in doc.items():
        if not isinstance(brokers, dict):
            raise OffsetFormatError(f"topic {topic!r} must map broker names to objects, got {brokers!r}")
        for broker, queues in brokers.items():
            if not isinstance(queues, dict):
                raise OffsetFormatError(f"broker {broker!r} of topic {topic!r} must map queue ids to offsets, "
                                        f"got {queues!r}")
            for queue_id, offset in queues.items():
                try:
                    qid = int(queue_id)
                except (TypeError, ValueError):
                    raise OffsetFormatError(f"queue id {queue_id!r} of {topic}/{broker} is not an integer") from None
                if qid < 0:
                    raise OffsetFormatError(f"queue id {qid} of {topic}/{broker} is negative")
                if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                    raise OffsetFormatError(f"offset of {topic}/{broker}/{qid} must be an integer >= 0, "
                                            f"got {offset!r}")
                out[MessageQueue(topic, broker, qid)] = offset
    return out


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Messages [start, end) of one queue."""

    mq: MessageQueue
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def rate_limit(starts: Mapping[MessageQueue, int], latest: Mapping[MessageQueue, int],
               limit: int) -> dict[MessageQueue, int]:
    """End offsets that admit at most `limit` messages, split in proportion to each queue's backlog.

    Like Spark's Kafka source, but by largest remainder so the total never exceeds
    the limit (Kafka rounds small shares up and may overshoot).
    """
    if limit < 1:
        raise InvalidArgumentError(f"limit must be >= 1, got {limit}")
    backlog = {mq: max(0, latest[mq] - starts[mq]) for mq in latest}
    total = sum(backlog.values())
    if total <= limit:
        return {mq: starts[mq] + backlog[mq] for mq in latest}
    share = {mq: limit * size // total for mq, size in backlog.items()}
    left = limit - sum(share.values())
    # Largest fractional part first; queue order breaks ties so the split is deterministic.
    by_remainder = sorted((mq for mq in backlog if share[mq] < backlog[mq]),
                          key=lambda mq: (-(limit * backlog[mq] % total), mq))
    for mq in by_remainder[:left]:
        share[mq] += 1
    return {mq: starts[mq] + share[mq] for mq in latest}


def waiting_messages(starts: Mapping[MessageQueue, int], bounds: Mapping[MessageQueue, tuple[int, int]]) -> int:
    """Messages after `starts` on the queues it knows (what the next micro-batch could read)."""
    return sum(max(0, high - starts[mq]) for mq, (_, high) in bounds.items() if mq in starts)


def split_ranges(ranges: Iterable[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Non-empty ranges, large ones cut so there are about min_partitions pieces (Kafka's rule).

    A range larger than total / min_partitions is split into round(size / ideal)
    contiguous pieces of nearly equal size; small ranges stay whole.
    """
    ranges = [r for r in ranges if r.size > 0]
    total = sum(r.size for r in ranges)
    if not min_partitions or min_partitions <= len(ranges) or total == 0:
        return ranges
    out: list[OffsetRange] = []
    for r in ranges:
        # size > total / min_partitions, in integers; pieces = round(size * min_partitions / total).
        if r.size * min_partitions > total:
            pieces = min(r.size, max(1, (2 * r.size * min_partitions + total) // (2 * total)))
            bounds = [r.start + r.size * i // pieces for i in range(pieces + 1)]
            out.extend(OffsetRange(r.mq, a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a)
        else:
            out.append(r)
    return out


def pack_ranges(ranges: Iterable[OffsetRange], tasks: int) -> list[tuple[OffsetRange, ...]]:
    """The ranges in at most `tasks` groups of about equal size, one Spark task each.

    A micro-batch of many small ranges in as many tasks runs them in several waves of the task
    slots, and each task has a fixed cost (scheduling, the Python worker, opening the queue) that
    a small range does not amortize; Spark packs small files into partitions for the same reason.
    Largest range first, each to the group with the fewest messages so far (ties: the earlier
    group), so no group is much larger than its share or than its largest range; with no more
    ranges than tasks, every range is its own group. Within a group, ranges keep queue order.
    """
    ranges = [r for r in ranges if r.size > 0]
    if tasks < 1:
        raise InvalidArgumentError(f"tasks must be >= 1, got {tasks}")
    if len(ranges) <= tasks:
        return [(r,) for r in ranges]
    loads = [(0, i) for i in range(tasks)]  # (messages so far, group index): a min-heap
    groups: list[list[OffsetRange]] = [[] for _ in range(tasks)]
    for r in sorted(ranges, key=lambda r: (-r.size, r.mq, r.start)):
        size, i = heapq.heappop(loads)
        groups[i].append(r)
        heapq.heappush(loads, (size + r.size, i))
    packed = [tuple(sorted(g, key=lambda r: (r.mq, r.start))) for g in groups if g]
    return sorted(packed, key=lambda g: (g[0].mq, g[0].start))


def describe_loss(mq: MessageQueue, offset: int, low: int, high: int) -> str:
    if offset < low:
        return (f"{mq}: offset {offset} is below the queue's min offset {low}; messages {offset}..{low - 1} "
                f"were deleted (retention) before they were read")
    return (f"{mq}: offset {offset} is beyond the queue's max offset {high}; the topic was probably deleted "
            f"and re-created")


def check_start(mq: MessageQueue, offset: int, low: int, high: int, *, fail_on_data_loss: bool) -> int:
    """Where to start reading a queue whose valid offsets are [low, high].

    Inside the range: offset itself. Outside, with failOnDataLoss: DataLossError
    naming the queue. Without: a warning, then the queue's min offset (below min:
    the first message still stored; above max: the queue was re-created, so
    everything in it is new).
    """
    if low <= offset <= high:
        return offset
    message = describe_loss(mq, offset, low, high)
    if fail_on_data_loss:
        raise DataLossError(f"{message}. Set option failOnDataLoss=false to continue from offset {low} instead.")
    log.warning("tidemark data loss, continuing at min offset", event="data_loss", detail=message, continue_at=low)
    return low


def next_batch_end(starts: Mapping[MessageQueue, int], bounds: Mapping[MessageQueue, tuple[int, int]], *,
                   max_rows: int | None, target: Mapping[MessageQueue, int] | None,
                   fail_on_data_loss: bool) -> dict[MessageQueue, int]:
    """End offsets of the next micro-batch from its start and the queues' (min, max) offsets.

    - A queue the start does not know (new queue or topic) joins at its min offset with no
      rows in this batch, and is read from the next one: partitions() stays a pure function
      of (start, end).
    - A start below a queue's min (retention) or above its max (re-created queue) is data
      loss (check_start). Above max, the queue rejoins at its min offset like a new one.
    - max_rows (ReadMaxRows) is split over the queues by backlog (rate_limit).
    - With a target (Trigger.AvailableNow) no queue passes it and queues outside it are left.
    - Queues that disappeared keep their offsets.
    """
    caps = {mq: high for mq, (_, high) in bounds.items()}
    if target is not None:
        caps = {mq: min(high, target[mq]) for mq, high in caps.items() if mq in target}
    ends: dict[MessageQueue, int] = {}
    froms: dict[MessageQueue, int] = {}
    for mq in caps:
        low, high = bounds[mq]
        begin = starts.get(mq)
        if begin is None:
            ends[mq] = low
            continue
        resolved = check_start(mq, begin, low, high, fail_on_data_loss=fail_on_data_loss)
        if begin > high:
            ends[mq] = resolved
        else:
            froms[mq] = resolved
    if max_rows is None:
        ends.update({mq: max(froms[mq], caps[mq]) for mq in froms})
    else:
        ends.update(rate_limit(froms, {mq: caps[mq] for mq in froms}, max_rows))
    merged = dict(starts)
    merged.update(ends)
    return merged
