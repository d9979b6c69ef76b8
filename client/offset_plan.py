"""Offset-reset plans, as `tidemark group reset-offset` and the console make them: what the target options
mean (kafka-consumer-groups' ISO durations, --all-topics, --to-current), Kafka's CSV plan format
(`topic,broker,queue,offset`, for --export and --from-file) and the rule that a plan is checked whole (every
step as a dry run) before any step is applied, so a refused step changes nothing anywhere."""

from __future__ import annotations

import csv
import io
import re

from tidemark.client.admin import Admin
from tidemark.client.errors import InvalidArgumentError, NotFoundError, TidemarkError
from tidemark.client.message import MessageQueue
from tidemark.client.types import OffsetChange, ResetTarget

_MAX_DURATION_MS = 100 * 365 * 86400 * 1000
_DURATION = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$")


def parse_iso_duration_ms(text: str) -> int:
    """ISO 8601 durations as kafka-consumer-groups takes them: PT10M, PT1H30M, P1D, PT45S."""
    m = _DURATION.fullmatch(text)
    if not m or text in ("P", "PT") or not any(m.groups()):
        raise InvalidArgumentError(f"--by-duration: {text!r} is not an ISO 8601 duration like PT10M or P1DT2H")
    days, hours, minutes, seconds = m.groups()
    total = (int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes or 0) * 60) * 1000
    total += int(float(seconds or 0) * 1000)
    if total > _MAX_DURATION_MS:
        raise InvalidArgumentError(f"--by-duration: {text!r} reaches back more than 100 years")
    return total


def group_topics(a: Admin, group: str) -> list[str]:
    """The topics a group has offsets for (--all-topics), its retry and dead-letter topics left out."""
    topics = sorted({s.queue.topic for s in a.consume_stats(group)} - {""})
    topics = [t for t in topics if not t.startswith("%")]
    if not topics:
        raise NotFoundError(f"group {group!r} has no offsets for any topic")
    return topics


def current_plan(a: Admin, group: str, topics: list[str], queue: MessageQueue | None) -> list[OffsetChange]:
    """The committed offsets as a plan that moves nothing (--to-current), of one queue or every queue."""
    return [OffsetChange(s.queue, s.consumer_offset, s.consumer_offset) for t in topics
            for s in a.consume_stats(group, t)
            if s.consumer_offset >= 0 and (queue is None or s.queue == queue)]


PlanStep = tuple[MessageQueue | None, str, ResetTarget, int]  # queue (None: every queue), topic, target, value
PlanRow = tuple[int, str, str, int, int]  # line number, topic, broker name ("": the old form), queue id, offset


def read_plan(text: str, source: str) -> list[PlanRow]:
    """The rows of a CSV plan: `topic,broker,queue,offset` per line (what --export prints: one row per queue,
    as kafka-consumer-groups has one per partition, with the broker that names the queue), or the old
    `topic,queue,offset`, broker "" (file_steps takes it for a topic on one broker only); blank lines are
    skipped. InvalidArgumentError naming the first bad row."""
    rows: list[PlanRow] = []
    for n, fields in enumerate(csv.reader(io.StringIO(text)), 1):
        if not fields or all(not f.strip() for f in fields):
            continue
        where = f"{source} line {n}"
        if len(fields) not in (3, 4):
            raise InvalidArgumentError(f"{where}: expected topic,queue,offset or topic,broker,queue,offset, got "
                                       f"{len(fields)} field(s)")
        topic, *broker, queue_text, offset_text = (f.strip() for f in fields)
        if not topic or broker == [""]:
            raise InvalidArgumentError(f"{where}: the {'topic' if not topic else 'broker'} is empty")
        try:
            queue_id, offset = int(queue_text), int(offset_text)
        except ValueError:
            raise InvalidArgumentError(f"{where}: queue {queue_text!r} and offset {offset_text!r} must be "
                                       f"integers") from None
        if not 0 <= queue_id <= 65535 or not 0 <= offset < 2**63:
            raise InvalidArgumentError(f"{where}: queue {queue_id} or offset {offset} is out of range")
        rows.append((n, topic, broker[0] if broker else "", queue_id, offset))
    if not rows:
        raise InvalidArgumentError(f"{source}: the plan has no rows")
    return rows


def pick_queue(queues: list[MessageQueue], topic: str, queue_id: int, broker: str, hint: str) -> MessageQueue:
    """The queue of `topic` with this id on `broker` ("": on whichever broker has it); InvalidArgumentError
    when none has it, or when several do and no broker is named (`hint` says how to name it)."""
    found = [q for q in queues if q.queue_id == queue_id and (not broker or q.broker_name == broker)]
    if not found:
        raise InvalidArgumentError(f"topic {topic!r} has no queue {queue_id}" + (f" on {broker}" if broker else ""))
    if len(found) > 1:
        raise InvalidArgumentError(f"topic {topic!r} has a queue {queue_id} on {len(found)} brokers "
                                   f"({', '.join(q.broker_name for q in found)}): {hint}")
    return found[0]


def queue_of(a: Admin, topic: str, queue_id: int | None, broker: str = "") -> MessageQueue | None:
    """The queue --queue and --broker-name (or the console's form) name, None for every queue;
    InvalidArgumentError when the topic has no such queue, or has it on several brokers and none is named."""
    if queue_id is None:
        return None
    return pick_queue(a.fetch_message_queues(topic), topic, queue_id, broker, "name its broker (--broker-name)")


def _row_queue(a: Admin, topic: str, broker: str, queue_id: int,
               routes: dict[str, list[MessageQueue]]) -> MessageQueue:
    """The queue a CSV row names; a row of the old form (no broker) only for a topic on one broker."""
    if topic not in routes:
        routes[topic] = a.fetch_message_queues(topic)
    brokers = sorted({q.broker_name for q in routes[topic]})
    if not broker and len(brokers) > 1:
        raise InvalidArgumentError(f"topic {topic!r} is on {len(brokers)} brokers ({', '.join(brokers)}): the row "
                                   f"must name the broker, topic,broker,queue,offset")
    return pick_queue(routes[topic], topic, queue_id, broker, "name the broker")


def file_steps(a: Admin, path: str) -> list[tuple[str, PlanStep]]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidArgumentError(f"--from-file {path}: {e.strerror if isinstance(e, OSError) else e}") from None
    steps = []
    routes: dict[str, list[MessageQueue]] = {}
    seen: dict[MessageQueue, int] = {}
    for n, topic, broker, queue_id, offset in read_plan(text, path):
        where = f"{path} line {n}"
        try:
            queue = _row_queue(a, topic, broker, queue_id, routes)
        except TidemarkError as e:
            raise type(e)(f"{where}: {e}") from None
        if queue in seen:
            raise InvalidArgumentError(f"{where}: {topic} {queue.broker_name} queue {queue_id} is already on line "
                                       f"{seen[queue]}")
        seen[queue] = n
        steps.append((where, (queue, topic, ResetTarget.OFFSET, offset)))
    return steps


def run_steps(a: Admin, group: str, steps: list[tuple[str, PlanStep]], *, dry_run: bool) -> list[OffsetChange]:
    """Each step in order (`where` names it in an error); run it with dry_run=True first, then False."""
    changes: list[OffsetChange] = []
    for where, (queue, topic, target, value) in steps:
        try:
            changes.extend(a.reset_offset(group, topic, target, value, queue=queue, dry_run=dry_run))
        except TidemarkError as e:
            raise type(e)(f"{where}: {e}" if where else str(e)) from None
    return changes

