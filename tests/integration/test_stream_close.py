"""Produce and Fetch streams (and RocketMQ 5's Telemetry stream) end quietly on both sides, however they end.

A stream the client finishes, cancels, or loses to a connection reset (whatever either side was doing:
the broker writing an answer, a fetch parked waiting for data, a request just sent) leaves no traceback,
no ERROR line, no "Unexpected ... raised by servicer method" / "Failed sending error status" in the
broker's log, and no "Task exception was never retrieved", "Task was destroyed but it is pending!",
"Exception ignored" or "Event loop is closed" on the client's stderr. The broker is stopped before its
log is read, so a handler still running would have ended (and logged) by then.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import grpc
import pytest
from brokerproc import BrokerProcess
from faults.proxy import FaultProxy
from workload import create_topic, wait_until

from tidemark.broker.services.rmq5 import service as rmq5
from tidemark.client import Admin, ConsumeFromWhere, Message, MessageQueue, Producer, PullConsumer
from tidemark.client.consumer.record_reader import RecordReader
from tidemark.common.records import RecordBatchBuilder, encode_properties
from tidemark.rmq5.v2 import messaging_pb2 as pb
from tidemark.v1 import (
    membership_pb2,
    membership_pb2_grpc,
    messaging_pb2,
    messaging_pb2_grpc,
    offsets_pb2,
    offsets_pb2_grpc,
    replication_pb2,
    replication_pb2_grpc,
)

TOPIC = "Closing"
FIRST_OFFSET = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
ROUNDS = 5

BROKER_NOISE = ("Traceback", "Unexpected", "Failed sending", "level=ERROR", "ExecuteBatchError",
                "Exception ignored", "Task exception was never retrieved", "Task was destroyed")
CLIENT_NOISE = ("Traceback", "ERROR", "Task exception was never retrieved", "Task was destroyed but it is pending",
                "Exception ignored", "Event loop is closed", "RuntimeError")


def noisy(text: str, patterns: tuple[str, ...]) -> list[str]:
    return [line for line in text.splitlines() if any(p in line for p in patterns)]


def stopped_quietly(broker: BrokerProcess) -> None:
    """Stop the broker (every handler has ended once it exited) and check its whole log."""
    assert broker.stop() == 0
    found = noisy(broker.log_text(), BROKER_NOISE)
    assert found == [], "the broker logged errors for streams that closed:\n" + "\n".join(found[:20])


def batch(i: int, *, size: int = 16) -> bytes:
    b = RecordBatchBuilder(TOPIC, "h")
    b.append(b"%d" % i + b"x" * size, encode_properties({"UNIQ_KEY": f"K{i}"}))
    return bytes(b.buffer)


def produce_request(i: int, queue_id: int = 0, *, size: int = 16) -> messaging_pb2.ProduceRequest:
    return messaging_pb2.ProduceRequest(request_id=i, topic=TOPIC, queue_id=queue_id, count=1,
                                        records=batch(i, size=size))


def fetch_open(handle: int, queue_id: int, offset: int, *, credit: int) -> messaging_pb2.FetchRequest:
    return messaging_pb2.FetchRequest(open=messaging_pb2.FetchOpen(
        handle=handle, topic=TOPIC, queue_id=queue_id, offset=offset, credit_messages=credit,
        credit_bytes=1 << 30, batch_size=64))


async def raw_streams(address: str) -> None:
    """Produce and Fetch streams over raw grpc.aio stubs, ended in every state the broker can be in. (Which
    of a cancelled call's completions the broker sees first varies: each round is one more chance.)"""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = messaging_pb2_grpc.MessagingServiceStub(channel)
        offsets = offsets_pb2_grpc.OffsetServiceStub(channel)

        # Produce, cancelled right after a request went out (the broker may be storing it).
        call = stub.Produce()
        await call.write(produce_request(1))
        call.cancel()
        # ... while parked: its answer read, the broker waits for the next request.
        call = stub.Produce()
        await call.write(produce_request(2))
        assert (await call.read()).code == 0
        call.cancel()
        # ... while the broker writes answers nobody reads (thousands of them fill the flow-control window).
        call = stub.Produce()
        for i in range(3000):
            await call.write(produce_request(100 + i, queue_id=1))
        call.cancel()
        # ... finished: half-closed, every answer read, an OK status.
        call = stub.Produce()
        await call.write(produce_request(3))
        await call.done_writing()
        assert [a.code async for a in call] == [0]
        assert await call.code() is grpc.StatusCode.OK

        # Queue 0 holds some messages now, queue 1 lots; queue 2 nothing.
        end0 = (await offsets.GetMaxOffset(offsets_pb2.QueueRequest(topic=TOPIC, queue_id=0))).offset
        assert end0 > 0
        # Fetch, cancelled while parked waiting for data: a frame of queue 0 shows the broker took both opens,
        # then queue 2 has nothing and queue 0 no credit left.
        call = stub.Fetch()
        await call.write(fetch_open(1, 0, 0, credit=1))
        await call.write(fetch_open(2, 2, 0, credit=100))
        first = await call.read()
        assert [(r.handle, r.count) for r in first.records] == [(1, 1)]
        call.cancel()
        # ... while the broker writes frames nobody reads (queue 1, all credit at once).
        call = stub.Fetch()
        await call.write(fetch_open(1, 1, 0, credit=1 << 20))
        assert (await call.read()).records[0].count > 0
        call.cancel()
        # ... right after the open went out.
        call = stub.Fetch()
        await call.write(fetch_open(1, 1, 0, credit=1 << 20))
        call.cancel()
        # ... finished: the queue closed, half-closed, read to its OK status.
        call = stub.Fetch()
        await call.write(fetch_open(1, 0, 0, credit=1))
        assert (await call.read()).records[0].handle == 1
        await call.write(messaging_pb2.FetchRequest(close=messaging_pb2.FetchClose(handle=1)))
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        assert await call.code() is grpc.StatusCode.OK


async def raw_telemetry(address: str) -> None:
    """RocketMQ 5's Telemetry stream (a producer's: it waits for commands and transaction checks at once),
    cancelled while parked, right after the settings went out, and finished."""
    async with grpc.aio.insecure_channel(address) as channel:
        telemetry = channel.stream_stream(f"/{rmq5.SERVICE}/Telemetry",
                                          request_serializer=pb.TelemetryCommand.SerializeToString,
                                          response_deserializer=pb.TelemetryCommand.FromString)
        settings = pb.TelemetryCommand(settings=pb.Settings(
            client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name=TOPIC)])))
        metadata = (("x-mq-client-id", "closing@1"), ("x-mq-language", "PYTHON"), ("x-mq-protocol", "GRPC_V2"))
        call = telemetry(metadata=metadata)
        await call.write(settings)
        assert (await call.read()).status.code == pb.OK
        call.cancel()
        call = telemetry(metadata=metadata)
        await call.write(settings)
        call.cancel()
        call = telemetry(metadata=metadata)
        await call.write(settings)
        assert (await call.read()).status.code == pb.OK
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        assert await call.code() is grpc.StatusCode.OK


def fetch_streams(address: str) -> int:
    with Admin(brokers=address) as admin:
        return admin.broker_status_at(address).fetch_streams


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_raw_produce_and_fetch_streams_end_quietly_on_the_broker_in_every_state(broker_factory, flush):
    broker = broker_factory(args=("--flush", flush))  # sync flush: answers wait for the disk (a task each)
    create_topic(broker.address, TOPIC, 3)
    for _ in range(ROUNDS):
        asyncio.run(raw_streams(broker.address))
        asyncio.run(raw_telemetry(broker.address))
    wait_until(lambda: fetch_streams(broker.address) == 0, 15, "the broker to close every fetch stream")
    stopped_quietly(broker)


async def reset_mid_stream(proxy: FaultProxy) -> None:
    """A Produce parked between requests, a Fetch parked waiting for data and one whose frames nobody
    reads, through a proxy that resets their connection: the calls fail (UNAVAILABLE) on the client, the
    broker just forgets them."""
    async with grpc.aio.insecure_channel(proxy.address) as channel:
        stub = messaging_pb2_grpc.MessagingServiceStub(channel)
        produce = stub.Produce()
        await produce.write(produce_request(1))
        assert (await produce.read()).code == 0
        for i in range(300):  # queue 1: more than one frame
            await produce.write(produce_request(10 + i, queue_id=1, size=4096))
            assert (await produce.read()).code == 0
        parked = stub.Fetch()
        await parked.write(fetch_open(1, 0, 0, credit=1))
        assert (await parked.read()).records[0].count == 1
        writing = stub.Fetch()
        await writing.write(fetch_open(1, 1, 0, credit=1 << 20))
        assert (await writing.read()).records[0].count >= 1
        assert proxy.reset() >= 1
        for call in (produce, parked, writing):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call.read()
            assert e.value.code() is grpc.StatusCode.UNAVAILABLE


def test_streams_reset_mid_call_end_quietly_on_the_broker(broker):
    create_topic(broker.address, TOPIC, 2)
    with FaultProxy(broker.address) as proxy:
        for _ in range(ROUNDS):
            asyncio.run(reset_mid_stream(proxy))
    wait_until(lambda: fetch_streams(broker.address) == 0, 15, "the broker to close every fetch stream")
    stopped_quietly(broker)


SEGMENT = 1 << 20  # the master's commitlog_segment_size, which a replica's hello must repeat


def replicas(address: str) -> int:
    with Admin(brokers=address) as admin:
        return admin.broker_status_at(address).replicas


async def replicate_streams(address: str, proxy: FaultProxy) -> None:
    """A master's Replicate streams (a raw replica) ended while the master is parked writing a chunk the
    replica does not read, by a cancel and by a reset, and while it waits for new records: its task
    reading the replica's acknowledgements must be gone before the call's request stream is closed."""
    hello = replication_pb2.ReplicaProgress(broker_name="broker-a", broker_id=1, commit_log_end=0,
                                            segment_size=SEGMENT)
    for target in (address, proxy.address):
        async with grpc.aio.insecure_channel(target) as channel:
            writing = replication_pb2_grpc.ReplicationServiceStub(channel).Replicate()
            await writing.write(hello)
            # Megabyte chunks nobody reads: the master is parked in a write once it serves the replica.
            await asyncio.to_thread(wait_until, lambda: replicas(address) == 1, 15, "the master to serve it")
            if target == proxy.address:
                assert proxy.reset() >= 1
            else:
                writing.cancel()
        await asyncio.to_thread(wait_until, lambda: replicas(address) == 0, 15, "the master to forget it")
    async with grpc.aio.insecure_channel(address) as channel:
        caught_up = replication_pb2_grpc.ReplicationServiceStub(channel).Replicate()
        await caught_up.write(hello)
        progress, end = 0, 1
        while progress < end:  # acknowledged as it comes, or the master stops sending
            chunk = await caught_up.read()
            progress, end = chunk.offset + len(chunk.data), chunk.master_end
            await caught_up.write(replication_pb2.ReplicaProgress(commit_log_end=progress))
        caught_up.cancel()  # parked: the replica has everything
    await asyncio.to_thread(wait_until, lambda: replicas(address) == 0, 15, "the master to forget it")


def test_replicate_streams_end_quietly_on_the_master(broker_factory):
    broker = broker_factory(args=("--commitlog-segment-size", str(SEGMENT)))
    create_topic(broker.address, TOPIC, 1)
    with Producer(brokers=broker.address) as producer:
        for _ in range(40):
            producer.send_batch([Message(TOPIC, b"x" * 8192) for _ in range(32)])
    with FaultProxy(broker.address) as proxy:
        for _ in range(ROUNDS):
            asyncio.run(replicate_streams(broker.address, proxy))
    stopped_quietly(broker)


def test_client_library_streams_end_quietly_on_the_broker(broker):
    create_topic(broker.address, TOPIC, 2)
    mq = MessageQueue(TOPIC, "broker-a", 0)
    with Producer(brokers=broker.address) as producer:
        producer.send_batch([Message(TOPIC, b"m%d" % i) for i in range(100)], queue=mq)
        for i in range(50):
            producer.send_async(Message(TOPIC, b"a%d" % i))  # some still on their way at shutdown
    with RecordReader(brokers=broker.address) as reader:
        assert sum(c.count for c in reader.read(mq, 0, 100, poll_timeout_s=10)) == 100
        with Admin(brokers=broker.address) as admin:
            end = admin.max_offset(mq)
            total = end + admin.max_offset(MessageQueue(TOPIC, "broker-a", 1))
        parked = reader.read(mq, end, end + 100, poll_timeout_s=0.2)  # at the end: waits for data
        assert next(parked) is None
        parked.close()
    consumer = PullConsumer(group="closing", brokers=broker.address, consume_from_where=FIRST_OFFSET)
    consumer.subscribe(TOPIC)
    consumer.start()
    got: list = []
    try:
        wait_until(lambda: len(got.__iadd__(consumer.poll(0.2))) >= total, 30, "the pull consumer to read everything")
    finally:
        consumer.shutdown()  # its fetch stream parked at the end of both queues
    wait_until(lambda: fetch_streams(broker.address) == 0, 15, "the broker to close every fetch stream")
    stopped_quietly(broker)


# Runs in its own process, whose stderr (logging at WARNING, asyncio's and gRPC's reports, "Exception
# ignored" from the garbage collector) the test reads. It asks the test (stdout "reset", stdin "ok") to
# reset every connection at points where its streams are open.
CLIENT = textwrap.dedent('''
    import gc, logging, sys
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    from tidemark.client import ConsumeFromWhere, Message, MessageQueue, Producer, PullConsumer
    from tidemark.client.consumer.record_reader import RecordReader

    address, topic = sys.argv[1], sys.argv[2]
    queues = [MessageQueue(topic, "broker-a", q) for q in (0, 1)]

    def reset():
        print("reset", flush=True)
        assert sys.stdin.readline().strip() == "ok"

    producer = Producer(brokers=address)
    producer.start()
    for q in queues:
        producer.send_batch([Message(topic, b"m%d" % i) for i in range(100)], queue=q)
    for _ in range(2):
        with RecordReader(brokers=address) as reader:  # a Spark task's reader: reads its range, shuts down
            assert sum(c.count for c in reader.read(queues[0], 0, 100, poll_timeout_s=10)) == 100
    reader = RecordReader(brokers=address).start()
    parked = reader.read(queues[1], 100, 200, poll_timeout_s=0.2)  # at the end: waits for data
    assert next(parked) is None
    reset()  # the reader's fetch stream, parked, and the producer's idle produce stream
    reader.shutdown()
    del parked  # a read left unfinished, collected after its reader shut down
    gc.collect()

    consumer = PullConsumer(group="closing", brokers=address,
                            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    consumer.subscribe(topic)
    consumer.start()
    got = 0
    while got < 200:
        got += len(consumer.poll(1.0))
    reset()  # the consumer's fetch stream, parked at the end of both queues
    producer.send_batch([Message(topic, b"after") for _ in range(10)], queue=queues[0])  # a new stream
    while got < 210:
        got += len(consumer.poll(1.0))
    for i in range(200):
        producer.send_async(Message(topic, b"a%d" % i))  # on their way when the producer shuts down
    consumer.shutdown()
    producer.shutdown()
    gc.collect()
    print("done", got, flush=True)
''')


def test_client_streams_end_quietly_on_the_client_and_the_broker(broker, tmp_path):
    create_topic(broker.address, TOPIC, 2)
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    with FaultProxy(broker.address) as proxy:
        client = subprocess.Popen([sys.executable, str(script), proxy.address, TOPIC], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            resets = 0
            while (line := client.stdout.readline()) == "reset\n":
                resets += proxy.reset()
                client.stdin.write("ok\n")
                client.stdin.flush()
            _, stderr = client.communicate(timeout=120)
        finally:
            client.kill()
    assert client.returncode == 0 and line.startswith("done"), f"client failed ({client.returncode}):\n{stderr}"
    assert resets >= 2  # both resets cut open streams
    found = noisy(stderr, CLIENT_NOISE)
    assert found == [], "the client reported errors for streams that closed:\n" + stderr[-6000:]
    wait_until(lambda: fetch_streams(broker.address) == 0, 15, "the broker to close every fetch stream")
    stopped_quietly(broker)


def test_streams_open_when_the_broker_stops_end_quietly(broker):
    """A graceful stop under a parked Produce, a parked Fetch and a membership watch ends them without an
    error logged, and at once: each gets UNAVAILABLE "the broker is stopping" (rather than grpc.aio's
    CANCELLED "Cancelling all calls" once the stop's grace has passed). (A reader that sees the server
    stop, grpc.aio's "Server already stopped", is the end of its call too; the controller fault scenario
    met it once, this test's timing does not reach it.)"""
    create_topic(broker.address, TOPIC, 1)

    async def ended(call) -> tuple[grpc.StatusCode, str]:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            while True:
                if await call.read() is grpc.aio.EOF:
                    break
        return raised.value.code(), raised.value.details()

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(broker.address) as channel:
            stub = messaging_pb2_grpc.MessagingServiceStub(channel)
            produce = stub.Produce()
            await produce.write(produce_request(1))
            assert (await produce.read()).code == 0
            fetch = stub.Fetch()
            await fetch.write(fetch_open(1, 0, 0, credit=1))
            assert (await fetch.read()).records[0].count == 1
            watch = membership_pb2_grpc.MembershipServiceStub(channel).WatchConsumerIds(
                membership_pb2.WatchConsumerIdsRequest(group="watchers", client_id="w1"))
            # Parked in its handler before the stop: the watch's first answer (the group's members) comes
            # from there (its wait_for_connection says only that the request left).
            assert (await watch.read()).group == "watchers"
            stopping = asyncio.create_task(asyncio.to_thread(broker.stop))
            unavailable = (grpc.StatusCode.UNAVAILABLE, "the broker is stopping")
            assert await ended(produce) == unavailable
            assert await ended(fetch) == unavailable
            assert await ended(watch) == unavailable
            assert await stopping == 0
    asyncio.run(scenario())
    found = noisy(broker.log_text(), BROKER_NOISE)
    assert found == [], "the broker logged errors for streams open at its stop:\n" + "\n".join(found[:20])
