"""A consumer group's condition as `tidemark group ...` and the console show it: its state
(types.group_state, from its members and committed queues) and its lag in seconds, the age of the oldest
message it has not consumed on each queue (what /metrics exposes as tidemark_consumer_lag_seconds).
One implementation for both, so they never disagree."""

from __future__ import annotations

import time
from collections.abc import Iterable

from tidemark.client.admin import Admin
from tidemark.client.errors import NotFoundError
from tidemark.client.message import MessageQueue
from tidemark.client.types import GroupState, QueueStats, group_state

# Queues whose oldest unconsumed message is looked up for a group's lag in seconds (one call each): the
# most lagging ones.
MAX_AGE_LOOKUPS = 64


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
