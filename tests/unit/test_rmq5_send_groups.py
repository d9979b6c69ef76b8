"""A RocketMQ 5 SendMessage carrying several message groups is stored all or nothing: every entry, and
everything the broker checks of each group's batch, is checked before anything is stored; only a store
write failing part way leaves some groups stored, answered per entry as the RocketMQ proxy answers
(OK with an offset, or the error; MULTIPLE_RESULTS overall). An in-process broker over gRPC."""

from __future__ import annotations

import asyncio
import uuid
import zlib

import grpc

from tidemark.broker.config import BrokerConfig
from tidemark.broker.errors import StoreError
from tidemark.broker.server import BrokerServer
from tidemark.broker.services.rmq5 import service
from tidemark.rmq5.v2 import messaging_pb2 as pb

QUEUES = 8
# Message groups that hash to three different queues of an 8-queue topic (crc32, as the broker hashes).
GROUPS = ("a", "b", "c")
assert len({zlib.crc32(g.encode()) % QUEUES for g in GROUPS}) == 3


def message(group: str, body: bytes = b"x", **fields) -> pb.Message:
    sp = pb.SystemProperties(message_id=uuid.uuid4().hex, body_encoding=pb.IDENTITY,
                             message_type=fields.pop("message_type", pb.FIFO), message_group=group)
    return pb.Message(topic=pb.Resource(name="Groups"), system_properties=sp, body=body, **fields)


def run(scenario, tmp_path) -> None:
    async def main() -> None:
        server = BrokerServer(BrokerConfig(data_dir=tmp_path, host="127.0.0.1", port=0))
        port = await server.start()
        server.controller.topics.create("Groups", QUEUES)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_unary(f"/{service.SERVICE}/SendMessage",
                                           request_serializer=pb.SendMessageRequest.SerializeToString,
                                           response_deserializer=pb.SendMessageResponse.FromString)

                async def send(*messages: pb.Message) -> pb.SendMessageResponse:
                    return await call(pb.SendMessageRequest(messages=messages),
                                      metadata=(("x-mq-client-id", "127.0.0.1@groups"),), timeout=10)

                store = server.controller.store
                await scenario(send, server.controller, lambda: [store.max_offset("Groups", q) for q in range(QUEUES)])
        finally:
            await server.stop(0)
    asyncio.run(main())


def test_a_request_whose_last_entry_is_refused_stores_nothing(tmp_path):
    async def scenario(send, broker, offsets):
        refused = [
            # what only the broker's checks of the last group see: a property value it cannot store,
            (message("c", user_properties={"k": "a\x01b"}), pb.BAD_REQUEST, "control characters"),
            # body and properties together over max_message_size (the body alone is within it),
            (message("c", user_properties={"k": "v" * broker.config.max_message_size}), pb.BAD_REQUEST,
             "max_message_size"),
            # a transactional message among other groups' messages,
            (message("c", message_type=pb.TRANSACTION, **{}), pb.BAD_REQUEST, "transactional message goes alone"),
            # and what the entry itself says.
            (message("c", body=b""), pb.MESSAGE_BODY_EMPTY, "empty"),
        ]
        for last, code, words in refused:
            if last.system_properties.message_type == pb.TRANSACTION:
                last.system_properties.ClearField("message_group")
            answer = await send(message("a"), message("a"), message("b"), last)
            assert answer.status.code == code and words in answer.status.message, answer.status
            assert offsets() == [0] * QUEUES, f"stored although {words!r} refused the request"

        answer = await send(message("a"), message("b"), message("a"), message("c"))
        assert answer.status.code == pb.OK and [e.status.code for e in answer.entries] == [pb.OK] * 4
        assert [e.offset for e in answer.entries] == [0, 0, 1, 0]  # each group in its queue, in order
        assert sorted(offsets()) == [0] * (QUEUES - 3) + [1, 1, 2]
    run(scenario, tmp_path)


def test_a_store_write_failing_part_way_is_answered_per_entry(tmp_path):
    async def scenario(send, broker, offsets):
        store = broker.store
        put = store.put_messages_now
        calls = []

        def second_write_fails(records):
            calls.append(records)
            if len(calls) == 2:
                raise StoreError("commit log write failed: No space left on device")
            return put(records)

        store.put_messages_now = second_write_fails
        try:
            answer = await send(message("a"), message("b"), message("a"), message("c"))
        finally:
            store.put_messages_now = put
        assert len(calls) == 2  # the third group was not tried after the second failed
        assert answer.status.code == pb.MULTIPLE_RESULTS and "2 of 4 messages stored" in answer.status.message
        assert [e.status.code for e in answer.entries] == [pb.OK, pb.INTERNAL_SERVER_ERROR, pb.OK,
                                                             pb.INTERNAL_SERVER_ERROR]
        assert "No space left" in answer.entries[1].status.message
        assert sorted(offsets()) == [0] * (QUEUES - 1) + [2]  # group a's two messages, nothing else
    run(scenario, tmp_path)
