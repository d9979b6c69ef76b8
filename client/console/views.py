"""The console's pages as data: what each page shows, built from Admin calls into plain JSON-able dicts.
This module has the cluster, topic and group pages and the offset reset; browse.py the messages and dead
letters, manage.py topic creation and deletion, users and ACL rules.

Nothing here knows HTTP; the handler maps a URL to one of these functions and writes its result as JSON.
Errors are the client library's (NotFoundError, PermissionDeniedError, ...), mapped to statuses by the
server. Group state, lag and DLQ rules are the client library's own (tidemark.client.types.group_state, the
brokers' consume stats), so the console and `tidemark group describe` can never disagree.
"""

from __future__ import annotations

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
from tidemark.client.message import MessageQueue
from tidemark.client.remoting import health
from tidemark.client.types import OffsetChange, ResetTarget, group_state
from tidemark.common.namespaces import in_namespace


def now_ms() -> int:
    return int(time.time() * 1000)


def mq_doc(q: MessageQueue) -> dict[str, Any]:
    return {"topic": q.topic, "broker": q.broker_name, "queue": q.queue_id}


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
                       in_sync=list(s.in_sync_replicas),
                       lag_bytes=s.replica_lag_bytes, clients=s.consumer_clients, topics=s.topics,
                       groups=s.groups)
        row["role"] = "master" if row["id"] == 0 else "replica"
        rows.append(row)
    return {"brokers": sorted(rows, key=lambda r: (r["name"], r["id"], r["address"])), "now_ms": now_ms()}


def topics(admin: Admin, history: History, *, include_system: bool = False) -> dict[str, Any]:
    rows = []
    for name, per_broker in admin.list_topics(include_system=include_system).items():
        if not in_namespace(admin.settings.namespace, name):
            continue
        rows.append({"topic": name, "brokers": [b for b, _ in per_broker],
                     "queues": sum(t.read_queue_nums for _, t in per_broker),
                     "perm": per_broker[0][1].perm, "system": per_broker[0][1].system,
                     "rate": history.rate("messages", name)})
    return {"topics": rows}


def topic(admin: Admin, history: History, name: str) -> dict[str, Any]:
    stats = admin.topic_stats(name)
    queues = [{**mq_doc(s.queue), "min_offset": s.min_offset, "max_offset": s.max_offset,
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
        if not in_namespace(admin.settings.namespace, g.group):
            continue
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
    queues = [{**mq_doc(s.queue), "owner": owner.get(s.queue, ""), "min_offset": s.min_offset,
               "max_offset": s.max_offset, "committed": s.consumer_offset, "lag": s.lag,
               "lag_s": lag_s.get(s.queue, 0.0),
               "last_consumed_ms": s.last_timestamp} for s in stats]
    members = [{"client_id": m.client_id, "host": m.host, "model": m.message_model, "type": m.consume_type,
                "orderly": m.orderly, "strategy": m.allocate_strategy,
                "subscriptions": [f"{t}:{e}" for t, e in m.subscriptions],
                "owned": [mq_doc(q) for q in m.owned_queues], "heartbeat_ms": m.last_heartbeat_timestamp}
               for m in d.members]
    pop = [{**mq_doc(p.queue), **group_status.pop_columns(p, now)} for p in d.pop_queues]
    worst = group_status.worst_pop_condition(row["pop"] for row in pop)
    return {"group": name, "state": group_state(d.members, [s.queue for s in stats]).value,
            "members": members, "queues": queues, "lag": total,
            "pop": pop, "pop_state": worst.value if worst is not None else None,
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
        execute = flag(doc, "execute", "reset")
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
            "changes": [{**mq_doc(c.queue), "current": c.old_offset, "new": c.new_offset} for c in changes]}


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


def flag(doc: dict[str, Any], name: str, action: str) -> bool:
    """A true/false field of an action's request (absent: false)."""
    value = doc.get(name, False)
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{action}: {name} must be true or false")
    return value


def text(doc: dict[str, Any], name: str, action: str, *, required: bool = True) -> str:
    """A string field of an action's request, blanks around it dropped ('' when absent and not required)."""
    value = doc.get(name, "")
    if not isinstance(value, str) or (required and not value.strip()):
        raise InvalidArgumentError(f"{action}: {name} must be a non-empty string" if required
                                   else f"{action}: {name} must be a string")
    return value.strip()
