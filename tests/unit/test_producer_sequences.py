"""client/producer/sequences.py: a queue's window of batches in flight, recovery, and when numbers may change."""

from __future__ import annotations

import asyncio

import pytest

from tidemark.client.errors import QueueInDoubtError
from tidemark.client.message import MessageQueue
from tidemark.client.producer.sequences import ProducerSequences, QueueSequence


def run(coro):
    return asyncio.run(coro)


async def admitted(state: QueueSequence, count: int, pid: int = 7):
    """The slot if `admit` returns without waiting, else None (the waiting admit is cancelled)."""
    task = asyncio.ensure_future(state.admit(count, pid))
    await asyncio.sleep(0)
    if task.done():
        return task.result()
    task.cancel()
    return None


def test_batches_are_numbered_in_order_up_to_the_window_then_wait_for_one_to_settle():
    async def go():
        state = QueueSequence(epoch=3, max_in_flight=3)
        slots = [await state.admit(n, 7) for n in (2, 5, 1)]
        assert [s.numbers for s in slots] == [(7, 3, 0), (7, 3, 2), (7, 3, 7)]
        waiting = asyncio.ensure_future(state.admit(4, 7))
        await asyncio.sleep(0)
        assert not waiting.done(), "a fourth batch waits while three are in flight"
        state.settle(slots[1], stored=True)  # answers may come out of order (another stream): room is room
        assert (await waiting).numbers == (7, 3, 8)
    run(go())


def test_a_failure_stops_admissions_and_retries_go_oldest_first_until_the_window_is_empty():
    async def go():
        state = QueueSequence(max_in_flight=5)
        a, b, c = [await state.admit(1, 7) for _ in range(3)]
        state.failed(b, doubt=True)
        assert await admitted(state, 1) is None, "recovering: nothing new is numbered"
        b_turn = asyncio.ensure_future(state.turn(b))
        await asyncio.sleep(0)
        assert not b_turn.done(), "b tries again only after a, which is still on its way, is settled"
        state.settle(a, stored=True)
        await b_turn
        state.settle(b, stored=True)
        state.settle(c, stored=True)
        assert not state.recovering
        assert (await admitted(state, 1)).numbers == (7, 0, 3)
    run(go())


def test_a_refused_last_batch_frees_its_sequence_but_one_with_later_batches_starts_a_new_epoch():
    async def go():
        state = QueueSequence(epoch=0)
        a = await state.admit(2, 7)
        state.settle(a, stored=False)
        assert (state.epoch, state.next_seq) == (0, 0), "surely not stored and the last one: reused"
        a, b = await state.admit(2, 7), await state.admit(3, 7)
        state.settle(a, stored=False)
        assert (state.epoch, state.next_seq) == (1, 0), "b would wait forever on a's gap"
        assert state.recovering and state.stale(b, 7)
        state.failed(b, doubt=False)  # its answer: the gap
        await state.turn(b)
        state.renumber(b, 7)
        assert b.numbers == (7, 1, 0)
    run(go())


def test_a_batch_whose_outcome_is_unknown_keeps_its_numbers_and_giving_up_on_it_starts_a_new_epoch():
    async def go():
        state = QueueSequence(epoch=0)
        a, b = await state.admit(1, 7), await state.admit(1, 7)
        state.failed(a, doubt=True)
        with pytest.raises(AssertionError):
            state.renumber(a, 7)
        state.settle(a, stored=False)
        assert state.epoch == 1 and state.stale(b, 7)
        state.failed(b, doubt=True)
        assert b.numbers == (7, 0, 1), "b may be stored (if a was): it resolves under its own numbers first"
    run(go())


def test_a_forgotten_producer_id_makes_every_queue_of_its_broker_start_again():
    async def go():
        sequences = ProducerSequences(epoch=4)
        mq_a, mq_b = MessageQueue("T", "broker-a", 0), MessageQueue("T", "broker-b", 0)
        assert await sequences.producer_id("broker-a", _init(11)) == 11
        slot = await sequences.queue(mq_a).admit(3, 11)
        await sequences.queue(mq_b).admit(3, 11)
        sequences.forget_broker("broker-a", 11)
        assert await sequences.producer_id("broker-a", _init(12)) == 12
        assert sequences.queue(mq_a).stale(slot, 12) and sequences.queue(mq_a).next_seq == 0
        assert sequences.queue(mq_b).next_seq == 3
    run(go())


def _init(pid: int):
    async def init(key: str) -> int:
        return pid
    return init


def test_a_keyed_producer_halts_the_queue_instead_of_moving_to_a_new_epoch():
    """Review finding: the Spark sink's producer (keyed, its epoch fixed per task attempt) gave up a batch in
    doubt; the later batches of its queue moved to a new epoch and were stored, so the task's replay under
    the same epoch was fenced on every attempt. The queue halts instead, and nothing after it is sent."""
    async def go():
        state = ProducerSequences("spark:q:0", epoch=7 << 16).queue(MessageQueue("T", "b", 0))
        a, b, c = [await state.admit(1, 9) for _ in range(3)]
        waiting = asyncio.ensure_future(state.admit(1, 9))  # a fourth, beyond a window of 3... or 5: room left
        state.failed(a, doubt=True)
        b_turn = asyncio.ensure_future(state.turn(b))
        state.settle(a, stored=False)  # given up in doubt
        assert state.epoch == 7 << 16, "the epoch stays the owner's"
        with pytest.raises(QueueInDoubtError, match="given up in doubt under epoch 458752, sequence 0"):
            await b_turn
        state.settle(b, stored=False)
        state.settle(c, stored=False)
        if not waiting.done() or waiting.exception() is None:
            with pytest.raises(QueueInDoubtError):
                await waiting
        with pytest.raises(QueueInDoubtError):
            await state.admit(1, 9)
        assert state.epoch == 7 << 16

    run(go())


def test_an_unkeyed_producer_moves_on_to_a_new_epoch_after_a_batch_in_doubt():
    async def go():
        state = ProducerSequences().queue(MessageQueue("T", "b", 0))
        a, b = [await state.admit(1, 9) for _ in range(2)]
        state.failed(a, doubt=True)
        state.settle(a, stored=False)
        assert state.epoch == 1 and state.halted is None
        await state.turn(b)
        state.renumber(b, 9)
        assert b.numbers == (9, 1, 0)

    run(go())
