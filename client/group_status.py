"""A consumer group's condition as `tidemark group ...` and the console show it: its state
(types.group_state, from its members and committed queues) and its lag in seconds, the age of the oldest
message it has not consumed on each queue (what /metrics exposes as tidemark_consumer_lag_seconds);
for a pop group (RocketMQ 5 clients) what each queue has in flight and whether its consumers are slow or
stuck (`pop_condition`). One implementation for both, so they never disagree."""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable

from tidemark.client.admin import Admin
from tidemark.client.errors import NotFoundError
from tidemark.client.message import MessageQueue
from tidemark.client.types import GroupState, PopQueueInflight, QueueStats, group_state

# Queues whose oldest unconsumed message is looked up for a group's lag in seconds (one call each): the
# most lagging ones.
MAX_AGE_LOOKUPS = 64
# A pop message on this delivery attempt or later has passed its invisible time unacknowledged at least
# twice: its consumers are stuck on it, not merely slow.
STUCK_ATTEMPT = 3
# The columns pop_columns gives a pop group's queue rows.
POP_COLUMNS = ("inflight", "redelivered", "max_attempt", "overdue", "oldest_inflight_s", "next_visible_s", "waiting",
               "pop")


def now_ms() -> int:
    return int(time.time() * 1000)


def oldest_unconsumed_ms(admin: Admin, stats: Iterable[QueueStats]) -> dict[MessageQueue, int]:
    """Store time of each lagging queue's first unconsumed message (the lag in seconds is now minus it)."""
    out: dict[MessageQueue, int] = {}
    lagging = sorted((s for s in stats if s.lag > 0), key=lambda s: -s.lag)[:MAX_AGE_LOOKUPS]
    for s in lagging:
        at = max(s.consumer_offset, s.min_offset)
        try:
            out[s.queue] = admin.view_message(s.queue, at).store_timestamp
        except NotFoundError:  # expired or not yet visible: no age to tell
            continue
    return out


def lag_seconds(admin: Admin, stats: list[QueueStats], now: int | None = None) -> dict[MessageQueue, float]:
    """Per queue, seconds (one decimal) since the oldest message the group has not consumed was stored; 0.0
    where it has consumed everything. A lagging queue whose age could not be told (its message expired,
    or it is past the MAX_AGE_LOOKUPS most lagging ones) is left out."""
    now = now_ms() if now is None else now
    oldest = oldest_unconsumed_ms(admin, stats)
    out = {s.queue: 0.0 for s in stats if s.lag <= 0}
    out.update({q: round((now - at) / 1000, 1) for q, at in oldest.items()})
    return out


def state_of(admin: Admin, group: str) -> GroupState:
    """The group's state now (Dead for a group no broker knows)."""
    try:
        members = admin.describe_group(group).members
    except NotFoundError:
        members = ()
    try:
        committed = [s.queue for s in admin.consume_stats(group)]
    except NotFoundError:
        committed = []
    return group_state(members, committed)


class PopCondition(enum.Enum):
    """How a pop group's consumers fare on a queue, worst last. Stuck: messages keep passing their invisible
    time unacknowledged (delivered STUCK_ATTEMPT times or more, or past the invisible time again after a
    redelivery). Retrying: some came back once (a failure or a missed ack). Slow: first deliveries within
    their invisible time, and more messages stored behind them not yet received. Consuming: in flight,
    nothing waiting.
    Idle: nothing in flight."""

    IDLE = "idle"
    CONSUMING = "consuming"
    SLOW = "slow"
    RETRYING = "retrying"
    STUCK = "stuck"

    @property
    def rank(self) -> int:
        return list(PopCondition).index(self)


def pop_retry_topic(group: str, topic: str) -> str:
    """Where a pop group's expired deliveries of `topic` wait for their next attempt (RocketMQ 5's name, as
    the broker gives it)."""
    return f"%RETRY%{group}_{topic}"


def pop_condition(p: PopQueueInflight) -> PopCondition:
    """The condition of one queue, from what it has in flight and what waits behind it."""
    if p.max_attempt >= STUCK_ATTEMPT or (p.redelivered and p.overdue):
        return PopCondition.STUCK
    if p.redelivered or p.overdue or p.pending_redelivery:
        return PopCondition.RETRYING
    if not p.inflight:
        return PopCondition.IDLE
    return PopCondition.SLOW if p.waiting else PopCondition.CONSUMING


def pop_columns(p: PopQueueInflight | None, now: int | None = None) -> dict:
    """The in-flight columns of a queue's row in `group progress` / `describe` (None where a queue has no
    pop state): count, redelivered, highest attempt, past their invisible time, seconds since the oldest
    was received, seconds until the next becomes visible again (negative: overdue), messages not yet
    received, condition."""
    if p is None:
        return dict.fromkeys(POP_COLUMNS)
    now = now_ms() if now is None else now
    return {"inflight": p.inflight, "redelivered": p.redelivered, "max_attempt": p.max_attempt,
            "overdue": p.overdue,
            "oldest_inflight_s": round((now - p.oldest_received_ms) / 1000, 1) if p.oldest_received_ms else None,
            "next_visible_s": (round((p.earliest_invisible_until_ms - now) / 1000, 1)
                               if p.earliest_invisible_until_ms else None),
            "waiting": p.waiting, "pop": pop_condition(p).value}


def worst_pop_condition(conditions: Iterable[str | None]) -> PopCondition | None:
    """The group's condition: its worst queue's (None for a group without pop state)."""
    found = [PopCondition(c) for c in conditions if c is not None]
    return max(found, key=lambda c: c.rank) if found else None
