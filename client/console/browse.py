"""The console's message pages as data: lookups (by msg id, key or position), a message's journey, a topic's
newest messages or those from a time, and a group's dead letters with what was already requeued.

Every message says which copy it is (`kind`): the original on its topic, a retry copy on %RETRY%<group>, a
dead-letter copy on %DLQ%<group>, or a requeued copy (the same msg id on the original topic again, sent back
from the DLQ), so a msg-id lookup that finds all of them shows each under its own title.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from tidemark.client.admin import Admin
from tidemark.client.console.views import flag, mq_doc, now_ms
from tidemark.client.errors import InvalidArgumentError, NotFoundError
from tidemark.client.journey import trace_message
from tidemark.client.message import MessageExt, MessageQueue
from tidemark.common.protocol import dlq_topic, is_dlq_topic, is_retry_topic

# A body longer than this is cut in a message's view, and this in lists (the page says how many bytes were
# left out).
PREVIEW_BYTES = 4096
LIST_PREVIEW_BYTES = 256
MAX_BROWSE = 200
DEFAULT_BROWSE = 20
KEY_LOOKUP_MS = 7 * 86_400_000


def copy_kinds(msgs: Sequence[MessageExt]) -> list[str]:
    """Which copy each message is, for messages listed oldest first: a second message with the same msg id
    on the same ordinary topic is a requeued copy (a DLQ requeue sends one with the original's id)."""
    seen: set[tuple[str, str]] = set()
    kinds = []
    for m in msgs:
        if is_dlq_topic(m.topic):
            kinds.append("dead-letter copy")
        elif is_retry_topic(m.topic):
            kinds.append("retry copy")
        elif (m.topic, m.msg_id) in seen:
            kinds.append("requeued copy")
        else:
            seen.add((m.topic, m.msg_id))
            kinds.append("original")
    return kinds


def message(m: MessageExt, kind: str = "original", preview_bytes: int = PREVIEW_BYTES) -> dict[str, Any]:
    """A message with its properties and a body preview: text when the cut body is UTF-8, else base64."""
    cut = m.body[:preview_bytes]
    try:
        body, encoding = cut.decode("utf-8"), "text"
    except UnicodeDecodeError as e:
        if e.start >= len(cut) - 3 and len(m.body) > preview_bytes:  # the cut split a character
            body, encoding = cut[:e.start].decode("utf-8"), "text"
        else:
            body, encoding = base64.b64encode(cut).decode("ascii"), "base64"
    return {**mq_doc(MessageQueue(m.topic, m.broker_name, m.queue_id)), "offset": m.queue_offset, "kind": kind,
            "origin_topic": m.origin_topic, "msg_id": m.msg_id, "tags": m.tags, "keys": m.keys,
            "born_ms": m.born_timestamp, "stored_ms": m.store_timestamp, "reconsume_times": m.reconsume_times,
            "size": len(m.body), "body": body, "body_encoding": encoding,
            "body_cut": max(0, len(m.body) - preview_bytes), "properties": dict(m.properties)}


def _listed(msgs: Sequence[MessageExt], preview_bytes: int = PREVIEW_BYTES) -> list[dict[str, Any]]:
    """Messages (oldest first) with their kinds."""
    return [message(m, k, preview_bytes) for m, k in zip(msgs, copy_kinds(msgs), strict=True)]


def lookup(admin: Admin, query: dict[str, str]) -> dict[str, Any]:
    """Look messages up by msg id (with its retry, DLQ and requeued copies; topic optional), by key (topic +
    key, the last 7 days), or by position (topic + queue + offset [+ broker])."""
    topic_name = query.get("topic", "")
    if query.get("msg_id"):
        return {"messages": _listed(admin.query_message_by_id(query["msg_id"], topic_name))}
    if not topic_name:
        raise InvalidArgumentError("a topic is required (or a msg id)")
    if query.get("key"):
        end = now_ms()
        return {"messages": _listed(admin.query_message_by_key(topic_name, query["key"], end - KEY_LOOKUP_MS, end, 64))}
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
    return {"messages": _listed([admin.view_message(MessageQueue(topic_name, broker, queue), offset)])}


def trace(admin: Admin, query: dict[str, str]) -> dict[str, Any]:
    """A message's journey by msg id (topic optional): tidemark.client.journey, as `tidemark message trace`."""
    if not query.get("msg_id"):
        raise InvalidArgumentError("a msg id is required")
    return trace_message(admin, query["msg_id"], query.get("topic", "")).to_json()


def _count(query: dict[str, str], name: str) -> int:
    text = query.get(name, str(DEFAULT_BROWSE))
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_BROWSE:
        raise InvalidArgumentError(f"{name} must be a whole number from 1 to {MAX_BROWSE}, not {text!r}")
    return n


def _time(query: dict[str, str], name: str) -> int | None:
    text = query.get(name, "")
    if not text:
        return None
    try:
        t = int(text)
    except ValueError:
        t = -1
    if not 0 <= t < 2**63:
        raise InvalidArgumentError(f"{name} must be a time in epoch milliseconds (0 or more), not {text!r}")
    return t


def _read(admin: Admin, mq: MessageQueue, start: int, high: int, limit: int) -> list[MessageExt]:
    out: list[MessageExt] = []
    offset = start
    while offset < high and len(out) < limit:
        result = admin.pull(mq, offset, max_nums=min(64, limit - len(out)))
        out.extend(result.messages)
        if result.next_begin_offset <= offset:
            break
        offset = result.next_begin_offset
    return out[:limit]


def topic_messages(admin: Admin, topic: str, query: dict[str, str]) -> dict[str, Any]:
    """Browse a topic without a group (nothing is committed): its `latest` N messages over every queue,
    newest first (the default, 20), or the first `limit` stored at or after `from` (epoch ms) and, with
    `to`, not after it, oldest first. Each queue is read from its own offset for that time."""
    begin, end = _time(query, "from"), _time(query, "to")
    if begin is not None and "latest" in query:
        raise InvalidArgumentError("browse: give latest or from, not both")
    if end is not None and (begin is None or end < begin):
        raise InvalidArgumentError("browse: to goes with from, and must not be before it")
    queues = admin.fetch_message_queues(topic)
    bounds = admin.offsets(queues)
    if begin is None:
        n = _count(query, "latest")
        found = [m for mq, (low, high) in bounds.items() for m in _read(admin, mq, max(low, high - n), high, n)]
        newest = sorted(found, key=lambda m: (m.store_timestamp, m.queue_id, m.queue_offset))[-n:]
        return {"topic": topic, "mode": "latest", "messages": _listed(newest, LIST_PREVIEW_BYTES)[::-1]}
    n = _count(query, "limit")
    found = []
    for mq, (_low, high) in bounds.items():
        start = admin.search_offset(mq, begin)
        found += [m for m in _read(admin, mq, start, high, n) if end is None or m.store_timestamp <= end]
    first = sorted(found, key=lambda m: (m.store_timestamp, m.queue_id, m.queue_offset))[:n]
    return {"topic": topic, "mode": "from", "from_ms": begin, "to_ms": end,
            "messages": _listed(first, LIST_PREVIEW_BYTES)}


def dead_letters(admin: Admin, name: str, limit: int = 200) -> dict[str, Any]:
    """The group's dead letters, each marked `requeued` when it lies below the group's requeue mark on its
    DLQ queue (tidemark.client.dead_letters: a requeue moves the mark over what it sent). A letter requeued
    alone by msg id past the mark shows as waiting: a later requeue of all sends it again."""
    try:
        found = admin.dead_letters(name, limit)
    except NotFoundError:
        found = []
    marks = {mq: admin.committed(name, mq) for mq in {m.message_queue for m in found}}
    rows = [{**message(m, "dead-letter copy", LIST_PREVIEW_BYTES), "requeued": m.queue_offset < marks[m.message_queue]}
            for m in found]
    done = sum(r["requeued"] for r in rows)
    return {"group": name, "topic": dlq_topic(name), "messages": rows, "requeued": done, "waiting": len(rows) - done}


def requeue(admin: Admin, name: str, doc: dict[str, Any]) -> dict[str, Any]:
    """Which dead letters a requeue sends back (execute false), or send them (the CLI's `dlq requeue`)."""
    msg_id, everything = doc.get("msg_id"), doc.get("all", False)
    if not isinstance(everything, bool) or everything == (isinstance(msg_id, str) and bool(msg_id)):
        raise InvalidArgumentError("requeue: give a msg_id, or all: true (not both)")
    execute = flag(doc, "execute", "requeue")
    done = admin.requeue_dead_letters(name, None if everything else msg_id, dry_run=not execute)
    return {"group": name, "executed": execute,
            "requeued": [{"msg_id": r.msg_id, "topic": r.topic, **mq_doc(r.queue), "offset": r.queue_offset}
                         for r in done]}
