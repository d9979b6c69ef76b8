"""The producer's record accumulator (client/producer/accumulator.py): when a send_async batch leaves.

Natural batching (Nagle's rule): an open batch leaves at once while its broker has no request in flight,
and gathers messages while one is; a batch that grows past a sixteenth of batch_size leaves anyway (so
a heavy load still pipelines), and a full one always does. Pure tests: a fake clock, no broker."""

from __future__ import annotations

from tidemark.client.message import MessageQueue
from tidemark.client.producer.accumulator import RecordAccumulator

A0, A1, B0 = MessageQueue("T", "broker-a", 0), MessageQueue("T", "broker-a", 1), MessageQueue("T", "broker-b", 0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def accumulator(batch_size: int = 16 * 1024, linger_s: float = 0.0, busy: set[str] | None = None):
    wakes: list[int] = []
    clock = Clock()
    acc = RecordAccumulator(batch_size=batch_size, linger_s=linger_s, born_host="127.0.0.1",
                            wake=lambda: wakes.append(1), clock=clock, busy=set() if busy is None else busy)
    return acc, wakes, clock


def put(acc: RecordAccumulator, mq: MessageQueue, n: int = 1, size: int = 100) -> None:
    for i in range(n):
        acc.append([mq], mq, b"x" * size, b"", msg_id=f"id{i}", tags_code=0, flag=0)


def test_a_batch_of_an_idle_broker_leaves_at_once():
    acc, wakes, _ = accumulator()
    put(acc, A0)
    assert wakes == [1]
    assert acc.next_ready_in() == 0.0
    assert [b.mq for b in acc.drain(5)] == [A0]


def test_a_batch_gathers_messages_while_its_broker_has_a_request_in_flight():
    acc, _, _ = accumulator()
    put(acc, A0, 5)
    busy = {"broker-a"}
    assert acc.next_ready_in(busy) is None  # nothing to time: the answer in flight wakes the sender
    assert acc.drain(5, busy) == []
    put(acc, A0, 5)
    [batch] = acc.drain(5, set())  # the answer came
    assert batch.count == 10


def test_a_new_batch_of_a_busy_broker_does_not_wake_the_sender():
    # The answer in flight wakes the sender, which then drains the batch: a wake-up now is a hop to the
    # loop thread that finds the batch waiting.
    busy: set[str] = {"broker-a"}
    acc, wakes, _ = accumulator(busy=busy)
    put(acc, A0, 3)
    assert wakes == []
    put(acc, B0)  # broker-b is idle: its batch leaves at once
    assert wakes == [1]
    assert [b.mq for b in acc.drain(5, busy)] == [B0]
    busy.clear()  # the answer came (the sender marks the broker idle, then drains)
    [batch] = acc.drain(5, busy)
    assert (batch.mq, batch.count) == (A0, 3)
    put(acc, A0)  # the broker idle now: a new batch wakes the sender again
    assert len(wakes) == 2


def test_whichever_comes_second_of_a_new_batch_and_the_answer_sees_the_other():
    # The answer's side marks the broker idle before it drains; the new batch's side looks at the broker
    # after its batch is in place. Either the drain takes the batch, or the batch wakes the sender.
    for answer_first in (False, True):
        busy: set[str] = {"broker-a"}
        acc, wakes, _ = accumulator(busy=busy)
        if answer_first:
            busy.clear()
            assert acc.drain(5, busy) == []
            put(acc, A0)
            assert wakes == [1]
        else:
            put(acc, A0)
            assert wakes == []
            busy.clear()
            assert [b.mq for b in acc.drain(5, busy)] == [A0]


def test_only_the_busy_broker_waits():
    acc, _, _ = accumulator()
    put(acc, A0)
    put(acc, B0)
    assert [b.mq for b in acc.drain(5, {"broker-a"})] == [B0]
    assert [b.mq for b in acc.drain(5, set())] == [A0]


def test_a_batch_past_a_sixteenth_of_batch_size_leaves_though_its_broker_is_busy():
    acc, wakes, _ = accumulator(batch_size=16 * 1024)  # the threshold: 1 KiB
    put(acc, A0, 1, size=100)
    wakes.clear()
    acc.drain(5, set())
    put(acc, A1, 1, size=100)
    assert acc.drain(5, {"broker-a"}) == []
    wakes.clear()
    put(acc, A1, 1, size=1000)  # crosses 1 KiB: the sender is woken to send it
    assert wakes == [1]
    assert acc.next_ready_in({"broker-a"}) == 0.0
    [batch] = acc.drain(5, {"broker-a"})
    assert batch.count == 2


def test_a_full_batch_leaves_whatever_is_in_flight():
    acc, _, _ = accumulator(batch_size=1024)
    put(acc, A0, 1, size=2000)  # sealed at once
    assert acc.next_ready_in({"broker-a"}) == 0.0
    assert [b.mq for b in acc.drain(5, {"broker-a"})] == [A0]


def test_linger_still_holds_a_batch_of_an_idle_broker():
    acc, _, clock = accumulator(linger_s=0.005)
    put(acc, A0)
    assert acc.drain(5) == []
    assert abs(acc.next_ready_in() - 0.005) < 1e-9
    clock.now += 0.006
    assert [b.mq for b in acc.drain(5)] == [A0]
