"""The console's pages as data: what each page shows, built from Admin calls into plain JSON-able dicts.

Nothing here knows HTTP; the server maps a URL to one of these functions and writes its result as JSON.
Errors are the client library's (NotFoundError, PermissionDeniedError, ...), mapped to statuses by the
server. Group state, lag and DLQ rules are the client library's own (tidemark.client.types.group_state, the
brokers' consume stats), so the console and `tidemark group describe` can never disagree.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from typing import Any

from tidemark.client import group_status, offset_plan
from tidemark.client.admin import Admin
from tidemark.client.console.history import History
from tidemark.client.errors import (
    InvalidArgumentError,
    NotFoundError,
    TidemarkError,
    UnavailableError,
)
from tidemark.client.message import MessageExt, MessageQueue
from tidemark.client.remoting import health
from tidemark.client.types import OffsetChange, ResetTarget, group_state
from tidemark.common.protocol import dlq_topic

# A body longer than this is cut in previews (the page says how many bytes were left out).
PREVIEW_BYTES = 4096


def now_ms() -> int:
    return int(time.time() * 1000)


def _mq(q: MessageQueue) -> dict[str, Any]:
    return {"topic": q.topic, "broker": q.broker_name, "queue": q.queue_id}


def message(m: MessageExt, preview_bytes: int = PREVIEW_BYTES) -> dict[str, Any]:
    """A message with its properties and a body preview: text when the cut body is UTF-8, else base64."""
    cut = m.body[:preview_bytes]
    try:
        body, encoding = cut.decode("utf-8"), "text"
    except UnicodeDecodeError as e:
        if e.start >= len(cut) - 3 and len(m.body) > preview_bytes:  # the cut split a character
            body, encoding = cut[:e.start].decode("utf-8"), "text"
        else:
            body, encoding = base64.b64encode(cut).decode("ascii"), "base64"
    return {**_mq(MessageQueue(m.topic, m.broker_name, m.queue_id)), "offset": m.queue_offset,
            "origin_topic": m.origin_topic, "msg_id": m.msg_id, "tags": m.tags, "keys": m.keys,
            "born_ms": m.born_timestamp, "stored_ms": m.store_timestamp, "reconsume_times": m.reconsume_times,
            "size": len(m.body), "body": body, "body_encoding": encoding,
            "body_cut": max(0, len(m.body) - preview_bytes), "properties": dict(m.properties)}


def overview(admin: Admin) -> dict[str, Any]:
    """Every broker the console can learn of (the name servers' list, the answering brokers, the command
    line's addresses) with its health check and, when it answers, its status (brokerStatus): one that does
    not answer is shown as such, never dropped."""
    try:
        described = {c.address: c for c in admin.cluster_list()}
    except UnavailableError:
        described = {}
    rows = []
    for address in dict.fromkeys([*described, *admin.settings.brokers]):
        c = described.get(address)
        row: dict[str, Any] = {
            "name": c.broker_name if c else "?", "address": address, "id": c.broker_id if c else 0,
            "version": c.version if c else "", "registered_ms": c.last_update_ms if c else 0,
            "health": health.check(address, admin.settings.request_timeout_s,
                                   credentials=admin.settings.credentials, tls=admin.settings.tls)}
        try:
            s = admin.broker_status_at(address)
        except TidemarkError as e:
            row["error"] = str(e)
        else:
            row.update(name=s.broker_name, id=s.broker_id, version=s.version, uptime_ms=s.uptime_ms,
                       store_bytes=s.store_size_bytes, flush_mode=s.flush_mode, readable=s.readable,
                       writable=s.writable, replication=s.replication_mode, replicas=s.replicas,
                       lag_bytes=s.replica_lag_bytes, clients=s.consumer_clients, topics=s.topics,
                       groups=s.groups)
        row["role"] = "master" if row["id"] == 0 else "replica"
        rows.append(row)
    return {"brokers": sorted(rows, key=lambda r: (r["name"], r["id"], r["address"])), "now_ms": now_ms()}


def topics(admin: Admin, history: History, *, include_system: bool = False) -> dict[str, Any]:
    rows = []
    for name, per_broker in admin.list_topics(include_system=include_system).items():
        rows.append({"topic": name, "brokers": [b for b, _ in per_broker],
                     "queues": sum(t.read_queue_nums for _, t in per_broker),
                     "perm": per_broker[0][1].perm, "system": per_broker[0][1].system,
                     "rate": history.rate("messages", name)})
    return {"topics": rows}


def topic(admin: Admin, history: History, name: str) -> dict[str, Any]:
    stats = admin.topic_stats(name)
    queues = [{**_mq(s.queue), "min_offset": s.min_offset, "max_offset": s.max_offset,
               "messages": s.max_offset - s.min_offset, "last_update_ms": s.last_update_timestamp}
              for s in stats]
    total = sum(s.max_offset for s in stats)
    history.record("messages", name, now_ms(), total)
    groups = [g.group for g in admin.list_groups(name)]
    return {"topic": name, "queues": queues, "stored": sum(q["messages"] for q in queues),
            "rate": history.rate("messages", name), "groups": groups}


def groups(admin: Admin, history: History) -> dict[str, Any]:
    rows = []
    for g in admin.list_groups():
        lag = history.series("lag", g.group)
        rows.append({"group": g.group, "topics": list(g.topics), "members": g.member_count,
                     "model": g.message_model.replace("MESSAGE_MODEL_UNSPECIFIED", "-"),
                     "lag": lag[-1].value if lag else None})
    return {"groups": rows}


def group(admin: Admin, history: History, name: str, *, since_ms: int = 0) -> dict[str, Any]:
    d = admin.describe_group(name)
    try:
        stats = admin.consume_stats(name)
    except NotFoundError:
        stats = []
    now = now_ms()
    total = sum(s.lag for s in stats)
    history.record("lag", name, now, total)
    owner = {q: m.client_id for m in d.members for q in m.owned_queues}
    lag_s = group_status.lag_seconds(admin, stats, now)
    queues = [{**_mq(s.queue), "owner": owner.get(s.queue, ""), "min_offset": s.min_offset,
               "max_offset": s.max_offset, "committed": s.consumer_offset, "lag": s.lag,
               "lag_s": lag_s.get(s.queue, 0.0),
               "last_consumed_ms": s.last_timestamp} for s in stats]
    members = [{"client_id": m.client_id, "host": m.host, "model": m.message_model, "type": m.consume_type,
                "orderly": m.orderly, "strategy": m.allocate_strategy,
                "subscriptions": [f"{t}:{e}" for t, e in m.subscriptions],
                "owned": [_mq(q) for q in m.owned_queues], "heartbeat_ms": m.last_heartbeat_timestamp}
               for m in d.members]
    return {"group": name, "state": group_state(d.members, [s.queue for s in stats]).value,
            "members": members, "queues": queues, "lag": total,
            "lag_s": max((q["lag_s"] for q in queues), default=0.0),
            "topics": sorted({s.queue.topic for s in stats}, key=lambda t: (t.startswith("%"), t)),  # retry last
            "history": [[p.t_ms, p.value] for p in history.series("lag", name, since_ms=since_ms)],
            "now_ms": now}


_TARGETS = {"earliest": ResetTarget.EARLIEST, "latest": ResetTarget.LATEST, "timestamp": ResetTarget.TIMESTAMP,
            "offset": ResetTarget.OFFSET, "shift": ResetTarget.SHIFT_BY}
_INT64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True, slots=True)
class ResetRequest:
    """An offset reset as the console's form sends it; `parse` refuses what the CLI would refuse."""

    topic: str
    target: ResetTarget
    value: int
    queue: int | None
    execute: bool
    broker: str = ""  # the queue's broker, for a topic on several (queue ids repeat on each)

    @classmethod
    def parse(cls, doc: dict[str, Any]) -> ResetRequest:
        topic = doc.get("topic")
        if not isinstance(topic, str) or not topic:
            raise InvalidArgumentError("reset: a topic is required")
        target = _TARGETS.get(doc.get("target", ""))
        if target is None:
            raise InvalidArgumentError(f"reset: target must be one of {', '.join(_TARGETS)}")
        value = doc.get("value", 0)
        if target in (ResetTarget.EARLIEST, ResetTarget.LATEST):
            value = 0
        elif isinstance(value, bool) or not isinstance(value, int) or not _INT64[0] <= value <= _INT64[1]:
            raise InvalidArgumentError(f"reset: value must be a 64-bit integer for target {doc['target']}")
        elif target is not ResetTarget.SHIFT_BY and value < 0:
            raise InvalidArgumentError("reset: an offset or a timestamp cannot be negative")
        queue = doc.get("queue")
        if queue is not None and (isinstance(queue, bool) or not isinstance(queue, int) or queue < 0):
            raise InvalidArgumentError("reset: queue must be a queue id (0 or more)")
        execute = doc.get("execute", False)
        if not isinstance(execute, bool):
            raise InvalidArgumentError("reset: execute must be true or false")
        broker = doc.get("broker", "")
        if not isinstance(broker, str):
            raise InvalidArgumentError("reset: broker must be a broker name")
        return cls(topic, target, value, queue, execute, broker)


def reset(admin: Admin, name: str, req: ResetRequest) -> dict[str, Any]:
    """Preview (execute false) or apply an offset reset; both answer the per-queue changes."""
    queue = offset_plan.queue_of(admin, req.topic, req.queue, req.broker)
    changes: list[OffsetChange] = admin.reset_offset(name, req.topic, req.target, req.value, queue=queue,
                                                     dry_run=not req.execute)
    return {"group": name, "executed": req.execute,
            "changes": [{**_mq(c.queue), "current": c.old_offset, "new": c.new_offset} for c in changes]}


def messages(admin: Admin, query: dict[str, str]) -> dict[str, Any]:
    """Look messages up by msg id (with its retry and DLQ copies; topic optional), by key (topic + key),
    or by position (topic + queue + offset [+ broker])."""
    topic_name = query.get("topic", "")
    if query.get("msg_id"):
        return {"messages": [message(m) for m in admin.query_message_by_id(query["msg_id"], topic_name)]}
    if not topic_name:
        raise InvalidArgumentError("a topic is required (or a msg id)")
    if query.get("key"):
        end = now_ms()
        found = admin.query_message_by_key(topic_name, query["key"], end - 7 * 86_400_000, end, 64)
        return {"messages": [message(m) for m in found]}
    try:
        queue, offset = int(query.get("queue", "")), int(query.get("offset", ""))
    except ValueError:
        raise InvalidArgumentError("give a key, or a queue id and an offset (integers)") from None
    if queue < 0 or not 0 <= offset < 2**63:
        raise InvalidArgumentError("queue and offset must be 0 or more")
    brokers = sorted({d.broker_name for d in admin.route(topic_name).queue_datas})
    if not brokers:
        raise NotFoundError(f"topic {topic_name!r} has no queues on any broker")
    broker = query.get("broker") or brokers[0]
    return {"messages": [message(admin.view_message(MessageQueue(topic_name, broker, queue), offset))]}


def dead_letters(admin: Admin, name: str, limit: int = 200) -> dict[str, Any]:
    try:
        found = admin.dead_letters(name, limit)
    except NotFoundError:
        found = []
    return {"group": name, "topic": dlq_topic(name), "messages": [message(m, 256) for m in found]}


def requeue(admin: Admin, name: str, doc: dict[str, Any]) -> dict[str, Any]:
    msg_id, everything = doc.get("msg_id"), doc.get("all", False)
    if not isinstance(everything, bool) or everything == (isinstance(msg_id, str) and bool(msg_id)):
        raise InvalidArgumentError("requeue: give a msg_id, or all: true (not both)")
    done = admin.requeue_dead_letters(name, None if everything else msg_id)
    return {"requeued": [{"msg_id": r.msg_id, "topic": r.topic, **_mq(r.queue), "offset": r.queue_offset}
                         for r in done]}


def sample(admin: Admin, history: History) -> None:
    """One round of the sampler: every group's total lag and every topic's message count, now."""
    t = now_ms()
    for g in admin.list_groups():
        try:
            history.record("lag", g.group, t, sum(s.lag for s in admin.consume_stats(g.group)))
        except NotFoundError:
            continue
    for name in admin.list_topics():
        try:
            history.record("messages", name, t, sum(s.max_offset for s in admin.topic_stats(name)))
        except NotFoundError:
            continue
    history.forget_idle(t)
