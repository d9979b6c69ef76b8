"""The broker's FIFO receive (broker/pop/service.py over fifo.py) with a slow message group: its backlog is
read once and held (the cursor moves past it), not read again at every receive; the other groups of the queue
flow behind a backlog longer than one receive's scan; and held messages are still delivered, and the committed
offset moves on, once the group is no longer orderly."""

from __future__ import annotations

from test_pop_service import request
from test_pop_service import run as run_broker

from tidemark.broker.controller import BrokerController
from tidemark.broker.ingest.send import OutgoingMessage
from tidemark.broker.pop.service import FIFO_MAX_SCAN, MAX_SCAN


def run(tmp_path, scenario):
    """test_pop_service's broker (topic T, one queue) with group g consuming orderly."""
    async def orderly(b: BrokerController):
        b.groups.update("g", consume_orderly=True)
        await scenario(b)

    run_broker(tmp_path, orderly)


async def put(b: BrokerController, *bodies: str) -> None:
    """One stored batch; a body "slow-3" is of message group "slow"."""
    await b.sender.send("T", 0, [OutgoingMessage(body=body.encode(), properties={"__SHARDINGKEY": body.split("-")[0]})
                                 for body in bodies])


def bodies(got) -> list[str]:
    return [r.message.body.decode() for r in got]


def count_reads(b: BrokerController) -> list[int]:
    """Messages the pop service reads from the store from now on (a counter around the real read)."""
    read, get_messages = [0], b.pop._store.get_messages

    def counting(*args, **kwargs):
        got = get_messages(*args, **kwargs)
        read[0] += len(got.messages)
        return got

    b.pop._store.get_messages = counting
    return read


def test_a_busy_groups_backlog_is_read_once_not_at_every_receive(tmp_path):
    async def scenario(b):
        await put(b, *[f"slow-{i}" for i in range(600)])
        [slow] = await b.pop.receive(request(batch=1))
        read = count_reads(b)
        for _ in range(20):
            assert await b.pop.receive(request(batch=32)) == []
        assert read[0] <= 600, f"20 empty receives read {read[0]} messages of a backlog of 599"
        assert b.pop.ledger.cursor(next(b.pop.ledger.keys())) == 600
        b.pop.ack("g", "T", slow.handle)
        got = await b.pop.receive(request(batch=32))
        assert bodies(got) == [f"slow-{i}" for i in range(1, 33)] and read[0] <= 600
        assert b.offsets.query("g", "T", 0) == 1

    run(tmp_path, scenario)


def test_other_groups_flow_behind_a_busy_groups_backlog_longer_than_a_receives_scan(tmp_path):
    backlog = max(MAX_SCAN, FIFO_MAX_SCAN) + 100

    async def scenario(b):
        await put(b, *[f"slow-{i}" for i in range(backlog)], "a-0", "a-1", "a-2")
        [slow] = await b.pop.receive(request(batch=1))
        read, got = count_reads(b), []
        for _ in range(10):
            got += await b.pop.receive(request(batch=32))
        assert bodies(got) == ["a-0", "a-1", "a-2"] and read[0] <= backlog + 2
        assert b.offsets.query("g", "T", 0) <= 0, "the committed offset stays at the unacked slow-0"

    run(tmp_path, scenario)


def test_held_messages_are_delivered_once_the_group_is_no_longer_orderly(tmp_path):
    async def scenario(b):
        await put(b, "slow-0", "a-0", "slow-1", "a-1")
        [slow] = await b.pop.receive(request(batch=1))
        got = await b.pop.receive(request(batch=32))
        assert bodies(got) == ["a-0", "a-1"]  # slow-1 held behind slow-0
        for r in [*got, slow]:
            b.pop.ack("g", "T", r.handle)
        assert b.offsets.query("g", "T", 0) == 2
        b.groups.update("g", consume_orderly=False)
        await put(b, "a-2")
        got = await b.pop.receive(request(batch=32))
        assert [(r.message.body.decode(), r.attempt) for r in got] == [("slow-1", 1), ("a-2", 1)]
        for r in got:
            b.pop.ack("g", "T", r.handle)
        assert b.offsets.query("g", "T", 0) == 5 and b.pop.ledger.pending(next(b.pop.ledger.keys())) == []

    run(tmp_path, scenario)
