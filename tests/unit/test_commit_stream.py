"""CommitStream against a scripted gRPC call (no broker): writes gather while one message is on its way,
a failed write reaches the writer and close(), and a cancelled close leaves nothing running."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tidemark.client.errors import UnavailableError
from tidemark.client.message import MessageQueue
from tidemark.client.remoting.commits import MAX_COMMITS_PER_MESSAGE, CommitStream
from tidemark.client.types import OffsetCommit
from tidemark.v1 import offsets_pb2

MQ = MessageQueue("T", "broker-a", 0)


class Failed(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "connection lost"


class ScriptedCall:
    def __init__(self) -> None:
        self.sent: list[list[int]] = []  # each message's offsets
        self.gate = asyncio.Event()  # a write completes once this is set
        self.gate.set()
        self.fail = False
        self.cancelled = False

    async def write(self, request) -> None:
        await self.gate.wait()
        if self.fail:
            raise Failed()
        self.sent.append([c.offset for c in request.commits])

    async def done_writing(self) -> None:
        pass

    def __await__(self):
        async def answer():
            return offsets_pb2.CommitOffsetsResponse(applied=sum(len(m) for m in self.sent))
        return answer().__await__()

    def cancel(self) -> None:
        self.cancelled = True


class Conn:
    broker_name = "broker-a"

    def error(self, e):
        return UnavailableError(e.details())


def commits(*offsets: int) -> list[OffsetCommit]:
    return [OffsetCommit("g", MQ, o) for o in offsets]


def test_writes_made_while_a_message_is_on_its_way_leave_together_in_order():
    async def main():
        call = ScriptedCall()
        stream = CommitStream(Conn(), call)
        call.gate.clear()
        await stream.write(commits(1))
        await asyncio.sleep(0)  # the sender takes [1] and waits on the wire
        for o in range(2, 6):
            await stream.write(commits(o))
        call.gate.set()
        result = await stream.close()
        assert call.sent == [[1], [2, 3, 4, 5]] and result.applied == 5
    asyncio.run(main())


def test_a_message_holds_at_most_its_limit():
    async def main():
        call = ScriptedCall()
        stream = CommitStream(Conn(), call)
        await stream.write(commits(*range(MAX_COMMITS_PER_MESSAGE + 10)))
        await stream.close()
        assert [len(m) for m in call.sent] == [MAX_COMMITS_PER_MESSAGE, 10]
        assert sum(call.sent, []) == list(range(MAX_COMMITS_PER_MESSAGE + 10))
    asyncio.run(main())


def test_a_failed_write_reaches_the_next_write_and_close():
    async def main():
        call = ScriptedCall()
        call.fail = True
        stream = CommitStream(Conn(), call)
        await stream.write(commits(1))
        with pytest.raises(UnavailableError, match="connection lost"):
            await stream.close()
        with pytest.raises(UnavailableError):
            await stream.write(commits(2))
    asyncio.run(main())


def test_a_cancelled_close_cancels_the_call_and_its_sender():
    async def main():
        call = ScriptedCall()
        call.gate.clear()  # the wire never takes the message
        stream = CommitStream(Conn(), call)
        await stream.write(commits(1))
        closing = asyncio.get_running_loop().create_task(stream.close())
        await asyncio.sleep(0.01)
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        assert call.cancelled
        await asyncio.sleep(0)
        assert stream._sender is None  # the sender ended with the cancellation
    asyncio.run(main())
