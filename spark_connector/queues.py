"""Which queues a read covers, and per-queue values given in options; pure, no network.

A read subscribes in one of three ways (Kafka's subscribe / subscribePattern / assign):

    topic             "orders,refunds": every readable queue of these topics
    subscribePattern  "orders-.*": every readable queue of every topic whose whole name matches,
                      looked up again at each micro-batch, so new matching topics join a stream
    assign            {"orders": [0, 1]}: these queue ids on every broker of the topic, or
                      {"orders": {"broker-a": [0, 1]}}: these queues of one broker (both forms mix)

Per-queue values (startingOffsets, *OffsetsByTimestamp) name a queue the same two ways:

    {"orders": {"broker-a": {"0": 5}}}   queue 0 of broker-a
    {"orders": {"0": 5}}                 queue 0 of every broker (Kafka's form; one broker: the same)

A broker-level entry wins over a flat one for the same queue id. The form is told by the
value's type (an object is a broker, a number or list is a queue), so broker names need no rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tidemark.client.errors import InvalidArgumentError
from tidemark.client.message import MessageQueue
from tidemark.common.protocol import InvalidNameError, check_topic_name


class QueueSpecError(InvalidArgumentError):
    """A queue JSON document (assign, per-queue offsets or timestamps) is malformed."""


@dataclass(frozen=True, slots=True, order=True)
class QueueRef:
    """A queue named in an option: one broker's queue, or (broker None) that queue id on every broker."""

    topic: str
    broker: str | None
    queue_id: int

    def matches(self, mq: MessageQueue) -> bool:
        return (mq.topic == self.topic and mq.queue_id == self.queue_id
                and (self.broker is None or mq.broker_name == self.broker))

    def __str__(self) -> str:
        return f"{self.topic}/{self.broker or '*'}/{self.queue_id}"


@dataclass(frozen=True, slots=True)
class Subscription:
    """Exactly one of: topic names, a pattern over topic names, assigned queues."""

    topics: tuple[str, ...] = ()
    pattern: re.Pattern[str] | None = None
    assign: tuple[QueueRef, ...] = ()

    @property
    def option(self) -> str:
        return "subscribePattern" if self.pattern is not None else "assign" if self.assign else "topic"

    def topic_names(self) -> tuple[str, ...]:
        """Topics known without asking a broker (none for a pattern)."""
        return tuple(dict.fromkeys(ref.topic for ref in self.assign)) if self.assign else self.topics

    def covers_topic(self, topic: str) -> bool:
        if self.pattern is not None:
            return self.pattern.fullmatch(topic) is not None
        return topic in self.topic_names()

    def select(self, queues: Iterable[MessageQueue]) -> list[MessageQueue]:
        """The queues of the subscription among `queues` (all readable queues of its topics)."""
        if self.assign:
            return sorted(mq for mq in queues if any(ref.matches(mq) for ref in self.assign))
        return sorted(mq for mq in queues if self.covers_topic(mq.topic))

    def describe(self) -> str:
        if self.pattern is not None:
            return f"subscribePattern {self.pattern.pattern!r}"
        if self.assign:
            return f"assign {', '.join(map(str, self.assign))}"
        return f"topic {','.join(self.topics)}"


def compile_pattern(text: str) -> re.Pattern[str]:
    """A topic-name regex. Python's `re` accepts the Java syntax used in practice (classes, groups,
    quantifiers, possessive and atomic forms); the whole name must match, as Java's matches()."""
    if not text.strip():
        raise QueueSpecError("the pattern is empty")
    try:
        return re.compile(text.strip())
    except re.error as e:
        raise QueueSpecError(f"{text!r} is not a valid regular expression ({e})") from None


def _topic(name: Any) -> str:
    try:
        check_topic_name(name)
    except InvalidNameError as e:
        raise QueueSpecError(str(e)) from None
    return name


def _queue_id(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise QueueSpecError(f"queue id {value!r} of {where} is not an integer")
    try:
        qid = int(value)
    except (TypeError, ValueError):
        raise QueueSpecError(f"queue id {value!r} of {where} is not an integer") from None
    if qid < 0 or (isinstance(value, float) and value != qid):
        raise QueueSpecError(f"queue id {value!r} of {where} must be an integer >= 0")
    return qid


def parse_assign(doc: Any) -> tuple[QueueRef, ...]:
    """{"topic": [queueId, ...]} or {"topic": {"broker": [queueId, ...]}} (forms may mix per topic)."""
    if not isinstance(doc, dict) or not doc:
        raise QueueSpecError('expected a non-empty JSON object like {"topic": [0, 1]} or '
                             '{"topic": {"broker-a": [0, 1]}}')
    refs: list[QueueRef] = []

    def ids(value: Any, topic: str, broker: str | None) -> None:
        where = f"{topic}/{broker}" if broker else topic
        if not isinstance(value, list) or not value:
            raise QueueSpecError(f"{where} must map to a non-empty list of queue ids, got {value!r}")
        refs.extend(QueueRef(topic, broker, _queue_id(v, where)) for v in value)

    for topic, value in doc.items():
        _topic(topic)
        if isinstance(value, dict):
            if not value:
                raise QueueSpecError(f"topic {topic!r} names no broker")
            for broker, queues in value.items():
                ids(queues, topic, broker)
        else:
            ids(value, topic, None)
    return tuple(sorted(set(refs), key=lambda r: (r.topic, r.broker or "", r.queue_id)))


def parse_queue_values(doc: Any, check: Callable[[Any, str], int]) -> dict[QueueRef, int]:
    """{"topic": {"queueId": v}} or {"topic": {"broker": {"queueId": v}}}; check(v, where) validates v."""
    if not isinstance(doc, dict):
        raise QueueSpecError(f'expected a JSON object {{"topic": {{"queueId": value}}}} or '
                             f'{{"topic": {{"broker": {{"queueId": value}}}}}}, got {type(doc).__name__}')
    out: dict[QueueRef, int] = {}
    for topic, entries in doc.items():
        _topic(topic)
        if not isinstance(entries, dict):
            raise QueueSpecError(f"topic {topic!r} must map queue ids (or broker names) to values, got {entries!r}")
        for key, value in entries.items():
            if isinstance(value, dict):  # broker level
                for queue_id, v in value.items():
                    where = f"{topic}/{key}/{queue_id}"
                    out[QueueRef(topic, key, _queue_id(queue_id, f"{topic}/{key}"))] = check(v, where)
            else:
                out[QueueRef(topic, None, _queue_id(key, topic))] = check(value, f"{topic}/{key}")
    return out


def resolve(values: Mapping[QueueRef, int], queues: Iterable[MessageQueue]) -> dict[MessageQueue, int]:
    """Each queue's value: its broker's entry, else the flat entry for its queue id; queues named by
    no entry are left out."""
    out: dict[MessageQueue, int] = {}
    for mq in queues:
        exact = values.get(QueueRef(mq.topic, mq.broker_name, mq.queue_id))
        value = exact if exact is not None else values.get(QueueRef(mq.topic, None, mq.queue_id))
        if value is not None:
            out[mq] = value
    return out


def unmatched(refs: Iterable[QueueRef], queues: Iterable[MessageQueue]) -> list[QueueRef]:
    """The refs that name no queue among `queues`."""
    queues = list(queues)
    return [ref for ref in refs if not any(ref.matches(mq) for mq in queues)]


__all__ = ["QueueRef", "QueueSpecError", "Subscription", "compile_pattern", "parse_assign", "parse_queue_values",
           "resolve", "unmatched"]
