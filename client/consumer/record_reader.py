"""RecordReader: a range of one queue as stored record bytes, for bulk decoders (the Spark connector).

No group, no commits, no message objects: the reader opens the queue on its
broker's Fetch stream without a group and hands out each frame's records as
they came (tidemark.common.records layout), for a decoder that turns whole frames
into columns. Reading stops at the range's end; records past it in the last
frame are left to the caller to trim (a frame may carry more when offsets
below the range's start were deleted and the broker skipped them).

Flow control: the broker may send up to WINDOW_BYTES that the caller has not
taken yet; the bytes of the chunks taken are given back in steps of
CREDIT_STEP_BYTES (a quarter of the window, so the broker can still send three
quarters of a window ahead of the caller): one credit message per step instead
of one per chunk, which cost a Spark task's reader about a tenth of its time.

Reading ahead: `read(..., then=(mq, start, end))` names the range the caller
reads next. Once the broker has sent the current range's last records, the
reader opens the next range on the same stream (when its broker's stream is
open), so its first window fills while the caller still converts the current
one; the next `read` of exactly that range takes it over. A read of another
range, or `discard_ahead()`, closes it. The range opened ahead gets a quarter of
a window (AHEAD_WINDOW_BYTES) until its read takes it over, so a reader holds at
most WINDOW_BYTES + AHEAD_WINDOW_BYTES (40 MiB) of records not taken yet.

Moves: a reader may live long (a Spark worker keeps one from task to task).
When its cluster learns that another address serves a broker name (a master
elected or back, a replica standing in), the stream to the old address is
dropped and the reads on it reopen at the new one (a stream may stand silent
on a paused or fenced master, which no error would end); `refresh()` asks
where each broker with a stream is served now and drops the streams whose
address changed.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

from tidemark.client.errors import ClientStateError, TidemarkError, UnavailableError
from tidemark.client.message import MessageQueue
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.client.remoting.streams import FetchStream, QueueEnd
from tidemark.client.runtime import BlockingClient, ClientState, Lifecycle, LoopThread
from tidemark.client.settings import ClientSettings, build
from tidemark.common.backoff import Backoff
from tidemark.common.logs import get_logger

log = get_logger("tidemark.client")

WINDOW_BYTES = 32 * 1024 * 1024
CREDIT_STEP_BYTES = WINDOW_BYTES // 4
AHEAD_WINDOW_BYTES = WINDOW_BYTES // 4  # a range opened ahead, until its read takes it over
# Before opening a queue again after its broker could not be reached or its stream broke.
REOPEN = Backoff(first_s=0.1, max_s=3.0)
MAX_RECORDS_PER_FRAME_PART = 1024


@dataclass(frozen=True, slots=True)
class RecordChunk:
    """Records of one queue back to back, and where the queue's reading continues after them."""

    data: bytes
    count: int
    next_offset: int
    max_offset: int


@dataclass(slots=True)
class _Read:
    """One open handle: where its chunks go, and the range to open once its last records arrived."""

    out: queue.Queue
    stream: FetchStream
    end: int
    then: tuple[MessageQueue, int, int] | None = None
    received: int = -1  # where the records received so far end


class RecordReader(BlockingClient):
    """Synchronous; one range at a time. `with RecordReader(brokers=...) as r: for c in r.read(mq, a, b): ...`"""

    def __init__(self, settings: ClientSettings | None = None, /, **overrides: Any) -> None:
        self.settings: ClientSettings = build(ClientSettings, settings, overrides)  # type: ignore[assignment]
        self._loop = LoopThread("record-reader")
        self._life = Lifecycle("record reader")
        self._cluster: BrokerCluster | None = None
        self._streams: dict[str, FetchStream] = {}
        self._next_handle = 0
        self._reads: dict[int, _Read] = {}  # open handles (loop side)
        # A range opened ahead of its read: (mq, start, end) and its handle (loop side).
        self._ahead: tuple[tuple[MessageQueue, int, int], int] | None = None
        self._closing: set[asyncio.Task] = set()  # streams dropped after a move, closing (loop side)

    def start(self) -> RecordReader:
        s = self.settings

        async def connect() -> None:
            cluster = await BrokerCluster.connect(s)
            cluster.moves.listen(self._moved)  # cleared by cluster.close()
            self._cluster = cluster  # (shutdown's to close, once started)

        self._start_core(connect, timeout=s.request_timeout_s * 2)
        return self

    @property
    def running(self) -> bool:
        """Started and not shut down: reads can be made."""
        return self._life.state is ClientState.RUNNING

    def shutdown(self) -> None:
        self._stop_core()

    def _core_stop(self) -> tuple[Callable[[], Coroutine[Any, Any, Any]], float]:
        async def close() -> None:
            await asyncio.gather(*(s.close() for s in self._streams.values()), *self._closing,
                                 return_exceptions=True)
            await self._cluster.close()

        return close, self.settings.request_timeout_s + 5

    def read(self, mq: MessageQueue, start: int, end: int, *, poll_timeout_s: float,
             then: tuple[MessageQueue, int, int] | None = None) -> Iterator[RecordChunk | None]:
        """Chunks of [start, end) in offset order; None when nothing came for poll_timeout_s (the caller
        decides whether that is data loss). Raises the broker's error if it refuses the queue; an
        OFFSET_ILLEGAL end (the range is gone) is raised as QueueEndedError. `then`: the range
        (mq, start, end) the caller reads next, opened ahead (see the module doc).

        A broker that cannot be reached or whose stream breaks (a restart) is not an error: the read
        opens the queue again from where it got, after a backoff (REOPEN: 0.1 s doubling up to
        3 s), for as long as the caller keeps iterating; it yields None meanwhile."""
        self._life.require(ClientState.RUNNING, action="read")
        reached = start
        failures = 0
        while reached < end:
            try:
                handle, out = self._loop.run(self._open(mq, reached, end, then),
                                             timeout=self.settings.request_timeout_s * 2)
            except TidemarkError as e:
                if not e.retriable:
                    raise
                failures += 1
                yield from _pause(failures)
                continue
            owed = 0  # bytes taken and not yet given back to this handle
            try:
                while reached < end:
                    try:
                        item = out.get(timeout=poll_timeout_s)
                    except queue.Empty:
                        yield None
                        continue
                    if isinstance(item, QueueEnd):
                        if item.error is not None and not item.error.retriable:
                            raise item.error
                        if item.error is None:
                            raise QueueEndedError(item.status, item.next_offset)
                        break
                    if isinstance(item, TidemarkError):
                        if not item.retriable:
                            raise item
                        break  # the stream broke: open the queue again from `reached`
                    reached = item.next_offset
                    failures = 0
                    yield item
                    owed += len(item.data)
                    if owed >= CREDIT_STEP_BYTES:
                        self._loop.loop.call_soon_threadsafe(self._give_back, mq.broker_name, handle, owed)
                        owed = 0
            finally:
                self._close_soon(mq.broker_name, handle)
            if reached < end:
                failures += 1
                yield from _pause(failures)

    def idle(self) -> bool:
        """No read handle open and no range opened ahead, once the closes asked for so far are done."""
        async def check() -> bool:  # queued after those closes (the loop runs callbacks in order)
            return not self._reads and self._ahead is None

        return self._loop.run(check(), timeout=self.settings.request_timeout_s)

    def refresh(self) -> None:
        """Ask where each broker with a fetch stream is served now (a failed-over master that answers
        again, a new master named by the name servers) and drop the streams whose address changed: the
        next read opens its broker's stream where it is served now. A reader kept between tasks calls
        this before each task."""
        self._loop.run(self._refresh(), timeout=self.settings.request_timeout_s * 2)

    def discard_ahead(self) -> None:
        """Close the range opened ahead of a read that will not come (the caller stopped early)."""
        self._close_soon("", 0)

    def _close_soon(self, broker: str, handle: int) -> None:
        """Close the read's handle on the loop. A read left unfinished can be closed by the garbage
        collector after shutdown(), which closed its stream already: nothing is left to close then."""
        try:
            self._loop.loop.call_soon_threadsafe(self._close, broker, handle)
        except (ClientStateError, RuntimeError):  # no loop any more / a loop that closed meanwhile
            pass

    # -- loop side ---------------------------------------------------------------------------

    async def _open(self, mq: MessageQueue, start: int, end: int, then: tuple[MessageQueue, int, int] | None
                    ) -> tuple[int, queue.Queue]:
        """The handle reading [start, end) and its chunks' queue: the one opened ahead for exactly this
        range, else a new one (closing a range opened ahead for another read)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            wanted, handle = ahead
            read = self._reads.get(handle)
            if wanted == (mq, start, end) and read is not None:
                if read.stream.usable:  # the rest of a whole window, now that the read takes it over
                    read.stream.credit(handle, 0, WINDOW_BYTES - AHEAD_WINDOW_BYTES)
                if then is not None and read.received >= end:  # its last records came already
                    self._open_ahead(then)
                else:
                    read.then = then
                return handle, read.out
            self._close(wanted[0].broker_name, handle)
        stream = self._streams.get(mq.broker_name)
        if stream is None or not stream.usable:
            conn = await self._cluster.connection(mq.broker_name)
            holder: list[FetchStream] = []
            stream = conn.open_fetch_stream(on_records=self._on_records, on_ended=self._on_ended,
                                            on_broken=lambda error: self._on_broken(holder[0], error))
            holder.append(stream)
            self._streams[mq.broker_name] = stream
        return self._open_on(stream, mq, start, end, then)

    def _open_on(self, stream: FetchStream, mq: MessageQueue, start: int, end: int,
                 then: tuple[MessageQueue, int, int] | None, window: int = WINDOW_BYTES) -> tuple[int, queue.Queue]:
        self._next_handle += 1
        handle = self._next_handle
        read = _Read(queue.Queue(), stream, end, then)
        self._reads[handle] = read
        stream.open_queue(handle, "", mq, start, subscription="*", fence=None,
                          credit_messages=max(end - start, 1), credit_bytes=window,
                          batch_size=MAX_RECORDS_PER_FRAME_PART)
        return handle, read.out

    def _open_ahead(self, then: tuple[MessageQueue, int, int]) -> None:
        """Open the next range now, if its broker's stream is open already (no connecting from a callback;
        the read opens it as usual otherwise)."""
        mq, start, end = then
        stream = self._streams.get(mq.broker_name)
        if self._ahead is not None or stream is None or not stream.usable or end <= start:
            return
        handle, _ = self._open_on(stream, mq, start, end, None, AHEAD_WINDOW_BYTES)
        self._ahead = (then, handle)

    def _on_records(self, handle: int, count: int, data: bytes, next_offset: int, max_offset: int) -> None:
        read = self._reads.get(handle)
        if read is None:
            return
        read.out.put(RecordChunk(data, count, next_offset, max_offset))
        read.received = next_offset
        if read.then is not None and next_offset >= read.end:  # the broker sent this range's last records
            then, read.then = read.then, None
            self._open_ahead(then)

    def _on_ended(self, handle: int, end: QueueEnd) -> None:
        read = self._reads.get(handle)
        if read is not None:
            read.out.put(end)

    def _on_broken(self, stream: FetchStream, error: TidemarkError) -> None:
        for read in self._reads.values():  # the reads on the stream that broke (one open ahead among them)
            if read.stream is stream:
                read.out.put(error)

    def _moved(self, broker: str, address: str) -> None:
        """The cluster learnt that `address` serves `broker` now: a stream elsewhere is dropped."""
        stream = self._streams.get(broker)
        if stream is not None and stream.address != address:
            self._drop(broker, stream)

    async def _refresh(self) -> None:
        if not self._streams:
            return
        try:
            if self._cluster.namesrv is not None:
                await self._cluster.discover(refresh=True)  # a new master named: `_moved` drops its stream
            for broker, stream in list(self._streams.items()):
                conn = await self._cluster.connection(broker)  # a failed-over master probed again
                if conn.address != stream.address and self._streams.get(broker) is stream:
                    self._drop(broker, stream)
        except TidemarkError as e:  # nobody to ask now: the reads find out themselves
            log.debug("fetch streams not checked", event="record_reader_refresh_skipped", error=e)

    def _drop(self, broker: str, stream: FetchStream) -> None:
        """Another address serves `broker`: its reads reopen there (from where they got), the stream closes."""
        del self._streams[broker]
        self._on_broken(stream, UnavailableError(f"broker {broker} is served at another address now; "
                                                 f"{stream.address} is left"))
        task = asyncio.get_running_loop().create_task(stream.close(), name=f"record-reader-drop:{stream.address}")
        self._closing.add(task)
        task.add_done_callback(self._closed_dropped)

    def _closed_dropped(self, task: asyncio.Task) -> None:
        self._closing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("a dropped fetch stream failed to close", event="record_reader_drop_failed",
                        error=task.exception())

    def _give_back(self, broker: str, handle: int, nbytes: int) -> None:
        read = self._reads.get(handle)
        if read is not None and read.stream.usable:
            read.stream.credit(handle, 0, nbytes)

    def _close(self, broker: str, handle: int) -> None:
        """Close a read's handle; handle 0: the range opened ahead, if any."""
        if handle == 0:
            if self._ahead is None:
                return
            handle, self._ahead = self._ahead[1], None
        read = self._reads.pop(handle, None)
        if read is not None and read.stream.usable:
            read.stream.close_queue(handle)


def _pause(failures: int) -> Iterator[None]:
    """Back off before opening a queue again (the caller sees one None: nothing came meanwhile)."""
    time.sleep(REOPEN.delay(failures - 1))
    yield None


class QueueEndedError(TidemarkError):
    """The broker stopped serving the range: its offset is illegal now (deleted or re-created queue)."""

    def __init__(self, status: str, next_offset: int) -> None:
        super().__init__(f"the broker ended the read with {status}; the queue continues at {next_offset}")
        self.status = status
        self.next_offset = next_offset


__all__ = ["QueueEndedError", "RecordChunk", "RecordReader"]
