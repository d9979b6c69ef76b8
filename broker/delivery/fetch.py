"""FetchSession: one consumer's streaming pull from this broker, many queues on one stream.

The client opens queues on the stream (offset, filter, owner fence) and grants
credit per queue, in messages and bytes (its pull thresholds); the broker
pushes frames of stored records, as stored, whenever a queue it serves has
both data and credit, and waits on the queue otherwise (long polling without a
timeout). A frame gathers up to FRAME_BYTES from the ready queues in turn, at
most a handle's batch size at a time, so queues interleave as they would with
RocketMQ's pulls of 32.

Each pass over a queue re-checks what may change under a stream: permissions,
the topic, the owner fence and the reset generation (QueueReadAccess). A queue
ends on the stream, with the offset to continue from, when its offset is
illegal, an admin reset happened (OFFSET_RESET with the new generation), its
lock went to another client (FencedError) or a check fails; the client opens
it again with a new handle. A commit rides on a credit frame and is fenced
like a streamed commit: forward only, refused once the owner changed.

A handover's new owner may open a queue before its lock is granted (`after_lock`):
the handle waits, woken as the queue's lock changes hands, until the client
holds the lock, then starts at the group's committed offset as of the grant
(the one its LockQueues answer told), under the grant's fence (QueueStarted,
in the frame that carries its first records). The
records then leave with the grant instead of after the grant's answer, the
client's open and a second pass here. A queue without a committed offset ends
the handle (FAILED_PRECONDITION): where it starts is the client's rule
(consume_from_where), and it opens the queue as usual. Whether it starts is
decided at the grant (the waiters call back as the lock changes hands), where
and under which fence at the next frame, from the grant the client holds then
(the broker keeps each live grant's offset: handover.py): a client that let the
lock go by then (a quick rebalance back, a lease that could not start) gets the
handle's end (FencedError) instead of a handle that waits for a lock it already
had, for as long as the stream lasts. While it waits, records stored do not
wake the stream.

Pure domain module: no grpc. Runs on the event-loop thread.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tidemark.broker.delivery.pull import QueueReadAccess, is_stale
from tidemark.broker.delivery.waiters import QueueWaiters
from tidemark.broker.errors import (
    BrokerError,
    FailedPreconditionError,
    FencedError,
    InvalidArgumentError,
    StaleResetGenerationError,
    StoreError,
)
from tidemark.broker.offsets import Fence
from tidemark.broker.offsets.commits import OffsetCommitService
from tidemark.broker.store import GetStatus, MessageStore
from tidemark.common.logs import get_logger
from tidemark.common.protocol import ExpressionType

log = get_logger("tidemark.broker.delivery.fetch")

# A frame stops growing past this many record bytes (it always holds at least one record).
FRAME_BYTES = 256 * 1024
# Records read per queue per pass at most (a handle may ask for fewer), and consume-queue entries
# examined when filtering.
MAX_RECORDS_PER_READ = 1024
MAX_SCAN = 4000
# Entries examined per read with an SQL92 filter (each one's properties decoded and evaluated).
MAX_SCAN_PROPERTIES = 1000
MAX_CREDIT = 2**62


class EndReason(enum.Enum):
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"  # continue from next_offset
    OFFSET_RESET = "OFFSET_RESET"  # an admin reset: continue from next_offset with reset_generation
    ERROR = "ERROR"  # `error` says why (fenced, not found, permission...)


@dataclass(frozen=True, slots=True)
class OpenQueue:
    handle: int
    group: str
    topic: str
    queue_id: int
    offset: int
    subscription: str = "*"
    fence: Fence | None = None
    credit_messages: int = 0
    credit_bytes: int = 0
    batch_size: int = MAX_RECORDS_PER_READ
    expression_type: str = ExpressionType.TAG
    # Start once the fence's client holds the queue's lock, at the committed offset (`offset` and the
    # fence's epoch are ignored).
    after_lock: bool = False


@dataclass(frozen=True, slots=True)
class QueueStarted:
    """Where an after_lock handle started: the committed offset and the fence of the grant it serves."""

    handle: int
    offset: int
    owner_epoch: int
    reset_generation: int


@dataclass(frozen=True, slots=True)
class QueueRecords:
    """Records of one queue (count may be 0: the scan moved past filtered entries)."""

    handle: int
    topic: str
    count: int
    data: bytes
    next_offset: int
    max_offset: int
    group: str = ""  # the group reading (metrics count delivered bytes per group)
    # Where the read started (the first record is there or, past filtered entries, later) and for whom: the
    # broker's record of deliveries (broker/observe/journey.py).
    queue_id: int = -1
    first_offset: int = -1
    client_id: str = ""


@dataclass(frozen=True, slots=True)
class QueueEnded:
    handle: int
    reason: EndReason
    next_offset: int = 0
    reset_generation: int = 0
    error: BrokerError | None = None


@dataclass(slots=True)
class Frame:
    records: list[QueueRecords] = field(default_factory=list)
    ended: list[QueueEnded] = field(default_factory=list)
    started: list[QueueStarted] = field(default_factory=list)  # (before the records of the same handles)

    def __bool__(self) -> bool:
        return bool(self.records or self.ended or self.started)


@dataclass(eq=False, slots=True)
class _Served:
    """A queue open on the stream."""

    handle: int
    group: str
    topic: str
    queue_id: int
    offset: int
    codes: frozenset[int] | None
    # SQL92: the broker's exact check of each record's properties (tags are checked exactly by the client).
    properties: Callable[[Mapping[str, str]], bool] | None
    fence: Fence | None
    credit_messages: int
    credit_bytes: int
    batch_size: int
    reported: int  # the offset the client last heard of
    ready: bool = True  # may have something to send
    unwatch: Callable[[], None] = lambda: None
    awaiting: str = ""  # after_lock: the client whose lock starts the reading ("" once started, or never)
    granted: bool = False  # after_lock: its client was granted the lock (it starts, or ends, at the next frame)

    def has_credit(self) -> bool:
        return self.credit_messages > 0 and self.credit_bytes > 0


class FetchSession:
    def __init__(self, *, store: MessageStore, access: QueueReadAccess, commits: OffsetCommitService,
                 hold: QueueWaiters, frame_bytes: int = FRAME_BYTES,
                 on_commit: Callable[[], None] = lambda: None) -> None:
        self._store = store
        self._on_commit = on_commit  # a piggybacked commit was applied (for metrics)
        self._access = access
        self._commits = commits
        self._hold = hold
        self._frame_bytes = frame_bytes
        self._served: dict[int, _Served] = {}
        self._ended: list[QueueEnded] = []
        self._wakeup = asyncio.Event()
        self._finished = False
        self._cursor = 0  # round-robin start among served queues
        self._scanned = False  # the last build scanned past filtered entries and has more to scan
        self._started: list[QueueStarted] = []  # the frame being built's (after_lock handles started)

    # -- requests from the client ------------------------------------------------------------

    def open(self, req: OpenQueue) -> None:
        """Start serving a queue; a refusal is reported as QueueEnded in the next frame."""
        try:
            if req.handle in self._served:
                raise InvalidArgumentError(f"handle {req.handle} is already open on this stream")
            if req.credit_messages < 0 or req.credit_bytes < 0:
                raise InvalidArgumentError("credit must be >= 0")
            if not 1 <= req.batch_size <= MAX_RECORDS_PER_READ:
                raise InvalidArgumentError(f"batch_size must be between 1 and {MAX_RECORDS_PER_READ}, "
                                           f"got {req.batch_size}")
            if req.after_lock and not (req.group and req.fence is not None and req.fence.client_id):
                raise InvalidArgumentError("after_lock needs a group and a fence naming the client")
            # (after_lock: the fence and offset are those of the grant, checked when it starts)
            grant = self._access.check(req.group, req.topic, req.queue_id, 0 if req.after_lock else req.offset,
                                       req.subscription, None if req.after_lock else req.fence,
                                       req.expression_type)
        except BrokerError as e:
            self._end(QueueEnded(req.handle, EndReason.ERROR, error=e))
            return
        expression = grant.expression
        exact = expression.matches_properties if expression.expression_type == ExpressionType.SQL92 else None
        served = _Served(req.handle, req.group, req.topic, req.queue_id, req.offset, expression.code_filter, exact,
                         req.fence,
                         min(req.credit_messages, MAX_CREDIT), min(req.credit_bytes, MAX_CREDIT), req.batch_size,
                         req.offset)
        self._served[req.handle] = served
        if req.after_lock:
            served.fence, served.awaiting = None, req.fence.client_id
            served.unwatch = self._hold.watch(req.topic, req.queue_id, lambda: self._lock_changed(served))
            self._lock_changed(served)  # (the grant may have come first)
            return
        if is_stale(req.fence, grant.generation):
            self._reset(served, grant.generation)
            return
        served.unwatch = self._hold.watch(req.topic, req.queue_id, lambda: self._wake(served))
        self._wakeup.set()

    def credit(self, handle: int, messages: int, nbytes: int, commit_offset: int | None = None) -> None:
        """More room at the client for a queue, and maybe a commit of its progress."""
        served = self._served.get(handle)
        if served is None:
            return  # ended meanwhile; the client learns it from the QueueEnded already sent
        if messages < 0 or nbytes < 0:
            self._drop(served, QueueEnded(handle, EndReason.ERROR,
                                          error=InvalidArgumentError("credit must be >= 0")))
            return
        served.credit_messages = min(served.credit_messages + messages, MAX_CREDIT)
        served.credit_bytes = min(served.credit_bytes + nbytes, MAX_CREDIT)
        if served.awaiting:
            commit_offset = None  # nothing read yet, and no grant's fence to quote
        if commit_offset is not None and served.group and not self._commit(served, commit_offset):
            return
        self._wake(served)

    def close_queue(self, handle: int) -> None:
        served = self._served.pop(handle, None)
        if served is not None:
            served.unwatch()

    def finish(self) -> None:
        """The client is done (half-close or broken stream): next_frame ends after what is pending."""
        self._finished = True
        self._wakeup.set()

    def close(self) -> None:
        """Stop serving everything (the stream ended)."""
        self._finished = True
        for served in self._served.values():
            served.unwatch()
        self._served.clear()
        self._wakeup.set()

    @property
    def open_queues(self) -> int:
        return len(self._served)

    # -- frames to the client ----------------------------------------------------------------

    async def next_frame(self) -> Frame | None:
        """The next frame to send; waits until there is one. None once finished."""
        while True:
            frame = self._build()
            if frame:
                return frame
            if self._finished:
                return None
            if self._scanned:
                # Filtered entries only, and more to scan: let the loop breathe, then go on.
                await asyncio.sleep(0)
                continue
            self._wakeup.clear()
            await self._wakeup.wait()

    def _build(self) -> Frame:
        frame = Frame(ended=self._ended)
        self._ended = []
        self._started = frame.started
        if self._finished:
            return frame
        # Passes over the ready queues, each reading up to its batch size, until the frame is full or
        # nothing more is ready: queues take turns within a frame as well as across frames.
        budget = self._frame_bytes
        self._scanned = False
        while budget > 0:
            served = [q for q in self._served.values() if q.ready and q.has_credit()]
            if not served:
                break
            n = len(served)
            start = self._cursor % n
            progressed = False
            for i in range(n):
                if budget <= 0:
                    break
                q = served[(start + i) % n]
                if q.handle not in self._served:
                    continue
                before = q.offset
                part = self._serve(q, budget)
                if part is not None:
                    frame.records.append(part)
                    budget -= len(part.data)
                    progressed = True
                elif q.offset != before and q.ready:
                    self._scanned = True  # a scan limit stopped a read that matched nothing yet
                self._cursor = start + i + 1
            if not progressed:
                break
        frame.ended.extend(self._ended)
        self._ended = []
        return frame

    def _serve(self, q: _Served, budget: int) -> QueueRecords | None:
        if q.awaiting and not (q.granted and self._lock_started(q)):
            q.ready = False  # (credit came while it waits) woken by its grant: _lock_changed
            return None
        try:
            generation = self._access.recheck(q.group, q.topic, q.queue_id, q.fence)
        except BrokerError as e:
            self._drop(q, QueueEnded(q.handle, EndReason.ERROR, error=e))
            return None
        if is_stale(q.fence, generation):
            self._reset(q, generation)
            return None
        start = q.offset
        read = self._store.read_records(q.topic, q.queue_id, q.offset,
                                        max_count=min(q.credit_messages, q.batch_size),
                                        max_bytes=min(q.credit_bytes, budget), tags_codes=q.codes,
                                        properties_filter=q.properties,
                                        max_scan=MAX_SCAN if q.properties is None else MAX_SCAN_PROPERTIES)
        status = read.status
        if status is GetStatus.FOUND or status is GetStatus.NO_MATCHED_MESSAGE:
            q.offset = read.next_offset
            # More may be there (a byte, count or scan limit stopped the read); else wait for a notify.
            q.ready = read.next_offset < read.max_offset
            if not read.count and (q.ready or q.offset == q.reported):
                return None  # filtered entries only: tell the client once the scan caught up
            q.credit_messages -= read.count
            q.credit_bytes -= len(read.data)
            q.reported = q.offset
            return QueueRecords(q.handle, q.topic, read.count, read.data, read.next_offset, read.max_offset,
                                q.group, q.queue_id, start, q.fence.client_id if q.fence else "")
        if status is GetStatus.OFFSET_OVERFLOW_ONE or (
                status is GetStatus.NO_MESSAGE_IN_QUEUE and q.offset == read.max_offset):
            q.ready = False
            return None
        # Too small, too large, or a queue that holds nothing below the offset asked for.
        self._drop(q, QueueEnded(q.handle, EndReason.OFFSET_ILLEGAL, next_offset=read.next_offset))
        log.info("fetch offset illegal",
                 event="fetch_offset_illegal", topic=q.topic, queue_id=q.queue_id, offset=q.offset,
                 next=read.next_offset, min=read.min_offset, max=read.max_offset)
        return None

    # -- helpers -----------------------------------------------------------------------------

    def _lock_changed(self, q: _Served) -> None:
        """An after_lock queue changed (a record stored, its lock changing hands): while it waits, only a
        grant to its client wakes it, and marks it to start at the next frame, whoever holds the lock by
        then (a grant let go before the stream started it must not leave the handle waiting)."""
        if q.awaiting and not q.granted:
            if self._access.lock_start(q.group, q.topic, q.queue_id, q.awaiting) is None:
                return
            q.granted = True
        self._wake(q)

    def _lock_started(self, q: _Served) -> bool:
        """An after_lock queue its client was granted: start it if the client holds the lock still, under the
        fence of the grant it holds now, at the committed offset as of that grant; else end it (the lock was
        let go).

        As of the grant, not as of this frame (QueueReadAccess.lock_start): that offset is the one the
        LockQueues answer told the client, whose lease takes this handle over only if it starts there. The
        new owner may commit before this frame, or before this handle's open reaches the broker (a queue
        without a committed offset: its start offset, told at once, on a unary call); started at that
        commit, the handle served a queue the client then read again on a handle of its own. And the grant
        it holds now, not the first one this handle saw: let go and granted again under the same epoch,
        the client was told the second grant's offset."""
        start = self._access.lock_start(q.group, q.topic, q.queue_id, q.awaiting)
        if start is None:
            self._drop(q, QueueEnded(q.handle, EndReason.ERROR, error=FencedError(
                f"queue {q.topic}:{q.queue_id} of group {q.group!r}: client {q.awaiting!r} was granted its lock "
                f"and let it go before this stream started it; lock it again and open it")))
            return False
        offset, fence = start
        if offset < 0:
            self._drop(q, QueueEnded(q.handle, EndReason.ERROR, error=FailedPreconditionError(
                f"queue {q.topic}:{q.queue_id} of group {q.group!r} has no committed offset: where it starts "
                f"is the client's rule; open it with an offset")))
            return False
        q.offset = q.reported = offset
        q.fence, q.awaiting = fence, ""
        self._started.append(QueueStarted(q.handle, offset, fence.owner_epoch, fence.reset_generation))
        return True

    def _commit(self, q: _Served, offset: int) -> bool:
        """Apply a piggybacked commit; False when it ended the queue."""
        try:
            self._commits.commit(q.group, q.topic, q.queue_id, offset, q.fence)
            self._on_commit()
        except FencedError as e:
            self._drop(q, QueueEnded(q.handle, EndReason.ERROR, error=e))
            return False
        except StaleResetGenerationError:
            self._reset(q, self._access.generation(q.group, q.topic, q.queue_id))
            return False
        except InvalidArgumentError as e:
            # As RocketMQ with a bad piggybacked commit: dropped, the queue is still served.
            log.info("piggybacked commit ignored",
                     event="piggyback_commit_ignored", group=q.group, topic=q.topic, queue_id=q.queue_id,
                     offset=offset, error=e)
        except StoreError:
            # The offset journal cannot take it (a full disk): not applied, and the queue is still served.
            # The offsets manager says so once (and health turns NOT_SERVING); the client's next credit
            # carries the offset again, so nothing is lost but the commit's timeliness.
            pass
        return True

    def _reset(self, q: _Served, generation: int) -> None:
        offset = self._access.reset_offset(q.group, q.topic, q.queue_id)
        self._drop(q, QueueEnded(q.handle, EndReason.OFFSET_RESET, next_offset=offset,
                                 reset_generation=generation))

    def _wake(self, q: _Served) -> None:
        q.ready = True
        self._wakeup.set()

    def _drop(self, q: _Served, ended: QueueEnded) -> None:
        self.close_queue(q.handle)
        self._end(ended)

    def _end(self, ended: QueueEnded) -> None:
        self._ended.append(ended)
        self._wakeup.set()
