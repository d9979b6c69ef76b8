"""Delivery at a timestamp (OutgoingMessage.deliver_at_ms, RocketMQ 5's delivery time) on a broker
controller in this process: a real store, schedule task and data dir, no gRPC (the public SendMessage
has no delivery time field). Most tests drive the broker's clock by hand; one runs on the real clock.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

import tidemark.broker.controller as controller_module
from tidemark.broker.config import BrokerConfig
from tidemark.broker.controller import BrokerController
from tidemark.broker.errors import InvalidArgumentError
from tidemark.broker.ingest.send import MAX_DELIVERY_DELAY_MS, DeliveryTimeError, OutgoingMessage
from tidemark.broker.store import GetStatus, StoredMessage
from tidemark.common.protocol import SCHEDULE_TOPIC, PropertyKey, tag_hash

T0 = 1_800_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(controller_module, "now_ms", c)
    return c


async def started(tmp_path) -> BrokerController:
    b = BrokerController(BrokerConfig(data_dir=tmp_path, flush_interval_ms=3_600_000))
    b.load()
    await b.start()
    if b.topics.get("T") is None:
        b.topics.create("T", 2)
    return b


def run(tmp_path, scenario):
    async def main():
        b = await started(tmp_path)
        try:
            await scenario(b)
        finally:
            await b.shutdown()
    asyncio.run(main())


def messages(b: BrokerController, topic: str, queue_id: int) -> list[StoredMessage]:
    result = b.store.get_messages(topic, queue_id, 0, 1000)
    return list(result.messages) if result.status is GetStatus.FOUND else []


def delivered(b: BrokerController, msg_id: str, queue_id: int = 1) -> list[StoredMessage]:
    return [m for m in messages(b, "T", queue_id) if m.properties.get(PropertyKey.UNIQ_KEY) == msg_id]


def hops(b: BrokerController, msg_id: str) -> list[tuple[int, int]]:
    """(level, due time) of each schedule-topic record of a message, in the order they were written."""
    records = [m for level in range(1, len(b.schedule.levels_ms) + 1) for m in messages(b, SCHEDULE_TOPIC, level - 1)
               if m.properties.get(PropertyKey.UNIQ_KEY) == msg_id]
    return [(m.queue_id + 1, m.tags_code) for m in sorted(records, key=lambda m: m.commit_log_offset)]


async def send_at(b: BrokerController, deliver_at: int, body: bytes = b"timed", **fields) -> str:
    message = OutgoingMessage(body=body, tags="TagA", keys="k1 k2", properties={"user": "v"},
                              born_timestamp=T0 - 7, deliver_at_ms=deliver_at, **fields)
    [sent] = await b.sender.send("T", 1, [message])
    return sent.msg_id


def assert_looks_delivered(m: StoredMessage, msg_id: str, deliver_at: int, born: int = T0 - 7) -> None:
    """As a delay-level message arrives on its topic, plus the requested time in DELIVER_TIMESTAMP."""
    assert (m.topic, m.queue_id, m.body) == ("T", 1, b"timed")
    assert m.properties[PropertyKey.DELIVER_TIMESTAMP] == str(deliver_at)
    assert m.properties[PropertyKey.UNIQ_KEY] == msg_id
    assert (m.tags, m.keys, m.properties["user"]) == ("TagA", "k1 k2", "v")
    assert m.tags_code == tag_hash("TagA"), "tag filters must match the delivered message"
    assert m.born_timestamp == born
    for key in (PropertyKey.REAL_TOPIC, PropertyKey.REAL_QID, PropertyKey.DELAY):
        assert key not in m.properties


async def drive_until(b: BrokerController, clock: Clock, until: int) -> None:
    """Run the schedule pass by pass, moving the clock to each next due time, up to `until`."""
    while True:
        next_due = await b.schedule.deliver_due()
        if next_due is None or next_due > until:
            clock.now = until
            await b.schedule.deliver_due()
            return
        clock.now = max(clock.now, next_due)


@pytest.mark.parametrize(("after_ms", "expected_hops", "arrives_ms"), [
    (120_000, [(6, 120_000)], 120_000),  # 2 min: one hop of level 6 (2m)
    # 2m17.5s: 2m, 10s, 5s, 1s, 1s, then 0.5 s left: one more 1s hop, 0.5 s late.
    (137_500, [(6, 120_000), (3, 130_000), (2, 135_000), (1, 136_000), (1, 137_000), (1, 138_000)], 138_000),
])
def test_a_timed_message_takes_the_planned_hops_and_is_never_early(tmp_path, clock, after_ms, expected_hops,
                                                                    arrives_ms):
    async def scenario(b):
        msg_id = await send_at(b, T0 + after_ms)
        assert delivered(b, msg_id) == []
        await drive_until(b, clock, T0 + arrives_ms - 1)
        assert delivered(b, msg_id) == [], "delivered before its time"
        assert hops(b, msg_id) == [(level, T0 + due) for level, due in expected_hops]
        clock.now = T0 + arrives_ms
        await b.schedule.deliver_due()
        [m] = delivered(b, msg_id)
        assert_looks_delivered(m, msg_id, T0 + after_ms)
        assert b.schedule.pending() == 0 and b.schedule.hops == len(expected_hops) - 1
        await drive_until(b, clock, T0 + 3_600_000)
        assert len(delivered(b, msg_id)) == 1
    run(tmp_path, scenario)


@pytest.mark.parametrize("ago_ms", [0, 1, 3_600_000])
def test_a_delivery_time_now_or_past_is_delivered_at_once(tmp_path, clock, ago_ms):
    async def scenario(b):
        before = [b.store.max_offset(SCHEDULE_TOPIC, q) for q in range(len(b.schedule.levels_ms))]
        msg_id = await send_at(b, T0 - ago_ms)
        [m] = delivered(b, msg_id)
        assert_looks_delivered(m, msg_id, T0 - ago_ms)
        assert [b.store.max_offset(SCHEDULE_TOPIC, q) for q in range(len(b.schedule.levels_ms))] == before
    run(tmp_path, scenario)


def test_delivery_times_more_than_a_day_ahead_and_bad_combinations_are_refused(tmp_path, clock):
    async def scenario(b):
        with pytest.raises(DeliveryTimeError, match="too far ahead") as refused:
            await send_at(b, T0 + MAX_DELIVERY_DELAY_MS + 1)
        assert isinstance(refused.value, InvalidArgumentError)
        with pytest.raises(DeliveryTimeError, match="milliseconds"):
            await send_at(b, -5)
        with pytest.raises(InvalidArgumentError, match="exclude each other") as both:
            await send_at(b, T0 + 5_000, delay_level=2)
        assert not isinstance(both.value, DeliveryTimeError)
        with pytest.raises(InvalidArgumentError, match="batch"):
            await b.sender.send("T", 1, [OutgoingMessage(b"a", deliver_at_ms=T0 + 5_000), OutgoingMessage(b"b")])
        assert messages(b, "T", 1) == [] and b.schedule.pending() == 0
        # Exactly a day ahead is allowed: 12 hops of 2 h.
        msg_id = await send_at(b, T0 + MAX_DELIVERY_DELAY_MS)
        await drive_until(b, clock, T0 + MAX_DELIVERY_DELAY_MS - 1)
        assert delivered(b, msg_id) == []
        await drive_until(b, clock, T0 + MAX_DELIVERY_DELAY_MS)
        assert [level for level, _ in hops(b, msg_id)] == [18] * 12
        assert len(delivered(b, msg_id)) == 1
    run(tmp_path, scenario)


def test_delay_levels_and_delivery_times_share_the_levels(tmp_path, clock):
    async def scenario(b):
        [level_sent] = await b.sender.send("T", 1, [OutgoingMessage(b"level", delay_level=2)])  # 5 s
        timed = await send_at(b, T0 + 5_000)  # also level 2, one hop
        await drive_until(b, clock, T0 + 4_999)
        assert messages(b, "T", 1) == []
        await drive_until(b, clock, T0 + 5_000)
        by_id = {m.properties[PropertyKey.UNIQ_KEY]: m for m in messages(b, "T", 1)}
        assert set(by_id) == {level_sent.msg_id, timed}
        # A delay-level message arrives as before: no DELAY, no DELIVER_TIMESTAMP.
        assert PropertyKey.DELIVER_TIMESTAMP not in by_id[level_sent.msg_id].properties
        assert PropertyKey.DELAY not in by_id[level_sent.msg_id].properties
        assert_looks_delivered(by_id[timed], timed, T0 + 5_000)
    run(tmp_path, scenario)


def test_a_restart_mid_hop_delivers_exactly_once(tmp_path, clock):
    deliver_at = T0 + 137_500

    async def main():
        b = await started(tmp_path)
        try:
            msg_id = await send_at(b, deliver_at)
            await drive_until(b, clock, T0 + 135_500)  # 2m, 10s, 5s done; waiting in level 1 (1 s)
            assert [level for level, _ in hops(b, msg_id)] == [6, 3, 2, 1]
            assert delivered(b, msg_id) == []
        finally:
            await b.shutdown()
        progress = json.loads((tmp_path / "config" / "delayOffset.json").read_text())["offsetTable"]
        assert {level: progress.get(level) for level in ("6", "3", "2", "1")} == {"6": 1, "3": 1, "2": 1, "1": None}

        clock.now += 10  # the broker was down for a while
        b = await started(tmp_path)
        try:
            assert delivered(b, msg_id) == []
            await drive_until(b, clock, deliver_at - 1)
            assert delivered(b, msg_id) == []
            await drive_until(b, clock, deliver_at + 1_000)  # at most the shortest level late
            [m] = delivered(b, msg_id)
            assert_looks_delivered(m, msg_id, deliver_at)
            await drive_until(b, clock, T0 + 600_000)
            assert len(delivered(b, msg_id)) == 1 and b.schedule.pending() == 0
        finally:
            await b.shutdown()
    asyncio.run(main())


def test_on_the_real_clock_a_message_due_in_3_5_s_arrives_then_and_not_before(tmp_path):
    async def main():
        b = await started(tmp_path)
        try:
            deliver_at = controller_module.now_ms() + 3_500
            message = OutgoingMessage(body=b"timed", tags="TagA", keys="k1 k2", properties={"user": "v"},
                                      deliver_at_ms=deliver_at)
            [sent] = await b.sender.send("T", 1, [message])
            seen_at = None
            deadline = time.monotonic() + 10
            while seen_at is None and time.monotonic() < deadline:
                found = delivered(b, sent.msg_id)
                now = controller_module.now_ms()
                if found:
                    seen_at = now
                else:
                    await asyncio.sleep(0.02)
            assert seen_at is not None, "not delivered within 10 s"
            [m] = delivered(b, sent.msg_id)
            assert_looks_delivered(m, sent.msg_id, deliver_at, born=m.born_timestamp)
            assert deliver_at - 3_500 <= m.born_timestamp < deliver_at
            assert seen_at >= deliver_at and m.store_timestamp >= deliver_at, "delivered early"
            assert m.store_timestamp <= deliver_at + 1_500, "more than ~1 s late"
        finally:
            await b.shutdown()
    asyncio.run(main())
