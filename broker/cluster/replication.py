"""Replication of a broker name's commit log from its master (id 0) to replicas (ids above 0).

RocketMQ's master/slave HA, over one gRPC stream per replica
(proto/tidemark/v1/replication.proto):

- **ReplicaSync** (on a replica, replica_sync.py) opens the stream saying where its commit log
  ends; the master first tells it to truncate a tail the master does not have
  (bytes a former master wrote that nobody acknowledged from here), at the
  first record where the two logs part (divergence.py: a few rounds of probes
  on the stream find it), then
  sends whole records from that point as they lie in the master's files. The
  replica stores them at the same offsets (MessageStore.append_replicated,
  which checks every record's CRC and offset) and indexes them in its own
  consume queues, then acknowledges its new end. A broken stream is opened
  again with backoff, from the replica's end, so restarts resume. Every
  second it also mirrors the master's topics, groups and consumer offsets.
- The stream also carries the master's state with the records: the
  idempotent-producer table (whole at the stream's start, then every change,
  a batch's with or before its records: a promoted replica deduplicates the
  retry of any batch it holds) and the consumer-offset table (whole at the
  start, then every commit, taken like the mirror takes them, milliseconds
  after the commit). A replica is in sync only once it acknowledged the
  first chunk: an elected one holds the master's offsets, not its own file's.
  The queue lock table and the topic and group configs go whole with the
  next chunk after each change (replicated_tables.py), and a lock grant or an
  admin change is answered once the replicas in sync acknowledged it
  (`wait_table_replicated`; Kafka writes a group's state with acks=all, and its
  topics live in a replicated log): a replica promoted after the answer holds it.
- **ReplicationSource** (on a master) serves those streams, at most
  `window_bytes` ahead of what a replica acknowledged, and knows how far each
  replica is. With sync replication (RocketMQ's SYNC_MASTER) a send is
  stored or refused, never both:
  - before storing, `check_in_sync` refuses it while fewer than
    `min_replicas` connected replicas are in sync (NotEnoughReplicasError,
    UNAVAILABLE, nothing stored: Kafka's NOT_ENOUGH_REPLICAS with
    min.insync.replicas, RocketMQ's SLAVE_NOT_AVAILABLE);
  - after storing, the answer waits until `min_replicas` replicas
    acknowledged the records, or after `timeout_s` is ReplicationTimeoutError: an unknown
    outcome (DEADLINE_EXCEEDED), never an acknowledgement of data only the
    master holds. The records stay on the master; an idempotent producer's
    retry with the same sequence is answered as a duplicate, any other
    retry may store them twice (at-least-once).
  Replicas are counted by broker id (a replica that reconnects while its old
  stream lingers is one replica). A replica is in sync while it holds everything the master has, or held
  it within the last `max(timeout_s, 2 heartbeats)` (Kafka's
  replica.lag.time.max.ms): one that went silent or fell behind stops
  counting before sends pile up on the master only.
- Readers see only what `min_replicas` replicas acknowledged (`confirmed`,
  Kafka's high watermark; while fewer are connected, what all of the
  connected ones hold, as Kafka's moves with a shrinking in-sync set): the
  store's reads end there and readers are woken when it moves
  (`on_readable`), not on the append. Otherwise a consumer could read
  a record the master stored but no replica got (a send that timed out, an
  async send not copied yet) and, after a failover, skip the message the
  promoted replica stores at the same offset. With sync replication the
  bound holds once a replica has connected (what no replica holds was never
  acknowledged); with async replication only while a replica is in sync
  (one that falls behind or goes away must not stop the consumers of a
  master that takes writes without it; promoting it then loses what it
  lacks, Kafka's unclean election). Until a replica first connects, nothing
  bounds reads.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import AsyncIterator, Callable

from tidemark.broker.cluster.divergence import Search, agrees
from tidemark.broker.cluster.replica_progress import (
    MAX_FEED_EVENTS,
    _Feed,
    _Replica,
    nth_highest,
)
from tidemark.broker.cluster.replicated_tables import CONFIG, LOCKS, ReplicatedTables
from tidemark.broker.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotEnoughReplicasError,
    ReplicationTimeoutError,
)
from tidemark.broker.ingest.delays import ScheduleMessageService
from tidemark.broker.membership.groups import SubscriptionGroupManager
from tidemark.broker.membership.lock_file import LockFile
from tidemark.broker.offsets import ConsumerOffsetManager
from tidemark.broker.offsets.persistence import (
    DecodeResult,
    OffsetFileError,
    decode_offset_table,
    encode_offset_table,
)
from tidemark.broker.pop.service import PopService
from tidemark.broker.producers.service import IdempotenceService
from tidemark.broker.store import MessageStore
from tidemark.broker.topics import TopicConfigManager
from tidemark.common.logs import get_logger
from tidemark.common.scheduler import cancel_and_wait
from tidemark.v1 import replication_pb2

log = get_logger("tidemark.broker.cluster.replication")

CHUNK_BYTES = 1 << 20
WINDOW_BYTES = 8 << 20
HEARTBEAT_S = 1.0
# A lock grant or an admin change waits at most this long for the replicas to hold it (below the client's 3 s
# deadline for the call), and not for a replica that has answered nothing for TABLE_SILENCE_S; it looks again
# every TABLE_RECHECK_S.
TABLE_WAIT_S = 2 * HEARTBEAT_S
TABLE_SILENCE_S = 2 * HEARTBEAT_S
TABLE_RECHECK_S = 0.25
MAX_RECEIVE_BYTES = 256 << 20



def decode_offsets(data: bytes) -> DecodeResult:
    """An offsets document from the other side; InvalidArgumentError when it is not one."""
    try:
        return decode_offset_table(data)
    except OffsetFileError as e:
        raise InvalidArgumentError(f"offsets_json is not an offset table: {e}") from None


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class ReplicationSource:
    def __init__(self, store: MessageStore, *, broker_name: str, segment_size: int, timeout_s: float = 3.0,
                 chunk_bytes: int = CHUNK_BYTES, window_bytes: int = WINDOW_BYTES, sync: bool = False,
                 min_replicas: int = 1, epoch: Callable[[], int] = lambda: 0,
                 clock: Callable[[], float] = time.monotonic, fenced: Callable[[], bool] = lambda: False) -> None:
        if min_replicas < 1:
            raise ValueError(f"min_replicas must be at least 1, got {min_replicas}")
        self._store = store
        self._sync = sync
        self._min_replicas = min_replicas
        self._fenced = fenced  # a master that may have been replaced: reads end at `confirmed`
        self._epoch = epoch
        self._broker_name = broker_name
        self._segment_size = segment_size
        self._timeout_s = timeout_s
        # A replica that has not been level with the master for longer than a send waits for it cannot be
        # counted on to acknowledge the next one in time (two heartbeats at least: an idle replica hears
        # from the master once a second).
        self._max_lag_s = max(timeout_s, 2 * HEARTBEAT_S)
        self._clock = clock
        self._chunk_bytes = chunk_bytes
        self._window_bytes = window_bytes
        self._replicas: dict[str, _Replica] = {}
        self._appended: set[asyncio.Event] = set()  # one per open stream, set on every append
        self._waiters: list[tuple[int, asyncio.Future]] = []
        self._feeds: set[_Feed] = set()  # one per open stream
        self._acked: set[asyncio.Event] = set()  # set on every acknowledgement or change of replicas (_until_acked)
        self._producers: IdempotenceService | None = None
        self._offsets: ConsumerOffsetManager | None = None
        # The tables sent whole when they change (replicated_tables.py), and the version of each that every
        # replica waited for held when last asked (wait_table_replicated).
        self.tables = ReplicatedTables()
        self._held_versions: dict[str, int] = {}
        # What `min_replicas` replicas acknowledged, as _replicated_end says (None: no replica since start),
        # and the appends readers are not told of yet: (commit-log end after the append, queue).
        self.confirmed: int | None = None
        self._unconfirmed: collections.deque[tuple[int, tuple[str, int]]] = collections.deque()
        # Readers of a queue to wake when its appends become readable (None: readers are not bounded).
        self.on_readable: Callable[[str, int], None] | None = None
        self.on_all_readable: Callable[[], None] = lambda: None

    def on_append(self, topic: str, queue_id: int) -> None:
        """The store's dispatch listener: wake the streams (and readers, once it is readable)."""
        for event in self._appended:
            event.set()
        if self.on_readable is not None:
            if self.read_limit() is None:
                self.on_readable(topic, queue_id)
            else:
                self._unconfirmed.append((self._store.commit_log_max_offset, (topic, queue_id)))

    def follow(self, producers: IdempotenceService, offsets: ConsumerOffsetManager, locks: LockFile | None = None,
               topics: TopicConfigManager | None = None, groups: SubscriptionGroupManager | None = None) -> None:
        """Send the producer table, the offset changes, the queue lock table and the topic and group configs
        along with the records (the controller wires it)."""
        self._producers = producers
        self._offsets = offsets
        producers.listeners.append(self._producer_events)
        offsets.listeners.append(self._offset_records)
        if locks is not None:
            locks.on_change = self._wake_streams  # (a grant or a release: the streams send it now)
            self.tables.add(LOCKS, lambda: locks.changes, lambda: {"queue_locks": locks.encoded()})
        if topics is not None and groups is not None:
            self.tables.add(CONFIG, lambda: topics.version + groups.version, lambda: {
                "topics_json": json.dumps(topics.document()).encode(),
                "groups_json": json.dumps(groups.document()).encode()})
        # What the tables held before this master served (its start, its promotion) was answered by nobody
        # waiting for replicas: a replica gets it with its first chunk.
        self._held_versions = self.tables.versions()

    def _producer_events(self, events) -> None:
        for feed in self._feeds:
            if len(feed.producer_events) + len(events) > MAX_FEED_EVENTS:
                # The table whole instead, and these events after it: an id given out or forgotten is
                # published before the table applies it (applying one twice changes nothing).
                feed.producer_state, feed.producer_events = self._producer_state(), list(events)
            else:
                feed.producer_events.extend(events)
        self._wake_streams()

    def _offset_records(self, records) -> None:
        for feed in self._feeds:
            if len(feed.offset_records) + len(records) > MAX_FEED_EVENTS:
                # The table whole instead (it holds these records' changes), and nothing owed before it.
                feed.offset_table, feed.offset_records = self._offset_table(), []
            else:
                feed.offset_records.extend(records)
        self._wake_streams()

    def _offset_table(self) -> bytes:
        return encode_offset_table(*self._offsets.table(well_named=True)) if self._offsets is not None else b""

    def _producer_state(self) -> bytes:
        return json.dumps(self._producers.snapshot(), separators=(",", ":")).encode() if self._producers else b""

    def _waits_for(self, replica: _Replica, end: int, now: float) -> bool:
        """Whether a grant or an admin change waits for `replica`: one in sync, or just connected (its first
        chunk not answered yet: answering it may make it in sync, and the change must reach it first), that
        answered a chunk within TABLE_SILENCE_S (a master whose log does not move keeps a replica that
        stopped answering in sync)."""
        return (now - replica.answered_at <= TABLE_SILENCE_S
                and (not replica.has_state or replica.in_sync(end, now, self._max_lag_s)))

    async def wait_table_replicated(self, table: str) -> None:
        """Until every replica a change waits for (`_waits_for`) acknowledged a chunk carrying `table` (a name
        of replicated_tables.py) as it is now: a queue lock grant, an admin change of a topic or a group, is
        answered after this, so that a replica promoted once the client heard of it holds it too. A replica
        out of sync is not waited for, as a sync send does not wait for it; after TABLE_WAIT_S at most (below
        a client's deadline for the call) the change is answered all the same, logged (it holds on this
        master). Called after every request (flush_configs): returns at once for a version already held."""
        version = self.tables.version(table)
        if version is None or self._held_versions.get(table) == version:
            return
        loop = asyncio.get_running_loop()

        def held() -> bool:
            end, now = self._store.commit_log_max_offset, self._clock()
            return all(r.table_acked(table) >= version for r in self._replicas.values() if self._waits_for(r, end, now))

        if not held():
            self._wake_streams()
            deadline = loop.time() + min(self._timeout_s, TABLE_WAIT_S)
            while not held():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    log.warning("a change is answered before every replica in sync acknowledged it: a promotion now "
                                "may lose it", event="table_not_replicated", table=table,
                                waited_s=round(min(self._timeout_s, TABLE_WAIT_S), 3))
                    return
                try:  # (woken by acknowledgements; asked again each slice: a replica may go silent meanwhile)
                    async with asyncio.timeout(min(remaining, TABLE_RECHECK_S)):
                        await self._until_acked(held)
                except TimeoutError:
                    pass
        # (a replica that connects later gets every table in its first chunk)
        self._held_versions[table] = max(version, self._held_versions.get(table, -1))

    def _wake_streams(self) -> None:
        for event in self._appended:
            event.set()

    def read_limit(self) -> int | None:
        """The store's read limit: `confirmed`, or None (unbounded) before any replica connected (in this
        run or, restored, the last) and, with async replication, while no replica is in sync and the
        broker is certainly still the master (not fenced, its etcd lease certain)."""
        if self.confirmed is None:
            return None
        if self._sync or self._fenced() or self._any_in_sync():
            return self.confirmed
        return None

    def restore(self, confirmed: int) -> None:
        """At start: the replicated end the last run knew (broker/cluster/replication_checkpoint.py, never past the
        log's end), so readers stay bounded until replicas acknowledge again; readers waiting past it are
        woken once a replica holds the whole log."""
        if self.confirmed is not None and confirmed <= self.confirmed:
            return
        self.confirmed = confirmed
        end = self._store.commit_log_max_offset
        if confirmed < end:
            self._unconfirmed.append((end, ("", -1)))

    def _any_in_sync(self) -> bool:
        # On every read of an async master: stops at the first replica in sync.
        end, now = self._store.commit_log_max_offset, self._clock()
        # Level with the log is enough here, the master's state not yet acknowledged included: bounding
        # reads for a replica that may become master errs on the side of nobody reading what it lacks.
        return any(r.catch_up.in_sync(r.acked, end, now, self._max_lag_s) for r in self._replicas.values())

    def in_sync_replicas(self) -> list[int]:
        """The broker ids of the connected replicas in sync (RocketMQ 5's SyncStateSet, Kafka's ISR less
        the leader)."""
        end, now = self._store.commit_log_max_offset, self._clock()
        return sorted(r.broker_id for r in self._replicas.values()
                      if r.in_sync(end, now, self._max_lag_s))

    def _held_end(self) -> int | None:
        """The commit-log end `min_replicas` replicas acknowledged; None while fewer are connected (one
        stream per replica: serve() drops an older stream of a replica that connects again)."""
        acked = [r.acked for r in self._replicas.values()]
        return nth_highest(acked, self._min_replicas) if len(acked) >= self._min_replicas else None

    def _held_by_enough(self, end: int) -> bool:
        """Whether `min_replicas` replicas acknowledged `end`."""
        held = self._held_end()
        return held is not None and held >= end

    def _replicated_end(self) -> int | None:
        """What readers may read up to: what `min_replicas` replicas hold, or, while fewer are connected,
        what every connected one holds (Kafka's high watermark over the in-sync set); None: none is."""
        return nth_highest((r.acked for r in self._replicas.values()), self._min_replicas)

    def release_readers(self) -> None:
        """The timer's job: once reads are no longer bounded (async: no replica in sync any more), wake the
        readers of every append they were not told of."""
        if self._unconfirmed and self.read_limit() is None:
            self._unconfirmed.clear()
            self.on_all_readable()

    def _confirm(self, end: int) -> None:
        """Replicas hold the commit log up to `end` (as _replicated_end counts): readers may read up to
        there."""
        first = self.confirmed is None
        if not first and end <= self.confirmed:
            return
        self.confirmed = end
        if self.on_readable is None:
            return
        if first and end < self._store.commit_log_max_offset:
            # Readers were unbounded until now: what they read past `end` stays read; what they wait for
            # past it comes with the next appends, or here once the replica holds the tail.
            self._unconfirmed.append((self._store.commit_log_max_offset, ("", -1)))
        woken: set[tuple[str, int]] = set()
        while self._unconfirmed and self._unconfirmed[0][0] <= end:
            _, key = self._unconfirmed.popleft()
            if key not in woken:
                woken.add(key)
                if key[1] < 0:
                    self.on_all_readable()
                else:
                    self.on_readable(*key)

    def replicas(self) -> dict[str, int]:
        """Connected replicas (their current stream's key) and the commit-log end each acknowledged."""
        return {r.key: r.acked for r in self._replicas.values()}

    def replica_ends(self) -> dict[int, int]:
        """The connected replicas by broker id, with the commit-log end each acknowledged."""
        return {r.broker_id: r.acked for r in self._replicas.values()}

    def holds_all(self, broker_id: int) -> bool:
        """Whether replica `broker_id` holds everything this master has: its whole log, acknowledged, every
        producer and offset change, and its tables (queue locks, topics, groups) as they are now (a master
        handing over with writes paused waits for this)."""
        end = self._store.commit_log_max_offset
        return any(r.broker_id == broker_id and r.holds_all(end) and self.tables.held_by(r)
                   for r in self._replicas.values())

    async def wait_holds_all(self, broker_id: int, timeout_s: float) -> bool:
        """Until `holds_all(broker_id)`; False once `timeout_s` passed first."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._until_acked(lambda: self.holds_all(broker_id))
            return True
        except TimeoutError:
            return False

    async def wait_replicas_hold_all(self) -> None:
        """Until every connected replica holds everything this master has (a stop lets them copy the log's
        end); the caller bounds the wait."""
        await self._until_acked(lambda: all(r.holds_all(self._store.commit_log_max_offset) and self.tables.held_by(r)
                                            for r in self._replicas.values()))

    async def _until_acked(self, done: Callable[[], bool]) -> None:
        """Until `done()`, asked again at each acknowledgement of a replica."""
        acked = asyncio.Event()
        self._acked.add(acked)
        try:
            while not done():
                acked.clear()
                await acked.wait()
        finally:
            self._acked.discard(acked)

    def check_in_sync(self) -> None:
        """Before a sync-replication send is stored: NotEnoughReplicasError (nothing stored, retriable)
        unless `min_replicas` connected replicas are in sync, so that a send is either stored or refused,
        never both."""
        in_sync = self.in_sync_replicas()
        if len(in_sync) >= self._min_replicas:
            return
        end, now = self._store.commit_log_max_offset, self._clock()
        lagging = [r for r in self._replicas.values() if r.broker_id not in in_sync]
        if not self._replicas:
            why = "none is connected"
        else:
            why = "; ".join(f"{r.key} holds {r.acked} of {end} bytes, " + (
                "has not acknowledged the master's state yet" if not r.has_state else
                "not level since it connected" if r.catch_up.at is None else
                f"last level {now - r.catch_up.at:.1f} s ago") for r in lagging)
            why = (f"in sync: {', '.join(map(str, in_sync)) or 'none'}; "
                   f"behind for longer than {self._max_lag_s:.1f} s: {why or 'none'}")
        need = "no in-sync replica is" if self._min_replicas == 1 else \
            f"fewer than {self._min_replicas} in-sync replicas (min_sync_replicas) are"
        raise NotEnoughReplicasError(f"broker {self._broker_name} replicates synchronously and {need} connected "
                                     f"({why}); the message was not stored, retry later")

    async def wait_replicated(self, end: int) -> None:
        """Until `min_replicas` replicas acknowledged `end` (they may connect meanwhile);
        ReplicationTimeoutError after the timeout: the records are stored here, whether replicas have
        them is unknown."""
        if self._held_by_enough(end):
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.append((end, future))
        try:
            async with asyncio.timeout(self._timeout_s):
                await future
        except TimeoutError:
            if future.done() and not future.cancelled():  # answered in the loop turn the timer fired in
                return future.result()
            who = "no replica" if self._min_replicas == 1 else f"fewer than {self._min_replicas} replicas"
            raise ReplicationTimeoutError(
                f"{who} of broker {self._broker_name} acknowledged the message within {self._timeout_s:.1f} s; "
                f"it is stored on the master, its outcome is unknown (retry; an idempotent producer's retry is "
                f"stored once)") from None
        finally:
            self._waiters = [(e, f) for e, f in self._waiters if f is not future]

    def _acknowledge(self, replica: _Replica, end: int) -> None:
        replica.acked = max(replica.acked, end)
        replica.catch_up.acknowledged(replica.acked)
        replica.progress.set()
        self._on_replicas_changed()

    def _on_replicas_changed(self) -> None:
        """A replica acknowledged, connected or went: move the read bound, answer the sends now held, wake
        those waiting for what the replicas hold."""
        for event in self._acked:
            event.set()
        end = self._replicated_end()
        if end is None:
            return
        self._confirm(end)
        held = self._held_end()
        if held is None:
            return
        for want, future in self._waiters:
            if want <= held and not future.done():
                future.set_result(None)

    async def serve(self, requests: AsyncIterator[replication_pb2.ReplicaProgress],
                    peer: str) -> AsyncIterator[replication_pb2.ReplicationChunk]:
        """One replica's stream (the servicer's Replicate)."""
        hello = await anext(requests, None)
        if hello is None:
            return
        if hello.broker_name != self._broker_name or hello.broker_id <= 0:
            raise FailedPreconditionError(f"this master is broker {self._broker_name!r}; a replica of "
                                          f"{hello.broker_name!r} with id {hello.broker_id} cannot follow it")
        if hello.segment_size != self._segment_size:
            raise FailedPreconditionError(f"the replica's commitlog_segment_size {hello.segment_size} differs from "
                                          f"the master's {self._segment_size}; records must sit at the same offsets")
        store, start = self._store, hello.commit_log_end
        if start > store.commit_log_min_offset and not agrees(
                store.commit_log, start, hello.tail_crc if hello.HasField("tail_crc") else None):
            search = Search(store.commit_log, start, hello.commit_log_min)
            while search.found is None:  # rounds of probes: where the logs part, to the record
                probes = await search.probes()
                yield replication_pb2.ReplicationChunk(offset=probes[0], master_end=store.commit_log_max_offset,
                                                       probe=probes)
                answer = await anext(requests, None)
                if answer is None:
                    return
                if answer.probe_crc:  # (ValueError for a count that does not match: the stream fails)
                    search.answer(answer.probe_crc)
                else:  # a replica from before probes: it is cut as it was, from its segment's start
                    search.fall_back()
            cut = search.found
            if cut < hello.commit_log_min:
                raise FailedPreconditionError(
                    f"the replica holds [{hello.commit_log_min}, {start}) and disagrees with this master, which ends "
                    f"at {store.commit_log_max_offset}: no record it holds can be kept; clear the replica's data dir "
                    f"to copy the master again")
            log.warning("replica %s/%d disagrees with this log before %d; it truncates to %d, the first record "
                        "where the logs part (%d rounds of probes)", hello.broker_name, hello.broker_id, start, cut,
                        search.rounds, event="replica_diverged", offset=start, truncate_to=cut, rounds=search.rounds)
            yield replication_pb2.ReplicationChunk(offset=cut, master_end=store.commit_log_max_offset,
                                                   truncate_to=cut)
            return
        if start < store.commit_log_min_offset:
            if start != 0:
                raise FailedPreconditionError(
                    f"the replica ends at {start}, before the master's oldest record {store.commit_log_min_offset}; "
                    f"clear the replica's data dir to copy the master again")
            start = store.commit_log_min_offset
        # Taken in the same step as the feed starts: every later change reaches the feed.
        feed = _Feed(producer_state=self._producer_state(), offset_table=self._offset_table())
        replica = _Replica(f"{hello.broker_name}/{hello.broker_id}@{peer}", start, asyncio.Event(),
                           broker_id=hello.broker_id, feed=feed, answered_at=self._clock())
        replica.catch_up.sent(start, store.commit_log_max_offset, self._clock())
        replica.catch_up.acknowledged(start)  # level already when it connects at the master's end
        appended = asyncio.Event()
        reader: asyncio.Task | None = None
        try:
            # One stream per replica: an older one still open (its peer gone, not noticed yet) no longer
            # speaks for it, so a replica that lost its data and connects again counts for what it holds.
            for old in [r for r in self._replicas.values() if r.broker_id == replica.broker_id]:
                del self._replicas[old.key]
            self._replicas[replica.key] = replica
            self._appended.add(appended)
            self._feeds.add(feed)
            self._on_replicas_changed()
            log.info("replica connected", event="replica_connected", replica=replica.key, offset=start)
            reader = asyncio.get_running_loop().create_task(self._read_acks(requests, replica))
            async for chunk in self._chunks(replica, start, appended, reader, feed):
                yield chunk
        finally:
            if reader is not None:
                await cancel_and_wait(reader)  # its failure (the replica's side closed) is retrieved, not left
            self._forget(replica)
            self._appended.discard(appended)
            self._feeds.discard(feed)
            self.release_readers()
            log.info("replica disconnected", event="replica_disconnected", replica=replica.key, acked=replica.acked)

    def _forget(self, replica: _Replica) -> None:
        """This stream's replica is gone; a newer stream of the same replica (same key) stays."""
        if self._replicas.get(replica.key) is replica:
            del self._replicas[replica.key]
            for event in self._acked:  # (a stop waiting for every replica to hold all waits for one less)
                event.set()

    async def _read_acks(self, requests: AsyncIterator[replication_pb2.ReplicaProgress], replica: _Replica) -> None:
        try:
            async for progress in requests:
                replica.has_state = True  # each answers a chunk: the first carried the state whole
                replica.answered_chunk(self._clock())
                self._acknowledge(replica, progress.commit_log_end)
        finally:
            self._forget(replica)  # gone: sends are refused from now on, not stored and lost

    async def _chunks(self, replica: _Replica, offset: int, appended: asyncio.Event, reader: asyncio.Task,
                      feed: _Feed) -> AsyncIterator[replication_pb2.ReplicationChunk]:
        store = self._store
        while not reader.done():
            if offset - replica.acked > self._window_bytes:  # far enough ahead: wait for acknowledgements
                replica.progress.clear()
                if await _wait(replica.progress, HEARTBEAT_S):
                    continue
                # None for a heartbeat (a slow replica): a chunk without records all the same. A stream
                # silent for SILENCE_S is one the replica gives up and opens again, and on a connection that
                # carries no data its keepalive pings count as abuse (gRPC's ping policy: GOAWAY
                # too_many_pings after two inside the server's keepalive_min_interval_ms).
                state, data = {}, b""
            else:
                appended.clear()
                # The state changes first: a batch's producer event is published before its records are read.
                state = feed.take() if feed.pending() else {}
                state.update(self.tables.due(replica))
                data = store.replication_chunk(offset, self._chunk_bytes)
                if not (data or state) and await _wait(appended, HEARTBEAT_S):
                    continue  # appended meanwhile: read it
            master_end = store.commit_log_max_offset
            replica.catch_up.sent(offset + len(data), master_end, self._clock())
            replica.sent += 1
            yield replication_pb2.ReplicationChunk(offset=offset, data=data, master_end=master_end,
                                                   master_epoch=self._epoch(), **state)
            offset += len(data)

    def metadata(self, topics: TopicConfigManager, groups: SubscriptionGroupManager,
                 offsets: ConsumerOffsetManager, schedule: ScheduleMessageService,
                 pop: PopService) -> replication_pb2.ReplicaMetadata:
        pop_state, pop_secret = pop.replica_state()
        return replication_pb2.ReplicaMetadata(
            topics_json=json.dumps(topics.document()).encode(), groups_json=json.dumps(groups.document()).encode(),
            offsets_json=encode_offset_table(*offsets.table()), schedule_progress=schedule.progress(),
            pop_state_json=json.dumps(pop_state, separators=(",", ":")).encode(), pop_secret=pop_secret)


async def _wait(event: asyncio.Event, timeout_s: float) -> bool:
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
        return True
    except TimeoutError:
        return event.is_set()  # (set in the loop turn the timer fired in)
