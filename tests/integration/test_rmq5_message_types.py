"""The message type a RocketMQ 5 client is told (SystemProperties.message_type) for messages as the broker
really stores them: timed ones once their time came, transactional ones once committed.

The RocketMQ proxy reads the type off what the message carries (GrpcConverter.buildSystemProperties):
TRAN_MSG "true" is TRANSACTION, then a delay level or a delivery time (TIMER_DELIVER_MS) DELAY, then a
message group FIFO, else NORMAL. Its broker decides what is left when a consumer gets the message: the
schedule service drops the delay level (and any delivery time) when it delivers, the timer store keeps
TIMER_DELIVER_MS, a commit keeps TRAN_MSG (the committed copy is stored with the half's properties
string). A broker controller in this process with a clock driven by hand (as test_delivery_time.py), each
stored message converted as the RocketMQ 5 adapter hands it out.
"""

from __future__ import annotations

import asyncio

import pytest

import tidemark.broker.controller as controller_module
from tidemark.broker.config import BrokerConfig
from tidemark.broker.controller import BrokerController
from tidemark.broker.ingest.send import OutgoingMessage
from tidemark.broker.services.rmq5 import convert
from tidemark.broker.store import GetStatus
from tidemark.broker.transactions.table import Outcome
from tidemark.common.protocol import TRANSACTION_HALF_TOPIC, PropertyKey
from tidemark.rmq5.v2 import messaging_pb2 as pb

T0 = 1_800_000_000_000


@pytest.fixture
def clock(monkeypatch) -> list[int]:
    now = [T0]
    monkeypatch.setattr(controller_module, "now_ms", lambda: now[0])
    return now


def run(tmp_path, scenario):
    async def main():
        b = BrokerController(BrokerConfig(data_dir=tmp_path, flush_interval_ms=3_600_000))
        b.load()
        await b.start()
        b.topics.create("T", 1)
        try:
            await scenario(b)
        finally:
            await b.shutdown()
    asyncio.run(main())


async def deliver_until(b: BrokerController, clock: list[int], until: int) -> None:
    """Run the schedule pass by pass, the clock moved to each next due time, up to `until`."""
    while (due := await b.schedule.deliver_due()) is not None and due <= until:
        clock[0] = max(clock[0], due)
    clock[0] = until
    await b.schedule.deliver_due()


def received(b: BrokerController, msg_id: str, topic: str = "T") -> pb.SystemProperties:
    """The message with `msg_id` on `topic`, as a RocketMQ 5 consumer receives it."""
    result = b.store.get_messages(topic, 0, 0, 100)
    found = [m for m in (result.messages if result.status is GetStatus.FOUND else ())
             if m.properties.get(PropertyKey.UNIQ_KEY) == msg_id]
    assert len(found) == 1, f"{msg_id} is on {topic} {len(found)} times"
    return convert.received(found[0], store_host="h").system_properties


def test_a_delay_level_message_is_normal_once_delivered(tmp_path, clock):
    async def scenario(b):
        [sent] = await b.sender.send("T", 0, [OutgoingMessage(b"level", delay_level=2)])  # 5 s
        await deliver_until(b, clock, T0 + 5_000)
        sp = received(b, sent.msg_id)
        assert sp.message_type == pb.NORMAL
        assert not sp.HasField("delivery_timestamp")
    run(tmp_path, scenario)


@pytest.mark.parametrize("ahead_ms", [137_500, 0, -60_000], ids=["after-hops", "due-now", "past"])
def test_a_message_sent_for_a_delivery_time_stays_delay_with_its_time(tmp_path, clock, ahead_ms):
    async def scenario(b):
        deliver_at = T0 + ahead_ms
        [sent] = await b.sender.send("T", 0, [OutgoingMessage(b"timed", deliver_at_ms=deliver_at)])
        await deliver_until(b, clock, max(deliver_at, T0) + 1_000)
        sp = received(b, sent.msg_id)
        assert sp.message_type == pb.DELAY
        assert sp.delivery_timestamp.ToMilliseconds() == deliver_at
    run(tmp_path, scenario)


def test_a_delivery_time_outranks_a_message_group(tmp_path, clock):
    async def scenario(b):
        group = {convert.MESSAGE_GROUP_KEY: "g"}
        [fifo] = await b.sender.send("T", 0, [OutgoingMessage(b"fifo", properties=group)])
        [timed] = await b.sender.send("T", 0, [OutgoingMessage(b"timed", properties=group, deliver_at_ms=T0)])
        assert received(b, fifo.msg_id).message_type == pb.FIFO
        assert received(b, timed.msg_id).message_type == pb.DELAY
    run(tmp_path, scenario)


def test_a_committed_transactional_message_is_transaction_as_its_half(tmp_path, clock):
    async def scenario(b):
        props = {PropertyKey.TRANSACTION_PREPARED: "true", PropertyKey.PRODUCER_GROUP: "P"}
        [half] = await b.sender.send("T", 0, [OutgoingMessage(b"tx", properties=props)])
        # What a transaction check shows the producer: the half message.
        assert received(b, half.msg_id, TRANSACTION_HALF_TOPIC).message_type == pb.TRANSACTION
        assert await b.transactions.end("P", half.msg_id, half.put.queue_offset, Outcome.COMMIT, by="test")
        assert received(b, half.msg_id).message_type == pb.TRANSACTION
    run(tmp_path, scenario)
