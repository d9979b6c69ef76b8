"""What a master knows of each replica's stream (broker/cluster/replication.py): how far it acknowledged, when
it last held everything the master had (in sync or not), and the state changes the stream owes it. Pure
data and arithmetic; the streams themselves live in ReplicationSource.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterable
from dataclasses import dataclass, field

from tidemark.broker.offsets.journal import JournalRecord, encode_records
from tidemark.broker.producers.store import encode_events
from tidemark.broker.producers.table import ProducerEvent

# Kept per replica: the chunks that brought it level with the master and are not acknowledged yet.
MAX_LEVELS = 256


@dataclass
class CatchUp:
    """When a replica last held everything its master had (Kafka's lastCaughtUpTime), from what the master
    sent and what the replica acknowledged. Pure: times are given."""

    at: float | None = None  # None: not since it connected
    _levels: collections.deque[tuple[int, float]] = field(
        default_factory=lambda: collections.deque(maxlen=MAX_LEVELS))

    def sent(self, end: int, master_end: int, now: float) -> None:
        """A chunk (or heartbeat) ending at `end` went out when the master's log ended at `master_end`."""
        if end < master_end or (self._levels and self._levels[-1][0] == end):
            return  # behind even once stored; or no news (the earliest time for an end is kept)
        self._levels.append((end, now))

    def acknowledged(self, end: int) -> None:
        while self._levels and self._levels[0][0] <= end:
            self.at = self._levels.popleft()[1]

    def in_sync(self, acked: int, master_end: int, now: float, max_lag_s: float) -> bool:
        """Holding all the master has, or having held all it had within `max_lag_s`."""
        return acked >= master_end or (self.at is not None and now - self.at <= max_lag_s)


@dataclass
class _Replica:
    """One replica's stream as its master sees it."""

    key: str  # "name/id@peer": one per stream
    acked: int
    progress: asyncio.Event
    catch_up: CatchUp = field(default_factory=CatchUp)
    broker_id: int = field(kw_only=True)  # the replica: a reconnect is a new stream of the same one
    # Whether it acknowledged the stream's first chunk, which carries the master's producer and offset
    # tables whole: until then it holds what it had (a file, a former master's own), and is not in sync.
    has_state: bool = field(default=False, kw_only=True)
    # Chunks sent on the stream and answered by the replica, and the state changes the stream owes it:
    # whether it holds everything the master sent (a switchover waits for that, switchover.py).
    sent: int = field(default=0, kw_only=True)
    answered: int = field(default=0, kw_only=True)
    feed: _Feed | None = field(default=None, kw_only=True)
    # The master's tables sent whole when they change (replicated_tables.py): per table, the version last sent
    # on the stream and last acknowledged, and those sent and not acknowledged yet, by chunk number.
    tables_sent: dict[str, int] = field(default_factory=dict, kw_only=True)
    tables_acked: dict[str, int] = field(default_factory=dict, kw_only=True)
    tables_in_flight: collections.deque[tuple[int, str, int]] = field(default_factory=collections.deque, kw_only=True)
    # When it last answered a chunk (or connected), on the master's clock: a replica silent for longer is not
    # waited for (an idle master's log stays level with a replica that stopped answering).
    answered_at: float = field(default=0.0, kw_only=True)

    def sending(self, table: str, version: int) -> None:
        """The chunk about to go (number `sent + 1`) carries `table` as of `version`."""
        self.tables_sent[table] = version
        self.tables_in_flight.append((self.sent + 1, table, version))

    def answered_chunk(self, now: float) -> None:
        """The replica answered its next chunk (one answer a chunk, in order) at `now`."""
        self.answered += 1
        self.answered_at = now
        while self.tables_in_flight and self.tables_in_flight[0][0] <= self.answered:
            _, table, version = self.tables_in_flight.popleft()
            self.tables_acked[table] = version

    def table_acked(self, table: str) -> int:
        """The version of `table` the replica acknowledged (-1: none)."""
        return self.tables_acked.get(table, -1)

    def holds_all(self, master_end: int) -> bool:
        """Whether it acknowledged the log to `master_end` and every chunk sent, and is owed no state."""
        return (self.has_state and self.acked >= master_end and self.answered >= self.sent
                and not (self.feed is not None and self.feed.pending()))

    def in_sync(self, master_end: int, now: float, max_lag_s: float) -> bool:
        """Holding the master's state and all its log has, or having held all of it within `max_lag_s`."""
        return self.has_state and self.catch_up.in_sync(self.acked, master_end, now, max_lag_s)


# A stream owing more changes than this sends the producer or offset table whole again instead (a slow
# replica).
MAX_FEED_EVENTS = 100_000


@dataclass(eq=False)  # one per stream, kept in a set by identity
class _Feed:
    """The state changes one replica's stream owes it besides records (see the module docstring)."""

    producer_state: bytes = b""  # the whole table, JSON: the first chunk's (or after an overflow)
    producer_events: list[ProducerEvent] = field(default_factory=list)
    offset_table: bytes = b""  # the whole offset table: the first chunk's (or after an overflow)
    offset_records: list[JournalRecord] = field(default_factory=list)

    def pending(self) -> bool:
        return bool(self.producer_state or self.producer_events or self.offset_table or self.offset_records)

    def take(self) -> dict[str, bytes]:
        fields = {"producer_state": self.producer_state, "producer_events": encode_events(self.producer_events),
                  "offset_table": self.offset_table, "offset_records": encode_records(self.offset_records)}
        self.producer_state, self.producer_events, self.offset_table, self.offset_records = b"", [], b"", []
        return fields


def nth_highest(ends: Iterable[int], n: int) -> int | None:
    """The commit-log end at least `n` of the replicas hold (their n-th highest acknowledged end), or,
    with fewer than `n` of them, the end all of them hold; None without any."""
    ranked = sorted(ends, reverse=True)
    return ranked[min(n, len(ranked)) - 1] if ranked else None


__all__ = ["MAX_FEED_EVENTS", "MAX_LEVELS", "CatchUp", "nth_highest"]
