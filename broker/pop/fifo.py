"""FIFO per message group: which messages of a queue a FIFO (orderly) pop may hand out.

RocketMQ 5 keeps order per *message group*, not per queue: many groups hash to
one queue, and a message that is not acknowledged holds back only the later
messages of its own group. The rule, for one queue of one consumer group:

    a message may be handed out when no message of its group is in flight, and
    no earlier message of its group waits to be handed out (again).

So a pop hands out, in offset order, first the pending messages (expired
deliveries to redeliver in place, and messages held back earlier) of the
groups with nothing in flight, then new messages from the cursor. A new
message whose group is busy is *held*: it becomes pending (below the cursor,
ahead of its group's later messages) and the cursor moves past it, so the
groups behind it keep flowing and no message is read twice while it waits
(a queue of one busy group, or of messages without a group, "", holds its
backlog too rather than reading it again at every receive). Pending entries
are kept per group, so a pop looks only at the groups that may go.

The queue's watermark, min(in flight ∪ pending ∪ cursor), is what the group
commits (ProcessQueue's rule): it never passes a message that is in flight or
held, so a restart that falls back to the committed offset redelivers, never
skips, and the pop journal (journal.py) restores the held ones in place.

An entry whose group was not recorded (group None: handed out by a concurrent
pop before the group became orderly, or read from a state written before
groups were kept) may belong to any group, so it blocks every group: the
queue behaves per queue until it is finished. Held and redelivered entries,
in flight or pending, count against the queue's in-flight cap: once it is
reached a pop takes nothing new from the cursor (every group of the queue
waits) until entries finish.

Pure functions over the ledger's per-queue state; the ledger validates and
journals what they decide.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from tidemark.broker.pop.records import InFlight, Pending

__all__ = ["FifoPlan", "QueueState", "ready", "plan"]

Fresh = tuple[int, int, str]  # a new offset read at the cursor: (offset, attempt, message group)


class QueueState(Protocol):
    cursor: int
    inflight: Mapping[int, InFlight]
    pending: Mapping[int, Pending]
    busy: Mapping[str | None, int]  # group -> entries in flight
    queued: Mapping[str | None, list[int]]  # group -> its pending offsets, sorted


@dataclass(frozen=True, slots=True)
class FifoPlan:
    handed: tuple[tuple[int, int, str | None], ...]  # (offset, attempt, group), increasing: pending ones first
    held: tuple[Fresh, ...]  # new offsets that become pending, held back behind their group
    next_cursor: int
    full: bool  # the in-flight cap stopped the pop (reading further cannot help)


def ready(q: QueueState, limit: int) -> list[Pending]:
    """The pending entries a pop may hand out now, in offset order, at most `limit`: those of the groups
    with nothing in flight; an entry of no recorded group conflicts with every group, so it goes only
    when nothing is in flight, and nothing after it goes before it. O(groups waiting + limit log groups)."""
    if limit <= 0 or q.busy.get(None):
        return []
    merged: Iterator[int]
    if not q.inflight:  # no group is busy: every pending entry may go
        merged = heapq.merge(*q.queued.values())
    else:
        merged = heapq.merge(*[offsets for group, offsets in q.queued.items()
                               if group is not None and not q.busy.get(group)])
        unrecorded = q.queued.get(None)
        if unrecorded:
            merged = itertools.takewhile(unrecorded[0].__gt__, merged)
    return [q.pending[o] for o in itertools.islice(merged, limit)]


def plan(q: QueueState, redeliver: Sequence[int], fresh: Sequence[Fresh], scan_end: int, *, limit: int,
         room: int) -> FifoPlan:
    """What a FIFO pop hands out and holds: the pending offsets `redeliver` (ready ones, a prefix of each
    group's), then the new offsets `fresh` read from the cursor up to scan_end (the offsets of that range
    not in `fresh` matched no filter). At most `limit` handed out, at most `room` new offsets taken
    (handed or held). ValueError when the arguments break the rule or do not fit the state."""
    if limit < 1:
        raise ValueError(f"limit {limit} is below 1")
    if len(redeliver) > limit:
        raise ValueError(f"{len(redeliver)} redeliveries exceed the limit {limit}")
    if scan_end < q.cursor:
        raise ValueError(f"scan end {scan_end} is below the cursor {q.cursor}")
    _check_redeliver(q, redeliver)
    handed: list[tuple[int, int, str | None]] = [(o, q.pending[o].attempt, q.pending[o].group) for o in redeliver]
    taken: dict[str | None, int] = {}
    for _, _, group in handed:
        taken[group] = taken.get(group, 0) + 1

    def waits(group: str | None) -> bool:  # the group has pending entries this pop does not hand out
        return len(q.queued.get(group, ())) > taken.get(group, 0)

    anything = bool(q.busy.get(None)) or waits(None)  # an unrecorded group waits: it blocks every group
    held: list[Fresh] = []
    blocked: set[str] = set()
    next_cursor, full, prev = scan_end, False, q.cursor - 1
    for offset, attempt, group in fresh:
        if not prev < offset < scan_end or attempt < 1 or not isinstance(group, str):
            raise ValueError(f"new offset {offset} (attempt {attempt}, group {group!r}) is not in "
                             f"({prev}, {scan_end}) or not a first delivery of a named group")
        prev = offset
        if len(handed) == limit or room == 0:
            next_cursor, full = offset, room == 0
            break
        room -= 1
        if anything or group in blocked or q.busy.get(group) or waits(group):
            held.append((offset, attempt, group))  # the cursor moves past it: its group's next ones wait too
            blocked.add(group)
        else:
            handed.append((offset, attempt, group))
    return FifoPlan(tuple(handed), tuple(held), next_cursor, full)


def _check_redeliver(q: QueueState, redeliver: Sequence[int]) -> None:
    """The redeliveries must be the first ready entries, in order: that keeps each group's prefix and
    skips no entry of an unrecorded group (the service drops the ones gone from the store by reviving
    them first, which keeps the rest first)."""
    if redeliver and [p.offset for p in ready(q, len(redeliver))] != list(redeliver):
        raise ValueError(f"redelivered offsets {list(redeliver)} are not the first ones ready: their group is "
                         f"busy, or they skip an earlier offset")
