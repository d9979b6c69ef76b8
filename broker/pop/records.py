"""The pop ledger's records (what it holds per delivery) and events (how it changes, journaled as they are).

A message group is a message's `__SHARDINGKEY` property (RocketMQ 5's message group; "" for a message
without one). The ledger records it only where FIFO needs it: FIFO pops record the group of every offset
they hand out or hold back; other pops record none. A group of `None` means "not recorded" (a concurrent
pop, or a state written before groups were kept), and FIFO treats such an entry as belonging to every
group: it blocks the whole queue, as FIFO did per queue before (see ledger.py).

Pure data: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from tidemark.broker.pop.handles import HandleFields, QueueKey

__all__ = [
    "InFlight", "Pending", "ExpiredEntry", "PopResult", "PopStateError", "HELD",
    "PopEvent", "Sink", "Reset", "Dropped", "Popped", "Acked", "Changed", "Renewed", "Revived", "Redelivered",
]

# The pop id of a pending entry that was never handed out: a FIFO message held back behind an unfinished
# message of its group (real pop ids start above the broker's wall-clock floor, never 0).
HELD = 0


# -- state records ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InFlight:  # one delivery under way
    pop_id: int
    deadline_ms: int
    attempt: int  # 1 on the first delivery
    client_id: str
    auto_renew: bool
    renew_until_ms: int  # auto-renewal stops here (0 without auto_renew)
    received_ms: int = 0  # when this delivery was handed out (0: unknown, a state from before it was kept)
    group: str | None = None  # its message group ("" none); None: not recorded (a concurrent pop, an old state)


@dataclass(frozen=True, slots=True)
class Pending:
    """A FIFO message to hand out in place, before the cursor: an expired delivery (pop_id is the expired
    one's, for `revived`) or a message held back behind its group (pop_id HELD, attempt its first)."""

    offset: int
    attempt: int
    pop_id: int
    group: str | None = None

    @property
    def held(self) -> bool:
        return self.pop_id == HELD


class ExpiredEntry(NamedTuple):
    key: QueueKey
    offset: int
    entry: InFlight

    @property
    def handle(self) -> HandleFields:
        return HandleFields(*self.key, self.offset, self.entry.pop_id, self.entry.attempt)


@dataclass(frozen=True, slots=True)
class PopResult:
    handles: tuple[HandleFields, ...]
    next_cursor: int  # lower than asked when the in-flight cap (or a FIFO pop's limit) cut the pop short
    deadline_ms: int
    watermark: int | None  # the new watermark when filtered offsets moved it, else None


class PopStateError(ValueError):
    """A snapshot document that cannot be a pop state."""


# -- events: each operation's whole change, journaled as is ---------------------------------------


@dataclass(frozen=True, slots=True)
class Reset:  # the queue starts over at `cursor` (its first pop, or an admin reset)
    key: QueueKey
    cursor: int


@dataclass(frozen=True, slots=True)
class Dropped:  # the queue's pop state is gone (group or topic deleted)
    key: QueueKey


@dataclass(frozen=True, slots=True)
class Popped:
    """`entries` = (offset, pop_id, attempt), offsets increasing (pending ones first); `held` = (offset,
    attempt, group) of new offsets held back (FIFO: their group is busy), pending from now on; the other
    offsets of [cursor_from, next_cursor) matched no filter: done. `groups` is the message group of each
    entry (a FIFO pop), or empty (not recorded)."""

    key: QueueKey
    cursor_from: int
    next_cursor: int
    deadline_ms: int
    client_id: str
    auto_renew: bool
    renew_until_ms: int
    entries: tuple[tuple[int, int, int], ...]
    received_ms: int = 0  # the pop's time (0 in journals written before it was recorded)
    groups: tuple[str, ...] = ()  # parallel to entries (FIFO pops); () in other pops and older journals
    held: tuple[tuple[int, int, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Acked:
    key: QueueKey
    offset: int
    pop_id: int


@dataclass(frozen=True, slots=True)
class Changed:  # ChangeInvisibleDuration: new deadline, new pop id, auto-renewal ends
    key: QueueKey
    offset: int
    pop_id: int
    new_pop_id: int
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class Renewed:  # auto-renewal: later deadline, same pop id (the client's handle stays valid)
    key: QueueKey
    offset: int
    pop_id: int
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class Revived:  # copied to the retry topic or the DLQ (or gone from the store): the entry is done
    key: QueueKey
    offset: int
    pop_id: int


@dataclass(frozen=True, slots=True)
class Redelivered:  # FIFO expiry: back to pending with attempt + 1
    key: QueueKey
    offset: int
    pop_id: int


PopEvent = Reset | Dropped | Popped | Acked | Changed | Renewed | Revived | Redelivered
Sink = Callable[[Sequence[PopEvent]], None]
