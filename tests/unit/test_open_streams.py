"""OpenStreams at a broker's stop: a replica's stream (a handler marked `ends_last`) ends after the others
and after the broker is settled, even when the stop comes before its handler has run a single step (the
mark is read when the call is accepted, not inside the handler). The long polls, which the request intake
refuses once the broker is stopping, are marked `long_poll` as registered with gRPC."""

from __future__ import annotations

import asyncio
import types

import grpc
import pytest

from tidemark.broker.services.messaging import MessagingServicer
from tidemark.broker.services.replication import ReplicationServicer
from tidemark.broker.services.rmq5 import service as rmq5
from tidemark.broker.services.streams import STOPPING, OpenStreams, marked_last, marked_long_poll
from tidemark.v1 import messaging_pb2_grpc, replication_pb2_grpc

WAIT_S = 10  # a bound on waits for events, so that a failure fails instead of hanging


class Aborted(Exception):
    pass


class Context:
    """What OpenStreams uses of a call's context: its abort."""

    def __init__(self) -> None:
        self.status: tuple[grpc.StatusCode, str] | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.status = (code, details)
        raise Aborted(details)


def _handler(started: asyncio.Event, ended: list[str], settled: asyncio.Event):
    async def stream_handler() -> None:
        started.set()
        try:
            await asyncio.Event().wait()  # a stream that never ends by itself
        except asyncio.CancelledError:
            ended.append("after settled" if settled.is_set() else "before settled")
            raise
    return stream_handler()


def _late_first_step(loop: asyncio.AbstractEventLoop, coro, **kw) -> asyncio.Task:
    """A task factory under which a stream's handler runs its first step a few loop turns after its task is
    made, so that the stop below comes first, as it may when a call is accepted just before a stop."""
    if getattr(coro, "__name__", "") == "stream_handler":
        async def later(inner=coro):
            try:
                for _ in range(3):
                    await asyncio.sleep(0)
            except asyncio.CancelledError:
                inner.close()  # cancelled before its first step: it never runs
                raise
            return await inner
        coro = later()
    return asyncio.Task(coro, loop=loop, **kw)


@pytest.mark.parametrize("last", [True, False])
def test_a_stream_stopped_before_its_first_step_ends_in_its_place(last):
    async def scenario() -> tuple[list[str], bool, Context]:
        asyncio.get_running_loop().set_task_factory(_late_first_step)
        streams = OpenStreams()
        started, settled, release = asyncio.Event(), asyncio.Event(), asyncio.Event()
        ended: list[str] = []
        context = Context()
        call = asyncio.create_task(streams.run(_handler(started, ended, settled), context, last=last))
        await asyncio.sleep(0)  # one loop turn: run() made the handler's task
        assert not started.is_set()

        async def settle() -> None:
            await release.wait()
            settled.set()
        stop = asyncio.create_task(streams.stop(settle, asyncio.get_running_loop().time() + WAIT_S))
        if last:
            # Not cancelled with the others: the handler gets to run while the broker settles.
            await asyncio.wait_for(started.wait(), WAIT_S)
            assert ended == []
        release.set()
        await asyncio.wait_for(stop, WAIT_S)
        with pytest.raises((Aborted, asyncio.CancelledError)):
            await asyncio.wait_for(call, WAIT_S)
        return ended, started.is_set(), context
    ended, started, context = asyncio.run(scenario())
    if last:
        assert started and ended == ["after settled"]
        assert context.status == (grpc.StatusCode.UNAVAILABLE, STOPPING)
    else:  # an ordinary stream (a fetch, a watch) is cancelled at once, before its handler ever ran
        assert not started and ended == []
        assert context.status == (grpc.StatusCode.UNAVAILABLE, STOPPING)


class Registered:
    """A stand-in for grpc.aio's server that keeps the method handlers a generated add_*_to_server gives it."""

    def __init__(self) -> None:
        self.handlers: dict = {}

    def add_generic_rpc_handlers(self, handlers) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        self.handlers.update(handlers)


def test_the_replicas_stream_is_marked_as_registered_with_grpc():
    server = Registered()
    replication_pb2_grpc.add_ReplicationServiceServicer_to_server(ReplicationServicer(broker=None), server)
    captured = server.handlers
    assert marked_last(captured["Replicate"].stream_stream)
    assert not marked_last(captured["GetMetadata"].unary_unary)


def test_the_long_polls_are_marked_as_registered_with_grpc():
    server = Registered()
    broker = types.SimpleNamespace(operations=None)
    messaging_pb2_grpc.add_MessagingServiceServicer_to_server(MessagingServicer(broker), server)
    captured = server.handlers
    assert marked_long_poll(captured["PullMessage"].unary_unary)
    assert not marked_long_poll(captured["SendMessage"].unary_unary)
    table = rmq5.handlers(rmq5.Rmq5Servicer(broker))

    def registered(name: str) -> grpc.RpcMethodHandler:
        return table.service(types.SimpleNamespace(method=f"/{rmq5.SERVICE}/{name}"))
    assert marked_long_poll(registered("ReceiveMessage").unary_stream)
    assert marked_long_poll(registered("PullMessage").unary_stream)
    assert not marked_long_poll(registered("QueryRoute").unary_unary)


class AbortingContext(Context):
    """grpc.aio's abort as the stop may meet it: the first call waits while its status goes out, a second
    one raises UsageError "Abort already called!"."""

    def __init__(self) -> None:
        super().__init__()
        self.aborting = asyncio.Event()

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        if self.status is not None:
            raise grpc.aio.UsageError("Abort already called!")
        self.status = (code, details)
        self.aborting.set()
        await asyncio.Event().wait()  # the status on its way: the stop's cancellation comes in here


def test_a_handler_stopped_in_its_own_abort_ends_as_a_cancelled_call():
    """Regression (controller fault run, seed 21911: a master fenced as it stopped logged "Unexpected
    [UsageError] raised by servicer method [CommitOffsets]"). A stream handler refusing a commit with an
    abort was cancelled by the stop inside that abort, and the stop's own abort (UNAVAILABLE "the broker is
    stopping") raised "Abort already called!" out of the servicer. The handler's status stands and the
    call ends as a cancelled one."""
    async def scenario() -> AbortingContext:
        streams, context = OpenStreams(), AbortingContext()

        async def refusing() -> None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no longer the master")

        call = asyncio.create_task(streams.run(refusing(), context))
        await asyncio.wait_for(context.aborting.wait(), WAIT_S)

        async def settled() -> None:
            pass

        await streams.stop(settled, asyncio.get_running_loop().time() + WAIT_S)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(call, WAIT_S)
        return context

    context = asyncio.run(scenario())
    assert context.status == (grpc.StatusCode.FAILED_PRECONDITION, "no longer the master")
