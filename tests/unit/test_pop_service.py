"""PopService on a real store and offset table with a controlled clock (no gRPC): redelivery after the
invisible time, the DLQ after the group's attempts, auto-renew for live clients only, admin resets,
stale and forged handles, and the committed offset following the smallest unfinished one."""

from __future__ import annotations

import asyncio

import pytest

import tidemark.broker.controller as controller_module
from tidemark.broker.config import BrokerConfig
from tidemark.broker.controller import BrokerController
from tidemark.broker.ingest.send import OutgoingMessage
from tidemark.broker.offsets.commits import ResetKind, ResetTarget
from tidemark.broker.pop.handles import ForgedReceiptHandleError, StaleReceiptHandleError
from tidemark.broker.pop.service import (
    MAX_SCAN_PROPERTIES,
    InvisibleTimeError,
    ReceiveRequest,
    pop_retry_topic,
)
from tidemark.common.protocol import ExpressionType, dlq_topic, parse_filter, parse_tag_expression


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(controller_module, "now_ms", c)
    return c


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


def request(group: str = "g", *, invisible_ms: int = 10_000, client_id: str = "c1", auto_renew: bool = False,
            tags: str = "*", batch: int = 8) -> ReceiveRequest:
    return ReceiveRequest(group=group, topic="T", filter=parse_tag_expression(tags), batch=batch,
                          invisible_ms=invisible_ms, client_id=client_id, auto_renew=auto_renew)


async def send(b: BrokerController, *bodies: bytes, tags: str = "") -> None:
    for body in bodies:
        await b.sender.send("T", 0, [OutgoingMessage(body=body, tags=tags)])


def committed(b: BrokerController, group: str = "g", topic: str = "T") -> int:
    return b.offsets.query(group, topic, 0)


def test_unacked_message_comes_back_from_the_retry_topic_after_its_invisible_time(tmp_path, clock):
    async def scenario(b):
        await send(b, b"a", b"b")
        first = await b.pop.receive(request())
        assert [r.message.body for r in first] == [b"a", b"b"] and {r.attempt for r in first} == {1}
        b.pop.ack("g", "T", first[1].handle)
        assert committed(b) < 1, "a is unfinished: the committed offset stays below it"
        assert await b.pop.receive(request()) == []
        clock.now += 9_999
        await b.pop.revive_expired()
        assert await b.pop.receive(request()) == []
        clock.now += 1
        await b.pop.revive_expired()
        assert committed(b) == 2, "a was copied to the retry topic: the original queue is done"
        [again] = await b.pop.receive(request())
        assert (again.message.body, again.attempt, again.message.topic) == (b"a", 2, pop_retry_topic("g", "T"))
        assert again.message.msg_id == first[0].message.msg_id
        with pytest.raises(StaleReceiptHandleError, match="stale"):
            b.pop.ack("g", "T", first[0].handle)
        b.pop.ack("g", "T", again.handle)
        assert committed(b, topic=pop_retry_topic("g", "T")) == 1
    run(tmp_path, scenario)


def test_the_last_attempt_goes_to_the_dlq(tmp_path, clock):
    async def scenario(b):
        b.groups.update("g", retry_max_times=1)  # two deliveries in all
        await send(b, b"poison")
        for attempt in (1, 2):
            [r] = await b.pop.receive(request())
            assert r.attempt == attempt
            clock.now += 10_000
            await b.pop.revive_expired()
        assert await b.pop.receive(request()) == []
        [dead] = b.store.get_messages(dlq_topic("g"), 0, 0, 10).messages
        assert dead.body == b"poison" and dead.reconsume_times == 2 and dead.properties["RETRY_TOPIC"] == "T"
        assert b.pop.dead_lettered == 1
    run(tmp_path, scenario)


def test_auto_renew_keeps_a_live_clients_delivery_and_stops_for_a_gone_one(tmp_path, clock):
    async def scenario(b):
        await send(b, b"slow", b"slower")
        slice_ms = b.pop.ledger.settings.renew_slice_ms
        [kept] = await b.pop.receive(request(auto_renew=True, client_id="alive", invisible_ms=slice_ms, batch=1))
        [lost] = await b.pop.receive(request(auto_renew=True, client_id="gone", invisible_ms=slice_ms, batch=1))
        for _ in range(3):
            clock.now += slice_ms - 5_000
            b.pop.renew({"alive"})
            await b.pop.revive_expired()
        assert b.pop.revived == 1, "only the gone client's delivery expired"
        b.pop.ack("g", "T", kept.handle)  # the live client's handle is still its delivery
        assert lost.message.body == b"slower"
    run(tmp_path, scenario)


def test_a_reset_starts_the_pop_state_over_at_the_new_offset(tmp_path, clock):
    async def scenario(b):
        await send(b, b"0", b"1", b"2", b"3")
        got = await b.pop.receive(request())
        for r in got:
            b.pop.ack("g", "T", r.handle)
        assert committed(b) == 4
        await b.commits.reset("g", "T", 0, ResetTarget(ResetKind.OFFSET, 1), dry_run=False)
        again = await b.pop.receive(request())
        assert [r.message.body for r in again] == [b"1", b"2", b"3"]
    run(tmp_path, scenario)


def test_tag_filter_skips_count_as_done_and_bad_requests_change_nothing(tmp_path, clock):
    async def scenario(b):
        await send(b, b"x", tags="skip")
        await send(b, b"y", tags="keep")
        [r] = await b.pop.receive(request(tags="keep"))
        assert r.message.body == b"y"
        with pytest.raises(ForgedReceiptHandleError, match="forged"):
            b.pop.ack("g", "T", r.handle[:-2] + ("AA" if not r.handle.endswith("AA") else "BB"))
        with pytest.raises(InvisibleTimeError):
            await b.pop.receive(request(invisible_ms=5))
        with pytest.raises(Exception, match="not 'h'"):
            b.pop.ack("h", "T", r.handle)
        b.pop.ack("g", "T", r.handle)
        assert committed(b) == 2
    run(tmp_path, scenario)


def test_a_group_is_consumed_either_by_pop_or_by_queue_owners(tmp_path, clock):
    from tidemark.broker.errors import FailedPreconditionError

    async def scenario(b):
        await send(b, b"m")
        await b.lock_queues("owners", "127.0.0.1@c1", [("T", 0)])
        with pytest.raises(FailedPreconditionError, match="queue owners"):
            await b.pop.receive(request("owners"))
        await b.pop.receive(request("poppers"))
        with pytest.raises(FailedPreconditionError, match="consumed by pop"):
            await b.lock_queues("poppers", "127.0.0.1@c2", [("T", 0)])
    run(tmp_path, scenario)


def test_a_pop_journal_that_cannot_be_written_refuses_changes_and_shows_in_health(tmp_path, clock, monkeypatch):
    import errno
    import os

    from tidemark.broker.errors import StoreError

    async def scenario(b):
        await send(b, b"m")
        [r] = await b.pop.receive(request())
        real = os.write

        def full(fd, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "write", full)
        with pytest.raises(StoreError, match="nothing was changed"):
            b.pop.ack("g", "T", r.handle)
        assert "pop_state" in b.persistence.failing_parts()
        monkeypatch.setattr(os, "write", real)
        b.pop.ack("g", "T", r.handle)  # the failed ack changed nothing: the handle is still the delivery
        assert b.persistence.healthy and committed(b) == 1
    run(tmp_path, scenario)


def test_revived_and_dead_lettered_deliveries_are_counted_by_group(tmp_path, clock):
    async def scenario(b):
        b.groups.update("g", retry_max_times=1)
        await send(b, b"m")
        for _ in range(2):
            await b.pop.receive(request())
            clock.now += 10_000
            await b.pop.revive_expired()
        sample = b.metrics.registry.get_sample_value
        assert sample("tidemark_retries_total", {"group": "g"}) == 1
        assert sample("tidemark_dlq_messages_total", {"group": "g"}) == 1
    run(tmp_path, scenario)


def test_an_sql92_filter_delivers_the_matching_messages_and_the_skipped_ones_are_done(tmp_path, clock):
    async def scenario(b):
        for body, region in ((b"1", "us"), (b"2", "eu"), (b"3", "us"), (b"4", "eu"), (b"5", "us")):
            await b.sender.send("T", 0, [OutgoingMessage(body=body, properties={"region": region})])
        sql = ReceiveRequest(group="g", topic="T", filter=parse_filter("region = 'eu'", ExpressionType.SQL92),
                             batch=8, invisible_ms=10_000, client_id="c1")
        got = await b.pop.receive(sql)
        assert [r.message.body for r in got] == [b"2", b"4"]
        for r in got:
            b.pop.ack("g", "T", r.handle)
        assert committed(b) == 5, "the filtered-out messages count as done: the group has no lag"
    run(tmp_path, scenario)


def test_a_receive_scans_on_through_a_filtered_backlog_longer_than_one_window(tmp_path, clock):
    async def scenario(b):
        skipped = [OutgoingMessage(body=b"s", properties={"region": "us"})] * 50
        for _ in range(MAX_SCAN_PROPERTIES * 3 // 50):
            await b.sender.send("T", 0, skipped)
        await b.sender.send("T", 0, [OutgoingMessage(body=b"wanted", properties={"region": "eu"})])
        sql = ReceiveRequest(group="g", topic="T", filter=parse_filter("region = 'eu'", ExpressionType.SQL92),
                             batch=8, invisible_ms=10_000, client_id="c1", poll_ms=60_000)
        # The controlled clock does not move: a receive that parked would wait for a message that never comes.
        [got] = await asyncio.wait_for(b.pop.receive(sql), 10)
        assert got.message.body == b"wanted"
        b.pop.ack("g", "T", got.handle)
        assert committed(b) == MAX_SCAN_PROPERTIES * 3 + 1
    run(tmp_path, scenario)
