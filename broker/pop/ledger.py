"""PopLedger: what the broker has handed out to pop consumers, and what is finished.

Pop consumption (RocketMQ 5) has no queue owners: any consumer of a group
receives from any queue, so the broker tracks each delivery. Per (group,
topic, queue id): the **cursor** (the next offset never handed out), the
**in-flight** entries {offset: InFlight} (handed out, not finished; each with
the pop id of its current handle and a deadline), and the **pending** entries
{offset: Pending} (FIFO only: redeliveries in place, and messages held back
behind an unfinished message of their message group; handed out before the
cursor, fifo.py says when). Every offset below the cursor is exactly one of in-flight, pending or
done (acked, filtered out by the tag filter, or revived into the retry topic
or DLQ). The done set is not stored: it is the complement of in-flight ∪
pending, so a filter that skips a million offsets costs O(1), and memory is
bounded by the in-flight cap, not by the gap behind one slow message.

The **watermark**, min(in-flight ∪ pending ∪ {cursor}), is the smallest
unfinished offset: what the group's committed offset becomes (ProcessQueue's
rule, on the broker). Offsets join in-flight ∪ pending only at the cursor, so
it never moves back, except by an admin reset.

Event-sourced: an operation validates (raising before any change), describes
its change as small frozen events, hands them to the `sink` (the journal; if
it raises, nothing changes), then applies them with `apply`, the same method
that replays a journal: replay equals live by construction. `apply` skips an
event that does not fit the state (a pop id no longer current, a pop not
starting at the cursor), which a replay over an older .bak snapshot needs.

Pop ids come from a counter in the ledger; every id is in an event and the
snapshot keeps the largest, so ids grow across restarts. `pop_id_floor` (the
broker passes its wall-clock EpochSequence) covers a journal tail lost in a
power cut. Costs: pop O(k log n); ack, change, revive amortised O(log n)
(lazy heaps, as ProcessQueue); expired and renewals O(k log n) for the k
entries due. `max_inflight_per_queue` caps in-flight + pending per queue; a
pop hands out fewer messages when the queue is full. Records and events are
in records.py, the FIFO rule (which message group may go) in fifo.py.

Pure: no clock reads (`now_ms` is an argument), no I/O, no grpc.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Container, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from tidemark.broker.pop import fifo
from tidemark.broker.pop.handles import HandleFields, QueueKey, StaleReceiptHandleError
from tidemark.broker.pop.records import (
    HELD,
    Acked,
    Changed,
    Dropped,
    ExpiredEntry,
    InFlight,
    Pending,
    PopEvent,
    Popped,
    PopResult,
    PopStateError,
    Redelivered,
    Renewed,
    Reset,
    Revived,
    Sink,
)

__all__ = [
    "PopSettings", "PopLedger", "InFlight", "Pending", "PopResult", "ExpiredEntry", "PopStateError",
    "PopEvent", "Reset", "Dropped", "Popped", "Acked", "Changed", "Renewed", "Revived", "Redelivered",
]

_COMPACT_SLACK = 64  # rebuild a lazy heap once dead items outnumber live ones by this much


@dataclass(frozen=True, slots=True, kw_only=True)
class PopSettings:
    """Pop limits; the renewal values are the RocketMQ proxy's defaults."""

    max_inflight_per_queue: int = 10_000
    renew_slice_ms: int = 60_000  # an auto-renewed entry is extended by this much at a time
    renew_ahead_ms: int = 10_000  # ... once its deadline is this close
    max_renew_ms: int = 3 * 3600 * 1000  # and never beyond this long after its pop

    def __post_init__(self) -> None:
        for name in ("max_inflight_per_queue", "renew_slice_ms", "renew_ahead_ms", "max_renew_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class _Queue:
    __slots__ = ("cursor", "inflight", "pending", "undone", "busy", "queued")

    def __init__(self, cursor: int) -> None:
        self.cursor = cursor
        self.inflight: dict[int, InFlight] = {}
        self.pending: dict[int, Pending] = {}
        # Min-heap of in-flight ∪ pending offsets, lazily deleted: an item is live while its offset
        # is in one of the two dicts. An offset is pushed once, when it first leaves the cursor.
        self.undone: list[int] = []
        # FIFO's view by message group (fifo.py): in-flight entries per group, pending offsets per group
        # (sorted; a held group's offsets arrive in increasing order, so an insort is an append).
        self.busy: dict[str | None, int] = {}
        self.queued: dict[str | None, list[int]] = {}

    def live(self, offset: int) -> bool:
        return offset in self.inflight or offset in self.pending

    def watermark(self) -> int:
        heap = self.undone
        while heap and not self.live(heap[0]):
            heapq.heappop(heap)
        return heap[0] if heap else self.cursor

    def compact(self) -> None:
        live = len(self.inflight) + len(self.pending)
        if len(self.undone) > 2 * live + _COMPACT_SLACK:
            self.undone = sorted([*self.inflight, *self.pending])

    # The only places the two dicts change, so the group indexes stay exact.
    def put_inflight(self, offset: int, entry: InFlight) -> None:
        old = self.inflight.get(offset)
        if old is not None:
            self._count(old.group, -1)
        self.inflight[offset] = entry
        self._count(entry.group, 1)

    def take_inflight(self, offset: int) -> InFlight | None:
        entry = self.inflight.pop(offset, None)
        if entry is not None:
            self._count(entry.group, -1)
        return entry

    def put_pending(self, p: Pending) -> None:
        self.pending[p.offset] = p
        bisect.insort(self.queued.setdefault(p.group, []), p.offset)

    def take_pending(self, offset: int) -> Pending | None:
        p = self.pending.pop(offset, None)
        if p is not None:
            offsets = self.queued[p.group]
            del offsets[bisect.bisect_left(offsets, offset)]
            if not offsets:
                del self.queued[p.group]
        return p

    def _count(self, group: str | None, delta: int) -> None:
        n = self.busy.get(group, 0) + delta
        if n:
            self.busy[group] = n
        else:
            del self.busy[group]


class PopLedger:
    """Pop consumption state of every (group, topic, queue id); see the module docstring.

    Not thread-safe: the broker calls it from its event-loop thread only.
    """

    def __init__(self, settings: PopSettings | None = None, *, pop_id_floor: int = 0,
                 sink: Sink | None = None) -> None:
        self.settings = settings or PopSettings()
        self.sink = sink
        self._queues: dict[QueueKey, _Queue] = {}
        self._last_pop_id = pop_id_floor
        # (deadline, key, offset, pop_id) of in-flight entries, lazily deleted (see _deadline_live).
        self._deadlines: list[tuple[int, QueueKey, int, int]] = []
        self._inflight_total = 0
        self.version = 0  # events applied since construction: a snapshot is due when it moved

    # -- queries --------------------------------------------------------------------------

    def keys(self) -> Iterator[QueueKey]:
        return iter(list(self._queues))

    def __contains__(self, key: object) -> bool:
        return key in self._queues

    @property
    def last_pop_id(self) -> int:
        return self._last_pop_id

    def cursor(self, key: QueueKey) -> int:
        return self._queue(key).cursor

    def watermark(self, key: QueueKey) -> int:
        """The smallest offset not yet finished: the offset the group may commit."""
        return self._queue(key).watermark()

    def inflight_count(self, key: QueueKey) -> int:
        return len(self._queue(key).inflight)

    def inflight(self, key: QueueKey) -> Mapping[int, InFlight]:
        return MappingProxyType(self._queue(key).inflight)

    def pending(self, key: QueueKey) -> list[Pending]:
        """FIFO redeliveries waiting, in offset order: a FIFO pop takes these before the cursor."""
        return sorted(self._queue(key).pending.values(), key=lambda p: p.offset)

    def first_pending(self, key: QueueKey, limit: int) -> list[Pending]:
        """The first `limit` pending entries in offset order, whatever their group: what a pop that keeps no
        order (the group is no longer orderly) hands out before the cursor."""
        q = self._queue(key)
        if limit <= 0 or not q.pending:
            return []
        return [q.pending[o] for o in itertools.islice(heapq.merge(*q.queued.values()), limit)]

    def room(self, key: QueueKey) -> int:
        """How many new offsets a pop of this queue may hand out now."""
        q = self._queue(key)
        return max(0, self.settings.max_inflight_per_queue - len(q.inflight) - len(q.pending))

    def fifo_ready(self, key: QueueKey, limit: int) -> list[Pending]:
        """The pending entries a FIFO pop may hand out now (their group has nothing in flight), in offset
        order, at most `limit` (fifo.py)."""
        return fifo.ready(self._queue(key), limit)

    def next_deadline(self) -> int | None:
        """The earliest in-flight deadline (when the revive scan should wake), None when idle."""
        heap = self._deadlines
        while heap and not self._deadline_live(heap[0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def expired(self, now_ms: int, limit: int | None = None) -> list[ExpiredEntry]:
        """In-flight entries whose deadline is <= now_ms, earliest first. They stay in flight (an
        ack still works) until the caller reports `revived` or `redeliver_in_place`."""
        return [ExpiredEntry(k, o, self._queues[k].inflight[o]) for k, o in self._due(now_ms, limit)]

    # -- operations -------------------------------------------------------------------------

    def ensure_queue(self, key: QueueKey, start_offset: int) -> bool:
        """Start the queue's pop state at `start_offset` (the committed offset) unless it exists."""
        if key in self._queues:
            return False
        self.reset(key, start_offset)
        return True

    def pop(self, key: QueueKey, taken: Sequence[tuple[int, int]], next_cursor: int, *, now_ms: int,
            invisible_ms: int, client_id: str, auto_renew: bool = False) -> PopResult:
        """Hand out `taken` (offset, attempt) pairs, increasing: pending redeliveries (with their
        attempt) and offsets in [cursor, next_cursor). The offsets of that range not taken matched
        no filter and are done. When the in-flight cap is reached the pop stops at the first new
        offset that does not fit, and the result's next_cursor says where."""
        q = self._queue(key)
        if next_cursor < q.cursor:
            raise ValueError(f"next cursor {next_cursor} is below the cursor {q.cursor}")
        if invisible_ms < 0:
            raise ValueError(f"invisible time {invisible_ms} ms is negative")
        room, prev, chosen = self.room(key), -1, []
        for offset, attempt in taken:
            if offset <= prev:
                raise ValueError(f"taken offsets must increase: {offset} after {prev}")
            if attempt < 1:
                raise ValueError(f"attempt {attempt} of offset {offset} is below 1")
            prev = offset
            pending = q.pending.get(offset)
            if pending is not None:
                if attempt != pending.attempt:
                    raise ValueError(f"offset {offset} is pending with attempt {pending.attempt}, not {attempt}")
            elif q.cursor <= offset < next_cursor:
                if room == 0:
                    next_cursor = offset  # the rest waits at the cursor
                    break
                room -= 1
            else:
                raise ValueError(f"offset {offset} is neither pending nor in [{q.cursor}, {next_cursor})")
            chosen.append((offset, attempt))
        deadline = now_ms + invisible_ms
        if not chosen and next_cursor == q.cursor:
            return PopResult((), next_cursor, deadline, None)
        first = self._last_pop_id + 1
        entries = tuple((offset, first + i, attempt) for i, (offset, attempt) in enumerate(chosen))
        before = q.watermark()
        self._emit([Popped(key, q.cursor, next_cursor, deadline, client_id, auto_renew,
                           now_ms + self.settings.max_renew_ms if auto_renew else 0, entries, now_ms)])
        handles = tuple(HandleFields(*key, offset, pop_id, attempt) for offset, pop_id, attempt in entries)
        return PopResult(handles, next_cursor, deadline, self._moved(q, before))

    def plan_fifo(self, key: QueueKey, redeliver: Sequence[int], fresh: Sequence[tuple[int, int, str]],
                  scan_end: int, *, limit: int) -> fifo.FifoPlan:
        """What pop_fifo with these arguments would do, without doing it (the caller reads on while it
        would hand out fewer than `limit` and the queue has room)."""
        return fifo.plan(self._queue(key), redeliver, fresh, scan_end, limit=limit, room=self.room(key))

    def pop_fifo(self, key: QueueKey, redeliver: Sequence[int], fresh: Sequence[tuple[int, int, str]],
                 scan_end: int, *, limit: int, now_ms: int, invisible_ms: int, client_id: str,
                 auto_renew: bool = False) -> PopResult:
        """A FIFO pop (fifo.py): hand out the pending offsets `redeliver` (from fifo_ready, less those
        gone meanwhile), then of `fresh` (offset, attempt, message group), the new offsets read from the
        cursor up to scan_end, those whose group is free; hold the others. At most `limit` handed out."""
        q = self._queue(key)
        if invisible_ms < 0:
            raise ValueError(f"invisible time {invisible_ms} ms is negative")
        p = fifo.plan(q, redeliver, fresh, scan_end, limit=limit, room=self.room(key))
        deadline = now_ms + invisible_ms
        if not p.handed and not p.held and p.next_cursor == q.cursor:
            return PopResult((), p.next_cursor, deadline, None)
        first = self._last_pop_id + 1
        entries = tuple((offset, first + i, attempt) for i, (offset, attempt, _) in enumerate(p.handed))
        before = q.watermark()
        self._emit([Popped(key, q.cursor, p.next_cursor, deadline, client_id, auto_renew,
                           now_ms + self.settings.max_renew_ms if auto_renew else 0, entries, now_ms,
                           tuple(group for _, _, group in p.handed), p.held)])
        handles = tuple(HandleFields(*key, offset, pop_id, attempt) for offset, pop_id, attempt in entries)
        return PopResult(handles, p.next_cursor, deadline, self._moved(q, before))

    def ack(self, h: HandleFields) -> int | None:
        """Finish the delivery `h` names; the new watermark when it moved. Stale if it is over."""
        q, _ = self._current(h)
        before = q.watermark()
        self._emit([Acked(h.key, h.offset, h.pop_id)])
        return self._moved(q, before)

    def change_invisible(self, h: HandleFields, *, now_ms: int, invisible_ms: int) -> HandleFields:
        """Hide the message until now + invisible_ms under a new handle (the old one is stale now)."""
        if invisible_ms < 0:
            raise ValueError(f"invisible time {invisible_ms} ms is negative")
        self._current(h)
        new_pop_id = self._last_pop_id + 1
        self._emit([Changed(h.key, h.offset, h.pop_id, new_pop_id, now_ms + invisible_ms)])
        return replace(h, pop_id=new_pop_id)

    def revived(self, key: QueueKey, offset: int, pop_id: int) -> int | None:
        """The entry (in flight or pending) was copied to the retry topic or the DLQ: it is done.
        Stale when an ack or a ChangeInvisibleDuration came first. Returns the moved watermark."""
        q = self._queues.get(key)
        entry = None if q is None else (q.inflight.get(offset) or q.pending.get(offset))
        if entry is None or entry.pop_id != pop_id:
            raise StaleReceiptHandleError(key, offset, "the entry was acked, changed or reset meanwhile")
        before = q.watermark()
        self._emit([Revived(key, offset, pop_id)])
        return self._moved(q, before)

    def redeliver_in_place(self, key: QueueKey, offset: int, pop_id: int) -> Pending:
        """FIFO expiry: the entry waits to be handed out again, before the cursor, as attempt + 1."""
        q = self._queues.get(key)
        entry = None if q is None else q.inflight.get(offset)
        if entry is None or entry.pop_id != pop_id:
            raise StaleReceiptHandleError(key, offset, "the entry was acked, changed or reset meanwhile")
        self._emit([Redelivered(key, offset, pop_id)])
        return q.pending[offset]

    def renewals(self, now_ms: int, alive_clients: Container[str]) -> list[Renewed]:
        """Extend auto-renew entries of live clients whose deadline is within renew_ahead_ms (but
        not past), by renew_slice_ms, never beyond renew_until_ms. One sink call for all."""
        s = self.settings
        events = []
        for key, offset in self._due(now_ms + s.renew_ahead_ms, None):
            e = self._queues[key].inflight[offset]
            if e.auto_renew and e.deadline_ms > now_ms and e.client_id in alive_clients:
                deadline = min(now_ms + s.renew_slice_ms, e.renew_until_ms)
                if deadline > e.deadline_ms:
                    events.append(Renewed(key, offset, e.pop_id, deadline))
        if events:
            self._emit(events)
        return events

    def reset(self, key: QueueKey, offset: int) -> None:
        """Drop the queue's pop state and start again at `offset` (an admin offset reset)."""
        if offset < 0 or key.queue_id < 0:
            raise ValueError(f"offset {offset} or queue id {key.queue_id} is negative")
        self._emit([Reset(QueueKey(*key), offset)])

    def drop(self, key: QueueKey) -> bool:
        """Forget the queue (its group or topic was deleted)."""
        if key not in self._queues:
            return False
        self._emit([Dropped(key)])
        return True

    # -- events -------------------------------------------------------------------------------

    def apply(self, event: PopEvent) -> bool:
        """Apply one event (journal replay); False, and no change, when it does not fit the state
        (a replay over an older snapshot). Live operations go through _emit; both end in _mutate,
        the only place the state changes."""
        if not self._fits(event):
            return False
        self._mutate(event)
        self.version += 1
        return True

    def _emit(self, events: list[PopEvent]) -> None:
        for event in events:
            if not self._fits(event):
                raise RuntimeError(f"pop ledger bug: {event} does not fit the state it was made from")
        if self.sink is not None:
            self.sink(events)  # raises when the journal cannot take them: nothing changes then
        for event in events:
            self._mutate(event)
            self.version += 1

    def _fits(self, e: PopEvent) -> bool:
        if isinstance(e, Reset):
            return e.cursor >= 0
        q = self._queues.get(e.key)
        if q is None:
            return False
        if isinstance(e, Dropped):
            return True
        if isinstance(e, Popped):
            if q.cursor != e.cursor_from or e.next_cursor < e.cursor_from:
                return False
            prev = -1
            for offset, _, _ in e.entries:
                if offset <= prev or not (offset in q.pending or e.cursor_from <= offset < e.next_cursor):
                    return False
                prev = offset
            taken, prev = {offset for offset, _, _ in e.entries}, -1
            for offset, _, _ in e.held:
                if offset <= prev or offset in taken or not e.cursor_from <= offset < e.next_cursor:
                    return False
                prev = offset
            return len(e.groups) in (0, len(e.entries))
        if isinstance(e, Revived):
            entry = q.inflight.get(e.offset) or q.pending.get(e.offset)
        else:
            entry = q.inflight.get(e.offset)
        return entry is not None and entry.pop_id == e.pop_id

    def _mutate(self, e: PopEvent) -> None:
        if isinstance(e, Reset | Dropped):
            old = self._queues.pop(e.key, None)
            if old is not None:
                self._inflight_total -= len(old.inflight)  # its deadline items are dead now
            if isinstance(e, Reset):
                self._queues[e.key] = _Queue(e.cursor)
        else:
            self._mutate_queue(self._queues[e.key], e)
        self._compact_deadlines()

    def _mutate_queue(self, q: _Queue, e: PopEvent) -> None:
        if isinstance(e, Popped):
            for i, (offset, pop_id, attempt) in enumerate(e.entries):
                was = q.take_pending(offset)
                if was is None:
                    heapq.heappush(q.undone, offset)
                group = e.groups[i] if e.groups else (was.group if was is not None else None)
                entry = InFlight(pop_id, e.deadline_ms, attempt, e.client_id, e.auto_renew, e.renew_until_ms,
                                 e.received_ms, group)
                q.put_inflight(offset, entry)
                self._push_deadline(e.key, offset, entry)
                self._last_pop_id = max(self._last_pop_id, pop_id)
            for offset, attempt, group in e.held:
                heapq.heappush(q.undone, offset)
                q.put_pending(Pending(offset, attempt, HELD, group))
            self._inflight_total += len(e.entries)
            q.cursor = e.next_cursor
        elif isinstance(e, Changed):
            entry = replace(q.inflight[e.offset], pop_id=e.new_pop_id, deadline_ms=e.deadline_ms,
                            auto_renew=False, renew_until_ms=0)
            q.put_inflight(e.offset, entry)
            self._push_deadline(e.key, e.offset, entry)
            self._last_pop_id = max(self._last_pop_id, e.new_pop_id)
        elif isinstance(e, Renewed):
            entry = replace(q.inflight[e.offset], deadline_ms=e.deadline_ms)
            q.put_inflight(e.offset, entry)
            self._push_deadline(e.key, e.offset, entry)
        elif isinstance(e, Redelivered):
            entry = q.take_inflight(e.offset)
            self._inflight_total -= 1
            q.put_pending(Pending(e.offset, entry.attempt + 1, entry.pop_id, entry.group))
        else:  # Acked, Revived
            if q.take_inflight(e.offset) is not None:
                self._inflight_total -= 1
            else:
                q.take_pending(e.offset)
            q.compact()

    # -- snapshot ------------------------------------------------------------------------------

    def snapshot(self) -> dict:
        """The whole state as a JSON-able dict (a copy; the same state gives the same dict)."""
        queues = []
        for key in sorted(self._queues):
            q = self._queues[key]
            queues.append({
                "group": key.group, "topic": key.topic, "queueId": key.queue_id, "cursor": q.cursor,
                # A recorded message group ends the row; rows without one keep the older shape.
                "inflight": [[o, e.pop_id, e.attempt, e.deadline_ms, e.client_id, int(e.auto_renew),
                              e.renew_until_ms, e.received_ms, *_group_column(e.group)]
                             for o, e in sorted(q.inflight.items())],
                "pending": [[o, p.attempt, p.pop_id, *_group_column(p.group)] for o, p in sorted(q.pending.items())],
            })
        return {"lastPopId": self._last_pop_id, "queues": queues}

    @classmethod
    def from_snapshot(cls, doc: object, settings: PopSettings | None = None, *, pop_id_floor: int = 0,
                      sink: Sink | None = None) -> PopLedger:
        """Rebuild a ledger from `snapshot()`'s dict; PopStateError when it is not one."""
        ledger = cls(settings, pop_id_floor=pop_id_floor, sink=sink)
        try:
            ledger._last_pop_id = max(pop_id_floor, *_ints(doc["lastPopId"]))  # type: ignore[index]
            for raw in doc["queues"]:  # type: ignore[index]
                queue_id, cursor = _ints(raw["queueId"], raw["cursor"])
                key = QueueKey(raw["group"], raw["topic"], queue_id)
                if not isinstance(key.group, str) or not isinstance(key.topic, str) or key in ledger._queues:
                    raise PopStateError(f"bad or repeated queue {key}")
                q = ledger._queues[key] = _Queue(cursor)
                for row in raw["inflight"]:  # 7 values before the receive time was kept, 9 with a group
                    o, pop_id, attempt, deadline, client, auto, until, *received = row
                    group = _group(received[1:])
                    _ints(o, pop_id, attempt, deadline, until, *received[:1])
                    if (not isinstance(client, str) or auto not in (0, 1) or o >= cursor or o in q.inflight
                            or len(received) > 2):
                        raise PopStateError(f"bad in-flight entry at offset {o} of {key}")
                    q.put_inflight(o, InFlight(pop_id, deadline, attempt, client, bool(auto), until,
                                               received[0] if received else 0, group))
                    ledger._push_deadline(key, o, q.inflight[o])
                    ledger._last_pop_id = max(ledger._last_pop_id, pop_id)
                for o, attempt, pop_id, *rest in raw["pending"]:  # 4 values with a group
                    _ints(o, attempt, pop_id)
                    if o >= cursor or q.live(o) or len(rest) > 1:
                        raise PopStateError(f"bad pending entry at offset {o} of {key}")
                    q.put_pending(Pending(o, attempt, pop_id, _group(rest)))
                q.undone = sorted([*q.inflight, *q.pending])
                ledger._inflight_total += len(q.inflight)
        except PopStateError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise PopStateError(f"not a pop state ({type(e).__name__}: {e})") from None
        return ledger

    # -- internals --------------------------------------------------------------------------

    def _queue(self, key: QueueKey) -> _Queue:
        q = self._queues.get(key)
        if q is None:
            raise KeyError(f"no pop state for {key} (ensure_queue first)")
        return q

    def _current(self, h: HandleFields) -> tuple[_Queue, InFlight]:
        q = self._queues.get(h.key)
        if q is None:
            raise StaleReceiptHandleError(h.key, h.offset, "the queue's pop state was reset or removed")
        entry = q.inflight.get(h.offset)
        if entry is None:
            why = "redelivered" if h.offset in q.pending else "already acked, revived or reset"
            raise StaleReceiptHandleError(h.key, h.offset, f"the delivery is over ({why})")
        if entry.pop_id != h.pop_id or entry.attempt != h.attempt:
            raise StaleReceiptHandleError(h.key, h.offset, "superseded by a later delivery or a change of "
                                                            "invisible time")
        return q, entry

    @staticmethod
    def _moved(q: _Queue, before: int) -> int | None:
        after = q.watermark()
        return after if after != before else None

    def _push_deadline(self, key: QueueKey, offset: int, entry: InFlight) -> None:
        heapq.heappush(self._deadlines, (entry.deadline_ms, key, offset, entry.pop_id))

    def _deadline_live(self, item: tuple[int, QueueKey, int, int]) -> bool:
        deadline, key, offset, pop_id = item
        q = self._queues.get(key)
        entry = None if q is None else q.inflight.get(offset)
        return entry is not None and entry.pop_id == pop_id and entry.deadline_ms == deadline

    def _due(self, horizon_ms: int, limit: int | None) -> list[tuple[QueueKey, int]]:
        """(key, offset) of live in-flight entries with deadline <= horizon_ms, earliest first."""
        heap, live = self._deadlines, []
        while heap and heap[0][0] <= horizon_ms and (limit is None or len(live) < limit):
            item = heapq.heappop(heap)
            if self._deadline_live(item):
                live.append(item)
        for item in live:
            heapq.heappush(heap, item)
        return [(key, offset) for _, key, offset, _ in live]

    def _compact_deadlines(self) -> None:
        if len(self._deadlines) > 2 * self._inflight_total + _COMPACT_SLACK:
            self._deadlines = [item for item in self._deadlines if self._deadline_live(item)]
            heapq.heapify(self._deadlines)


def _group_column(group: str | None) -> list[str]:
    return [] if group is None else [group]


def _group(column: list) -> str | None:
    if not column:
        return None
    if not isinstance(column[0], str):
        raise PopStateError(f"message group {column[0]!r} is not a string")
    return column[0]


def _ints(*values: object) -> tuple[int, ...]:
    for value in values:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise PopStateError(f"{value!r} is not a non-negative integer")
    return values  # type: ignore[return-value]
