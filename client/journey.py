"""A message's journey, from what the brokers record: sent, stored where, delivered to which group's client
and when, consumed, retried, dead-lettered. `tidemark message trace` and the console's message page show it.

Most of it the brokers keep anyway. The stored message says who sent it and when (born host and time), and
where and when it was stored; a failed delivery left a copy with its attempt number in %RETRY%<group> (a pop
group's, RocketMQ 5 clients: %RETRY%<group>_<topic>) or in %DLQ%<group>, found by the same msg id; a group's
committed offset on a queue says whether the group is past a message there (consumed, or handed back as the
next copy shows); the queue locks and the pop ledger say which client holds the queue and what it has in
flight. Deliveries leave nothing behind, so each broker writes down its recent reads per queue
(broker/observe/journey.py): group, client, time. A delivery older than those has no delivered step, and the
consumed or failed step then names the queue's current holder.

`journey()` is the pure part (facts in, steps out); `trace_message()` gathers the facts through an Admin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tidemark.client.errors import (
    InvalidArgumentError,
    NotFoundError,
    TidemarkError,
)
from tidemark.client.group_status import pop_retry_topic
from tidemark.client.message import MessageExt
from tidemark.client.tracing import TRACEPARENT, parse_traceparent
from tidemark.client.types import Delivery
from tidemark.common.protocol import (
    PropertyKey,
    dlq_topic,
    is_dlq_topic,
    is_retry_topic,
    retry_topic,
)

__all__ = ["GroupFacts", "JourneyStep", "MessageJourney", "journey", "trace_message"]


@dataclass(frozen=True, slots=True)
class JourneyStep:
    """One step: `step` is sent, stored, delivered, consumed, failed, pending, in-flight, retried,
    dead-lettered or requeued;
    `at_ms` 0 where the brokers do not record the time."""

    step: str
    at_ms: int = 0
    topic: str = ""
    queue: str = ""  # broker:queue@offset
    group: str = ""
    client: str = ""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class GroupFacts:
    """What the brokers know of one consumer group and the message's queues: committed offsets per
    (topic, broker, queue id), -1 where none, the client holding each queue, what a pop group has in flight."""

    group: str
    committed: dict[tuple[str, str, int], int] = field(default_factory=dict)
    owners: dict[tuple[str, str, int], str] = field(default_factory=dict)
    pop_inflight: dict[tuple[str, str, int], int] = field(default_factory=dict)
    copies: tuple[MessageExt, ...] = ()  # its retry and dead-letter copies, oldest first


@dataclass(frozen=True, slots=True)
class MessageJourney:
    msg_id: str
    topic: str
    traceparent: str
    trace_id: str
    steps: tuple[JourneyStep, ...]

    def to_json(self) -> dict[str, Any]:
        return {"msg_id": self.msg_id, "topic": self.topic, "traceparent": self.traceparent,
                "trace_id": self.trace_id, "steps": [asdict(s) for s in self.steps]}


def _where(m: MessageExt) -> str:
    return f"{m.broker_name}:{m.queue_id}@{m.queue_offset}"


def _key(m: MessageExt) -> tuple[str, str, int]:
    return (m.topic, m.broker_name, m.queue_id)


def journey(original: MessageExt, groups: list[GroupFacts], requeued: Sequence[MessageExt] = (),
            deliveries: Mapping[tuple[str, str, int, int], Sequence[Delivery]] | None = None) -> MessageJourney:
    """The steps of `original` and its copies, group by group; then the copies a dead-letter requeue sent
    back to the topic (`requeued`: the same msg id stored there again). `deliveries`: the brokers' records
    of the reads that handed each message (by topic, broker, queue, offset) to a group's client."""
    deliveries = deliveries or {}
    props = original.properties
    producer = props.get(PropertyKey.PRODUCER_GROUP, "")
    steps = [JourneyStep("sent", original.born_timestamp, original.topic, "", client=original.born_host,
                         detail=f"producer group {producer}" if producer else ""),
             JourneyStep("stored", original.store_timestamp, original.topic, _where(original),
                         detail=" ".join(x for x in (f"tags={original.tags}" if original.tags else "",
                                                     f"keys={original.keys}" if original.keys else "") if x))]
    for g in groups:
        # The original, then each retry copy: a delivery whose outcome is the next copy, or the offset.
        attempts = [original, *(c for c in g.copies if is_retry_topic(c.topic))]
        dead = [c for c in g.copies if is_dlq_topic(c.topic)]
        for i, m in enumerate(attempts):
            if i:
                steps.append(JourneyStep("retried", m.store_timestamp, m.topic, _where(m), g.group,
                                         detail=f"attempt {m.reconsume_times + 1}"))
            later = i + 1 < len(attempts) or bool(dead)
            committed = g.committed.get(_key(m), -1)
            owner = g.owners.get(_key(m), "")
            for d in deliveries.get((*_key(m), m.queue_offset), ()):
                if d.group == g.group:
                    steps.append(JourneyStep("delivered", d.delivered_ms, m.topic, _where(m), g.group, d.client_id,
                                             f"read of offsets {d.first_offset}..{d.next_offset - 1}"))
                    owner = d.client_id or owner
            if later:
                steps.append(JourneyStep("failed", 0, m.topic, _where(m), g.group, owner,
                                         "handed back: the next step is its copy"))
            elif committed > m.queue_offset:
                steps.append(JourneyStep("consumed", 0, m.topic, _where(m), g.group, owner,
                                         f"the group's committed offset is {committed}"))
            elif g.pop_inflight.get(_key(m)):
                steps.append(JourneyStep("in-flight", 0, m.topic, _where(m), g.group, owner,
                                         f"{g.pop_inflight[_key(m)]} received on the queue, not yet acked"))
            else:
                shown = "none" if committed < 0 else str(committed)
                steps.append(JourneyStep("pending", 0, m.topic, _where(m), g.group, owner,
                                         f"not consumed yet: the group's committed offset is {shown}"))
        for m in dead:
            steps.append(JourneyStep("dead-lettered", m.store_timestamp, m.topic, _where(m), g.group,
                                     detail=f"after {m.reconsume_times} failed deliveries"))
    for m in requeued:
        steps.append(JourneyStep("requeued", m.store_timestamp, m.topic, _where(m),
                                 detail="sent back from a dead-letter queue: trace it from here by its queue"))
    traceparent = props.get(TRACEPARENT, "")
    parsed = parse_traceparent(traceparent) if traceparent else None
    return MessageJourney(original.msg_id, original.topic, traceparent, parsed[0] if parsed else "", tuple(steps))


def trace_message(admin: Any, msg_id: str, topic: str = "") -> MessageJourney:
    """The journey of the message with this msg id (in `topic`, or in any topic when empty), gathered through
    `admin` (a tidemark.client.Admin). NotFoundError when no broker has it; InvalidArgumentError for a
    malformed id or a retry or dead-letter topic (trace the message by the topic it was sent to)."""
    if topic and (is_retry_topic(topic) or is_dlq_topic(topic)):
        raise InvalidArgumentError(f"{topic} holds copies: give the topic the message was sent to")
    found = admin.query_message_by_id(msg_id, topic)
    originals = [m for m in found if not (is_retry_topic(m.topic) or is_dlq_topic(m.topic))]
    if not originals:
        sent_to = found[0].properties.get(PropertyKey.RETRY_TOPIC, "") if found else ""
        raise NotFoundError(f"msg id {msg_id} has only retry or dead-letter copies"
                            + (f": trace it with --topic {sent_to}" if sent_to else ""))
    original = originals[0]
    groups = [_group_facts(admin, g.group, original, found if not topic else None)
              for g in admin.list_groups(original.topic)]
    delivered = {}
    for m in {original, *(c for g in groups for c in g.copies if is_retry_topic(c.topic))}:
        try:
            delivered[(*_key(m), m.queue_offset)] = admin.deliveries(m.message_queue, m.queue_offset)
        except TidemarkError:  # a broker older than delivery records, or one that went away: no delivered step
            pass
    return journey(original, groups, originals[1:], delivered)


def _group_facts(admin: Any, group: str, original: MessageExt, found: list[MessageExt] | None) -> GroupFacts:
    # Where the group's copies are: its retry topic (a pop group's for this topic) and its dead letters.
    mine = (retry_topic(group), pop_retry_topic(group, original.topic), dlq_topic(group))
    if found is None:  # the original was looked for in its own topic: look for the group's copies
        found = []
        for copies_topic in mine:
            try:
                found.extend(admin.query_message_by_id(original.msg_id, copies_topic))
            except NotFoundError:
                pass
    copies = tuple(sorted((m for m in found if m.topic in mine), key=lambda m: (m.store_timestamp, m.queue_offset)))
    committed: dict[tuple[str, str, int], int] = {}
    for topic in {original.topic, *(c.topic for c in copies if is_retry_topic(c.topic))}:
        try:
            for row in admin.consume_stats(group, topic):
                committed[(topic, row.queue.broker_name, row.queue.queue_id)] = row.consumer_offset
        except NotFoundError:
            pass
    owners: dict[tuple[str, str, int], str] = {}
    pop: dict[tuple[str, str, int], int] = {}
    try:
        d = admin.describe_group(group)
    except NotFoundError:
        d = None
    if d is not None:
        for member in d.members:
            for q in member.owned_queues:
                owners[(q.topic, q.broker_name, q.queue_id)] = member.client_id
        for lock in d.locks:
            q = lock.queue
            owners[(q.topic, q.broker_name, q.queue_id)] = lock.client_id
        for p in d.pop_queues:
            pop[(p.queue.topic, p.queue.broker_name, p.queue.queue_id)] = p.inflight
    return GroupFacts(group, committed, owners, pop, copies)
