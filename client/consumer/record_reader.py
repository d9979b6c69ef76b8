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
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tidemark.client.errors import ClientStateError, TidemarkError
from tidemark.client.message import MessageQueue
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.client.remoting.streams import FetchStream, QueueEnd
from tidemark.client.runtime import BlockingClient, ClientState, Lifecycle, LoopThread
from tidemark.client.settings import ClientSettings, build
from tidemark.common.backoff import Backoff

WINDOW_BYTES = 32 * 1024 * 1024
CREDIT_STEP_BYTES = WINDOW_BYTES // 4
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


class RecordReader(BlockingClient):
    """Synchronous; one range at a time. `with RecordReader(brokers=...) as r: for c in r.read(mq, a, b): ...`"""

    def __init__(self, settings: ClientSettings | None = None, /, **overrides: Any) -> None:
        self.settings: ClientSettings = build(ClientSettings, settings, overrides)  # type: ignore[assignment]
        self._loop = LoopThread("record-reader")
        self._life = Lifecycle("record reader")
        self._cluster: BrokerCluster | None = None
        self._streams: dict[str, FetchStream] = {}
        self._next_handle = 0
        self._out: queue.Queue[RecordChunk | QueueEnd | TidemarkError] | None = None
        self._handle = 0
        self._broker = ""  # the broker of the current read

    def start(self) -> RecordReader:
        s = self.settings
        self._cluster = self._start_core(lambda: BrokerCluster.connect(s), timeout=s.request_timeout_s * 2)
        return self

    def shutdown(self) -> None:
        async def close() -> None:
            await asyncio.gather(*(s.close() for s in self._streams.values()), return_exceptions=True)
            await self._cluster.close()

        self._stop_core(close, timeout=self.settings.request_timeout_s + 5)

    def read(self, mq: MessageQueue, start: int, end: int, *, poll_timeout_s: float
             ) -> Iterator[RecordChunk | None]:
        """Chunks of [start, end) in offset order; None when nothing came for poll_timeout_s (the caller
        decides whether that is data loss). Raises the broker's error if it refuses the queue; an
        OFFSET_ILLEGAL end (the range is gone) is raised as QueueEndedError.

        A broker that cannot be reached or whose stream breaks (a restart) is not an error: the read
        opens the queue again from where it got, after a backoff (REOPEN: 0.1 s doubling up to
        3 s), for as long as the caller keeps iterating; it yields None meanwhile."""
        self._life.require(ClientState.RUNNING, action="read")
        reached = start
        failures = 0
        while reached < end:
            out: queue.Queue = queue.Queue()
            try:
                handle = self._loop.run(self._open(mq, reached, end - reached, out),
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

    def _close_soon(self, broker: str, handle: int) -> None:
        """Close the read's handle on the loop. A read left unfinished can be closed by the garbage
        collector after shutdown(), which closed its stream already: nothing is left to close then."""
        try:
            self._loop.loop.call_soon_threadsafe(self._close, broker, handle)
        except (ClientStateError, RuntimeError):  # no loop any more / a loop that closed meanwhile
            pass

    # -- loop side ---------------------------------------------------------------------------

    async def _open(self, mq: MessageQueue, start: int, count: int, out: queue.Queue) -> int:
        stream = self._streams.get(mq.broker_name)
        if stream is None or not stream.usable:
            conn = await self._cluster.connection(mq.broker_name)
            broker = mq.broker_name
            stream = conn.open_fetch_stream(on_records=self._on_records, on_ended=self._on_ended,
                                            on_broken=lambda error: self._on_broken(broker, error))
            self._streams[broker] = stream
        self._next_handle += 1
        self._handle = self._next_handle
        self._out = out
        self._broker = mq.broker_name
        stream.open_queue(self._handle, "", mq, start, subscription="*", fence=None,
                          credit_messages=max(count, 1), credit_bytes=WINDOW_BYTES,
                          batch_size=MAX_RECORDS_PER_FRAME_PART)
        return self._handle

    def _on_records(self, handle: int, count: int, data: bytes, next_offset: int, max_offset: int) -> None:
        if handle == self._handle and self._out is not None:
            self._out.put(RecordChunk(data, count, next_offset, max_offset))

    def _on_ended(self, handle: int, end: QueueEnd) -> None:
        if handle == self._handle and self._out is not None:
            self._out.put(end)

    def _on_broken(self, broker: str, error: TidemarkError) -> None:
        if self._out is not None and broker == self._broker:  # only the stream the current read is on
            self._out.put(error)

    def _give_back(self, broker: str, handle: int, nbytes: int) -> None:
        stream = self._streams.get(broker)
        if stream is not None and stream.usable and handle == self._handle:
            stream.credit(handle, 0, nbytes)

    def _close(self, broker: str, handle: int) -> None:
        stream = self._streams.get(broker)
        if handle == self._handle:
            self._out = None
        if stream is not None and stream.usable:
            stream.close_queue(handle)


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
