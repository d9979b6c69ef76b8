"""A replica's side of replication: the stream from its master, and the metadata mirror.

ReplicaSync opens `ReplicationService.Replicate` to its master saying where
its commit log ends (and a digest of its tail), answers the master's probes
for where the two logs part, truncates when told to, then
stores the master's records at the same offsets and acknowledges its new end;
with them it takes the master's producer table and consumer offsets (whole in
the first chunk, then every change). Every second it also mirrors topics,
groups, delay and pop progress (`mirror_metadata`). On each connection, before
its copy goes on, it hands the commits its consumers made here while the
master was away back to it (not in controller mode, where a replica takes
none), and gives up the queue locks it granted them meanwhile. The master's
side, and the rules both follow, are in replication.py.
"""

from __future__ import annotations

import asyncio
import enum
import json
import time
from collections.abc import Awaitable, Callable

import grpc

from tidemark.broker import tls
from tidemark.broker.cluster.divergence import record_digests
from tidemark.broker.cluster.replication import (
    HEARTBEAT_S,
    MAX_RECEIVE_BYTES,
    decode_offsets,
    now_ms,
)
from tidemark.broker.errors import StoreError
from tidemark.broker.ingest.delays import ScheduleMessageService
from tidemark.broker.membership.groups import SubscriptionGroupManager
from tidemark.broker.offsets import ConsumerOffsetManager
from tidemark.broker.offsets.journal import decode_records
from tidemark.broker.offsets.persistence import encode_offset_table
from tidemark.broker.pop.ledger import PopStateError
from tidemark.broker.pop.service import PopService
from tidemark.broker.producers.service import IdempotenceService
from tidemark.broker.producers.store import decode_events
from tidemark.broker.producers.table import ProducerStateError
from tidemark.broker.store import MessageStore
from tidemark.broker.topics import TopicConfigManager
from tidemark.common.auth import Credentials, signed_metadata
from tidemark.common.logs import get_logger
from tidemark.common.scheduler import cancel_and_wait
from tidemark.v1 import replication_pb2, replication_pb2_grpc

log = get_logger("tidemark.broker.cluster.replication")

_MASTER_CHANNEL_OPTIONS = (
    # A chunk holds at least one whole record, up to max_message_size and more; the offset table too.
    ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
    # A master that comes up (or back) is found within half a second: _run waits for the channel to connect,
    # so this backoff is what a replica waits once its master is back (a sync master refuses every send
    # until a replica connects, and in controller mode a replica is eligible only once its master recorded
    # it in sync). gRPC's own backoff grows to two minutes: a replica started 20 s before its master took 9 s
    # more to connect. Two refused connections a second to a master that is down cost nothing.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
    # gRPC core takes this as the least time one connection attempt may take (client/remoting/connection.py).
    ("grpc.min_reconnect_backoff_ms", 20_000),
    # Its own connection: one made after a follow() does not inherit the backoff of a process-wide
    # subchannel that saw the same address die.
    ("grpc.use_local_subchannel_pool", 1),
    # A link that drops packets leaves a TCP connection open for as long as TCP retransmits (minutes): the
    # calls SILENCE_S ends would go on it again. A ping every 3 s, unanswered for 3 s, closes it (gRPC
    # 1.85 times a ping out by ping_timeout_ms; keepalive_timeout_ms alone left it open), and the channel
    # dials anew. Only while a call runs (the stream nearly always): the master sends a chunk a heartbeat,
    # which keeps its ping policy (min_ping_interval_without_data_ms) from counting these as abuse.
    ("grpc.keepalive_time_ms", 3_000),
    ("grpc.keepalive_timeout_ms", 3_000),
    ("grpc.http2.ping_timeout_ms", 3_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
)

# Between two calls to the master: the first retry at once (a stream that ran), then doubling while the
# master keeps ending the calls it took, to at most a couple of seconds.
FIRST_RETRY_S = 0.1
MAX_RETRY_S = 2.0


def next_retry_s(previous_s: float, streamed: bool) -> float:
    """The pause before the next call to the master, after a call that ended (`streamed`: it brought a chunk).

    Only calls the master took and ended are paced by this: while the master cannot be reached, _run
    waits for the channel to connect, which its own reconnect backoff paces. A replica that kept one
    doubling backoff for both waited up to two seconds after its master came back at the same address
    before even asking the channel, on top of the channel's own wait (1 to 2.3 s measured, master down
    0.5 to 5 s): a sync master takes no writes meanwhile."""
    return FIRST_RETRY_S if streamed else min(previous_s * 2, MAX_RETRY_S)


# A master sends a chunk at least once a HEARTBEAT_S (an empty one when idle): a stream silent for three is
# taken as down, though no reset ended it (a link that drops packets keeps a TCP connection open for minutes).
SILENCE_S = 3 * HEARTBEAT_S


def copy_is_current(streamed: bool, last_chunk_at: float, now: float, silence_s: float = SILENCE_S) -> bool:
    """Whether a replica's copy of its master's offsets is current: the running stream brought the master's
    whole table (`streamed`) and has brought a chunk within `silence_s` (monotonic seconds).

    A stream that ended is not enough to watch for: one whose link went silent without a reset never ends by
    itself, and the master behind it may take commits, answer them and die while the replica still holds the
    copy from before the silence. Heartbeats bound how long a live stream stays quiet, so silence past a few
    of them means the copy may be behind whatever the master answered since."""
    return streamed and now - last_chunk_at < silence_s


class State(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


class ReplicaSync:
    """A replica's side: the stream from its master, and the metadata mirror (see the module docstring)."""

    def __init__(self, *, master: str, store: MessageStore, topics: TopicConfigManager,
                 groups: SubscriptionGroupManager, offsets: ConsumerOffsetManager, schedule: ScheduleMessageService,
                 pop: PopService, producers: IdempotenceService, broker_name: str, broker_id: int, segment_size: int, after_mirror: Callable[[], Awaitable[None]],
                 on_topic_gone: Callable[[str], Awaitable[None]], tls_ca_file: str = "",
                 credentials: Credentials | None = None, clock_ms: Callable[[], int] = now_ms,
                 hand_back: bool = True, on_connected: Callable[[], None] = lambda: None,
                 on_master_locks: Callable[[bytes], None] = lambda data: None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.master = master
        self._store = store
        self._topics, self._groups, self._offsets, self._schedule = topics, groups, offsets, schedule
        self._pop = pop
        self._producers = producers
        # A topic the master deleted: its data goes here too (the store's queues, offsets, locks).
        self._on_topic_gone = on_topic_gone
        self._hello = dict(broker_name=broker_name, broker_id=broker_id, segment_size=segment_size)
        self._after_mirror = after_mirror
        self._on_master_locks = on_master_locks  # the master's lock table, as copied (kept for a promotion)
        self._tls_ca_file = tls_ca_file
        # A master with --auth takes replication from a user allowed Update on the cluster: each call is signed.
        self._credentials = credentials
        self._clock_ms = clock_ms
        self.state = State.NEW
        self._channel: grpc.aio.Channel | None = None
        self._stub: replication_pb2_grpc.ReplicationServiceStub | None = None
        self._task: asyncio.Task | None = None
        self.master_end = 0
        self.master_epoch = 0  # the master's epoch, as its chunks say (a promotion goes past it)
        self.connected = False
        self._caught_up_ms = clock_ms()
        self._error: str | None = None
        # Set on every (re)connection: the commits consumers made here while the master was away go back
        # to it at once (ReplicationService.HandBackOffsets; the mirror asks again while that fails). Not in
        # controller mode, where a replica takes no commits: its table is a copy, or a replaced master's
        # own, which may point past what the new master holds.
        self._hand_back = hand_back
        self._hand_back_due = False
        # Told on every (re)connection, as the hand-back is due: the queue locks granted here meanwhile go
        # (QueueHandover.master_reached).
        self._on_connected = on_connected
        # Whether the offsets here are a copy of this master's: not until the stream's first chunk (or the first
        # mirror) after start or a follow (before, they are what this broker had: a restart's file, a replaced
        # master's own).
        self.offsets_copied = False
        # Whether they are kept current now: the running stream brought the master's whole table (its first
        # chunk does) and brings every change since. Not while the stream is down: the master, or the same
        # master restarted under a new epoch, may take commits this copy never sees.
        # Whether the running stream brings the master's queue lock table, and its topics and groups (a master
        # older than those fields sends them with the metadata only): the mirror's copy, taken a moment
        # earlier, is then not kept.
        self.offsets_streamed = self.locks_streamed = self.config_streamed = False
        self._monotonic = monotonic
        self._last_chunk_at = monotonic()  # when the master's last chunk came (offsets_current)

    @property
    def offsets_current(self) -> bool:
        """Whether the offsets here are the master's as of a few heartbeats ago at most (copy_is_current says why)."""
        return copy_is_current(self.offsets_streamed, self._last_chunk_at, self._monotonic())

    def _stream_ended(self) -> None:
        """No stream runs (it broke, or the master changed): nothing here is kept current by one."""
        self.offsets_streamed = self.locks_streamed = self.config_streamed = False

    @property
    def lag_bytes(self) -> int:
        return max(0, self.master_end - self._store.commit_log_max_offset)

    @property
    def lag_ms(self) -> int:
        """Since when the replica has been behind (0 when caught up)."""
        return 0 if self.lag_bytes == 0 else self._clock_ms() - self._caught_up_ms

    def start(self) -> None:
        if self.state is not State.NEW:
            return
        self._channel = tls.peer_channel(self.master, self._tls_ca_file, _MASTER_CHANNEL_OPTIONS)
        self._stub = replication_pb2_grpc.ReplicationServiceStub(self._channel)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="replica-sync")
        self.state = State.RUNNING

    async def follow(self, master: str) -> None:
        """Copy from another master from now on: the stream to the old one ends, one to `master` starts (the
        hello's tail digest makes this log cut back to where the two agree)."""
        if master == self.master or self.state is not State.RUNNING:
            self.master = master
            return
        log.warning("following a new master: %s (was %s)", master, self.master, event="replica_follows",
                    master=master)
        self.master, self.offsets_copied = master, False
        self._stream_ended()
        await cancel_and_wait(self._task)
        old, self._channel = self._channel, tls.peer_channel(master, self._tls_ca_file, _MASTER_CHANNEL_OPTIONS)
        self._stub = replication_pb2_grpc.ReplicationServiceStub(self._channel)
        self.connected = False
        self._task = asyncio.get_running_loop().create_task(self._run(), name="replica-sync")
        await old.close()

    async def stop(self) -> None:
        if self.state is not State.RUNNING:
            self.state = State.STOPPED
            return
        self.state = State.STOPPED
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._channel.close()

    async def _run(self) -> None:
        retry_s = FIRST_RETRY_S
        while self.state is State.RUNNING:
            try:
                await self._stream()
            except (grpc.RpcError, StoreError) as e:
                why = f"{e.code().name}: {e.details()}" if isinstance(e, grpc.RpcError) else str(e)
                if why != self._error:
                    log.warning("replication from %s interrupted: %s", self.master, why,
                                event="replication_interrupted", master=self.master)
                    self._error = why
            except Exception:
                log.exception("replication failed", event="replication_failed", master=self.master)
            retry_s = next_retry_s(retry_s, self.connected)
            self.connected = False
            self._stream_ended()
            await asyncio.sleep(retry_s)
            await self._channel.channel_ready()  # the master reachable again (the channel's backoff paces it)

    async def _stream(self) -> None:
        call = self._stub.Replicate(metadata=self._signed())
        try:
            await self._copy(call)
        finally:
            # However the copy ended (a truncation, a failure, this task cancelled by stop() or follow()):
            # the call ends with it, or grpc.aio's task feeding its requests outlives the channel.
            call.cancel()

    async def _copy(self, call) -> None:
        store = self._store
        end, digest = store.commit_log_max_offset, store.commit_log.tail_digest(store.commit_log_max_offset)
        hello = replication_pb2.ReplicaProgress(commit_log_end=end, commit_log_min=store.commit_log_min_offset,
                                                **self._hello)
        if digest is not None:
            hello.tail_crc = digest
        if not await self._send(call, hello):
            return
        while (chunk := await self._next_chunk(call)) is not None:
            if chunk.probe:  # the master looks for where the logs part (divergence.py)
                if not await self._send(call, replication_pb2.ReplicaProgress(
                        commit_log_end=end, probe_crc=record_digests(store.commit_log, chunk.probe), **self._hello)):
                    return
                continue
            if not self.connected:
                self._hand_back_due = self._hand_back
                try:
                    await self._hand_back_now()
                except grpc.RpcError:
                    pass  # (the mirror's timer asks again)
                self.connected, self._error = True, None
                log.info("replicating from master", event="replication_connected", master=self.master,
                         offset=store.commit_log_max_offset)
                self._on_connected()
            if chunk.HasField("truncate_to"):
                await store.truncate_to(chunk.truncate_to)
                return  # and ask again from there
            self._follow_state(chunk)
            if chunk.topics_json:
                await self._follow_config(chunk.topics_json, chunk.groups_json)
                self.config_streamed = True
                # The first chunk brings the master's topics with its offset table: the offsets here are its.
                self.offsets_copied = self.offsets_copied or self.offsets_streamed
            if chunk.data:
                written = store.append_replicated(chunk.offset, chunk.data)
                if any(self._topics.get(topic) is None for topic, _ in written):
                    await self.mirror_metadata()  # a new topic: readable here as soon as its messages are
            self.master_end = chunk.master_end
            self.master_epoch = max(self.master_epoch, chunk.master_epoch)
            if store.commit_log_max_offset >= self.master_end:
                self._caught_up_ms = self._clock_ms()
            if not await self._send(call, replication_pb2.ReplicaProgress(
                    commit_log_end=store.commit_log_max_offset, **self._hello)):
                return

    async def _send(self, call, progress: replication_pb2.ReplicaProgress) -> bool:
        """Send progress to the master; False when the call ended under the write (a link reset between the
        last read and this write), which ends the copy as a broken stream does: logged as an interruption,
        and _run opens another call."""
        if await send_on(call, progress):
            return True
        why = "the stream ended under a write"
        if why != self._error:
            log.warning("replication from %s interrupted: %s", self.master, why,
                        event="replication_interrupted", master=self.master)
            self._error = why
        return False

    async def _next_chunk(self, call) -> replication_pb2.ReplicationChunk | None:
        """The master's next chunk; None when the stream ended, or went silent past SILENCE_S (the read's end
        cancels the call, and _run opens another, which goes on the same link once it carries bytes again)."""
        try:
            async with asyncio.timeout(SILENCE_S):  # (not wait_for: it can lose stop()'s cancellation, Election.keep)
                chunk = await call.read()
        except TimeoutError:
            why = f"no chunk from the master for {SILENCE_S:g} s"
            if why != self._error:
                log.warning("replication from %s interrupted: %s", self.master, why,
                            event="replication_interrupted", master=self.master)
                self._error = why
            return None
        if chunk is grpc.aio.EOF:
            return None
        self._last_chunk_at = self._monotonic()
        return chunk

    def _follow_state(self, chunk: replication_pb2.ReplicationChunk) -> None:
        """The master's producer table and offset changes that came with the chunk (before its records)."""
        try:
            if chunk.producer_state:
                self._producers.follow_state(json.loads(chunk.producer_state))
            if chunk.producer_events:
                self._producers.follow_events(decode_events(chunk.producer_events).items)
        except (ValueError, ProducerStateError) as e:
            log.warning("the master's producer state is unusable here: %s", e, event="producer_follow_failed")
        if chunk.offset_table:  # (offsets_copied waits for the topics too: the chunk's or the first mirror's)
            offsets = decode_offsets(chunk.offset_table)
            self._offsets.mirror(offsets.table, offsets.reset_generations)
            self.offsets_streamed = True
        if chunk.offset_records:
            self._offsets.mirror_records(decode_records(chunk.offset_records).items)
        if chunk.queue_locks:
            self._on_master_locks(chunk.queue_locks)
            self.locks_streamed = True

    async def _follow_config(self, topics_json: bytes, groups_json: bytes) -> None:
        """The master's topics and groups, whole: a topic it deleted goes here too, with its data."""
        before = {t.name for t in self._topics.list(include_system=True)}
        self._topics.mirror(json.loads(topics_json))
        for name in sorted(before - {t.name for t in self._topics.list(include_system=True)}):
            await self._on_topic_gone(name)
        self._groups.mirror(json.loads(groups_json))

    def _signed(self):
        return signed_metadata(self._credentials) if self._credentials is not None else None

    async def _hand_back_now(self) -> None:
        """Hand the commits consumers made here while the master was away back to it, when due: at once on
        a (re)connection, before the copy goes on (`_copy`), and again by the mirror while it fails. Not a
        second later by the mirror's timer: a reader back at the master meanwhile saw its older offsets (the
        fault checker's failover scenario, seed 21915: 201 read at the master 0.25 s after 224 at the
        replica, 1 s after the replica's connection). grpc.RpcError when the master cannot be asked."""
        if not self._hand_back_due:
            return
        table = self._offsets.table(well_named=True)
        answer = await self._stub.HandBackOffsets(replication_pb2.ReplicaMetadata(
            offsets_json=encode_offset_table(*table)), timeout=5, metadata=self._signed())
        self._hand_back_due = False
        if answer.advanced:
            log.info("offsets handed back to the master", event="offsets_handed_back",
                     entries=answer.advanced, master=self.master)

    async def mirror_metadata(self) -> None:
        """Copy the master's consumer offsets, delay and pop progress and (from a master that does not stream
        them) its topics, groups and queue locks: the 1 s timer's job."""
        if self.state is not State.RUNNING:
            return
        try:
            await self._hand_back_now()
            m = await self._stub.GetMetadata(replication_pb2.GetMetadataRequest(), timeout=5, metadata=self._signed())
        except grpc.RpcError:
            return  # the stream's log says the master is away
        if not self.config_streamed:
            await self._follow_config(m.topics_json, m.groups_json)
        self._schedule.mirror(dict(m.schedule_progress))
        if m.pop_state_json:
            try:
                self._pop.mirror(json.loads(m.pop_state_json), m.pop_secret)
            except (ValueError, PopStateError) as e:
                log.warning("the master's pop state is unusable here: %s", e, event="pop_mirror_failed")
        offsets = decode_offsets(m.offsets_json)
        self._offsets.mirror(offsets.table, offsets.reset_generations)
        self.offsets_copied = True
        if m.queue_locks_json and not self.locks_streamed:
            self._on_master_locks(m.queue_locks_json)
        await self._after_mirror()


async def send_on(call, message) -> bool:
    """Write one message on a grpc.aio stream; False when the call had already ended (grpc.aio raises
    InvalidStateError, "RPC already finished", for a call that a reset link or a cancellation ended between
    the caller's last read and this write: the stream's end, not a defect)."""
    try:
        await call.write(message)
    except asyncio.InvalidStateError:
        return False
    return True
