"""Offset-reset plans, as `tidemark group reset-offset` and the console make them: what the target options
mean (kafka-consumer-groups' ISO durations, --all-topics, --to-current), Kafka's CSV plan format
(`topic,queue,offset`, for --export and --from-file) and the rule that a plan is checked whole (every
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


def current_plan(a: Admin, group: str, topics: list[str], queue: int | None) -> list[OffsetChange]:
    return [OffsetChange(s.queue, s.consumer_offset, s.consumer_offset) for t in topics
            for s in a.consume_stats(group, t)
            if s.consumer_offset >= 0 and (queue is None or s.queue.queue_id == queue)]


PlanStep = tuple[MessageQueue | None, str, ResetTarget, int]  # queue (None: every queue), topic, target, value


def read_plan(text: str, source: str) -> list[tuple[int, str, int, int]]:
    """The rows of a CSV plan, (line number, topic, queue, offset): `topic,queue,offset` per line
    (kafka-consumer-groups --export's format with partition as queue id); blank lines are skipped.
    InvalidArgumentError naming the first bad row."""
    rows: list[tuple[int, str, int, int]] = []
    seen: dict[tuple[str, int], int] = {}
    for n, fields in enumerate(csv.reader(io.StringIO(text)), 1):
        if not fields or all(not f.strip() for f in fields):
            continue
        where = f"{source} line {n}"
        if len(fields) != 3:
            raise InvalidArgumentError(f"{where}: expected topic,queue,offset, got {len(fields)} field(s)")
        topic, queue_text, offset_text = (f.strip() for f in fields)
        if not topic:
            raise InvalidArgumentError(f"{where}: the topic is empty")
        try:
            queue_id, offset = int(queue_text), int(offset_text)
        except ValueError:
            raise InvalidArgumentError(f"{where}: queue {queue_text!r} and offset {offset_text!r} must be "
                                       f"integers") from None
        if not 0 <= queue_id <= 65535 or not 0 <= offset < 2**63:
            raise InvalidArgumentError(f"{where}: queue {queue_id} or offset {offset} is out of range")
        if (topic, queue_id) in seen:
            raise InvalidArgumentError(f"{where}: {topic} queue {queue_id} is already on line "
                                       f"{seen[topic, queue_id]}")
        seen[topic, queue_id] = n
        rows.append((n, topic, queue_id, offset))
    if not rows:
        raise InvalidArgumentError(f"{source}: the plan has no rows")
    return rows


def queue_of(a: Admin, topic: str, queue_id: int | None) -> MessageQueue | None:
    """The queue --queue (or the console's form) names, None for every queue; InvalidArgumentError when the
    topic has no such queue. (Several brokers each holding that id: the first, as today's reset takes it.)"""
    if queue_id is None:
        return None
    queue = next((q for q in a.fetch_message_queues(topic) if q.queue_id == queue_id), None)
    if queue is None:
        raise InvalidArgumentError(f"topic {topic!r} has no queue {queue_id}")
    return queue


def one_broker_queue(a: Admin, topic: str, queue_id: int, routes: dict[str, list[MessageQueue]]) -> MessageQueue:
    """The queue a CSV row names: its topic must be on one broker (a row carries no broker name)."""
    if topic not in routes:
        routes[topic] = a.fetch_message_queues(topic)
    brokers = sorted({q.broker_name for q in routes[topic]})
    if len(brokers) > 1:
        raise InvalidArgumentError(f"topic {topic!r} is on {len(brokers)} brokers ({', '.join(brokers)}): a CSV "
                                   f"row names only a queue id")
    queue = next((q for q in routes[topic] if q.queue_id == queue_id), None)
    if queue is None:
        raise InvalidArgumentError(f"topic {topic!r} has no queue {queue_id}")
    return queue


def file_steps(a: Admin, path: str) -> list[tuple[str, PlanStep]]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidArgumentError(f"--from-file {path}: {e.strerror if isinstance(e, OSError) else e}") from None
    steps = []
    routes: dict[str, list[MessageQueue]] = {}
    for n, topic, queue_id, offset in read_plan(text, path):
        where = f"{path} line {n}"
        try:
            queue = one_broker_queue(a, topic, queue_id, routes)
        except TidemarkError as e:
            raise type(e)(f"{where}: {e}") from None
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


def check_exportable(changes: list[OffsetChange]) -> None:
    brokers: dict[str, set[str]] = {}
    for c in changes:
        brokers.setdefault(c.queue.topic, set()).add(c.queue.broker_name)
    for topic, names in brokers.items():
        if len(names) > 1:
            raise InvalidArgumentError(f"--export: topic {topic!r} is on {len(names)} brokers "
                                       f"({', '.join(sorted(names))}): a CSV row names only a queue id")
