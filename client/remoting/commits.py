"""CommitStream: an open CommitOffsets stream whose writes gather into few messages.

Commits are oneway on this stream: the broker answers once, when the client
closes it. `write` therefore only queues its commits; one sender task per
stream puts what is queued on the wire, up to MAX_COMMITS_PER_MESSAGE in a
message. While one message is on its way, the commits written meanwhile wait
and leave together in the next (natural batching, as the producer does with
sends): a writer of 64 commits at a time sends 64-commit messages when the
stream keeps up and 1,024-commit messages when it does not. The broker pays
its per-message cost (a stream read, a loop turn, a journal write) once per
message, not once per `write`.

Order is kept: commits leave in the order they were written. A writer ahead of
the stream by more than MAX_QUEUED commits waits in `write` until the sender
takes some. A stream that failed raises its error at the next `write` and at
`close`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import grpc

from tidemark.client.remoting import convert
from tidemark.client.types import CommitOffsetsResult, OffsetCommit
from tidemark.v1 import offsets_pb2

if TYPE_CHECKING:
    from tidemark.client.remoting.connection import BrokerConnection

MAX_COMMITS_PER_MESSAGE = 1024  # about 40 KB of protobuf: far below any message size limit
MAX_QUEUED = 4 * MAX_COMMITS_PER_MESSAGE


def commits_request(commits: Sequence[OffsetCommit]) -> offsets_pb2.CommitOffsetsRequest:
    request = offsets_pb2.CommitOffsetsRequest()
    add = request.commits.add
    for c in commits:
        if c.client_id or c.owner_epoch is not None or c.reset_generation is not None:
            request.commits.append(convert.commit_pb(c))
        else:  # an unfenced commit (the common case): no fence message to build
            add(group=c.group, topic=c.queue.topic, queue_id=c.queue.queue_id, offset=c.offset)
    return request


class CommitStream:
    """An open CommitOffsets stream: `write` queues commits without waiting for the wire; `close` sends
    the rest and returns the broker's summary."""

    def __init__(self, conn: BrokerConnection, call: Any) -> None:
        self._conn = conn
        self._call = call
        self._queued: list[OffsetCommit] = []
        self._sender: asyncio.Task[None] | None = None
        self._taken = asyncio.Event()  # the sender took commits off the queue (or stopped)
        self._error: BaseException | None = None

    async def write(self, commits: Sequence[OffsetCommit]) -> None:
        if self._error is not None:
            raise self._error
        self._queued.extend(commits)
        if self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(self._send())
        while len(self._queued) > MAX_QUEUED and self._error is None:
            self._taken.clear()
            await self._taken.wait()
        if self._error is not None:
            raise self._error

    async def _send(self) -> None:
        try:
            while self._queued:
                chunk = self._queued[:MAX_COMMITS_PER_MESSAGE]
                del self._queued[:MAX_COMMITS_PER_MESSAGE]
                self._taken.set()
                await self._call.write(commits_request(chunk))
        except grpc.RpcError as e:
            self._error = self._conn.error(e)
        except asyncio.CancelledError as e:  # cancel(): the writer and close() hear of it
            self._error = e
            raise
        except Exception as e:  # a write grpc refused (the call had ended): the writer and close() get it
            self._error = e
        finally:
            self._sender = None
            self._taken.set()

    async def close(self) -> CommitOffsetsResult:
        """Send what is queued, end the stream and return the broker's summary. A close that is cancelled
        (or fails) cancels the stream and its sender: nothing of it runs on."""
        try:
            while self._sender is not None and self._error is None:
                await asyncio.wait([self._sender])  # (its failure is kept in _error)
            if self._error is not None:
                raise self._error
            await self._call.done_writing()
            pb = await self._call
        except grpc.RpcError as e:
            self.cancel()
            raise self._conn.error(e) from None
        except BaseException:
            self.cancel()
            raise
        name = self._conn.broker_name or ""
        return CommitOffsetsResult(pb.applied, pb.rejected, [convert.rejected(r, name) for r in pb.rejections])

    def cancel(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
        self._call.cancel()
