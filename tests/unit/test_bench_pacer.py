"""The benchmarks' fixed-rate sender: every message leaves when it falls due, alone, at a rate the sender
keeps up with. (It used to sleep one period too long after each message, so at 1,000 msg/s half the
messages left 1 ms late, in pairs, and every paced latency figure carried that millisecond.)"""

from __future__ import annotations

import asyncio

import pytest

from bench.workloads import Pacer, header


class FakeClock:
    """A monotonic clock that only moves when the sender sleeps."""

    def __init__(self) -> None:
        self.ns = 10**12

    def __call__(self) -> int:
        return self.ns

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.ns += round(seconds * 1e9)


def _send_all(pacer: Pacer, clock: FakeClock) -> list[tuple[int, int, int]]:
    """(seq, due stamp, time sent) for every message, sending each batch the pacer hands out at once."""
    sent = []
    while n := pacer.due():
        for _ in range(n):
            seq = pacer.sent
            stamp, got_seq = header(pacer.next_payload())
            assert got_seq == seq
            sent.append((seq, stamp, clock.ns))
    return sent


@pytest.mark.parametrize("rate", [1_000, 5_000, 20_000, 3_333])
def test_a_sender_that_keeps_up_sends_every_message_alone_when_it_falls_due(rate):
    clock = FakeClock()
    pacer = Pacer(rate, 200, clock_ns=clock, sleep=clock.sleep)
    bursts = []
    while n := pacer.due():
        bursts.append(n)
        for _ in range(n):
            stamp, seq = header(pacer.next_payload())
            assert seq == pacer.sent - 1
            assert stamp == pacer.started_ns + int(seq * 1e9 / rate)
            # Sent at its due time (the fake clock rounds sleeps to the nanosecond).
            assert abs(clock.ns - stamp) <= 2, (seq, clock.ns - stamp)
    assert bursts == [1] * 200


def test_a_sender_that_fell_behind_sends_what_is_due_at_once_up_to_the_burst_limit():
    clock = FakeClock()
    pacer = Pacer(1_000, 500, max_burst=64, clock_ns=clock, sleep=clock.sleep)
    assert pacer.due() == 1
    pacer.next_payload()
    clock.ns += 100_000_000  # the sender stalled for 100 ms: messages 1..100 are due
    assert pacer.due() == 64
    for _ in range(64):
        pacer.next_payload()
    assert pacer.due() == 100 - 64
    for _ in range(36):
        pacer.next_payload()
    sent = _send_all(pacer, clock)
    assert [s for s, _, _ in sent] == list(range(101, 500))
    assert all(abs(at - stamp) <= 2 for _, stamp, at in sent)


def test_publish_latency_is_counted_from_the_due_time_past_the_first_half_second():
    clock = FakeClock()
    pacer = Pacer(100, 200, clock_ns=clock, sleep=clock.sleep)
    clock.ns = pacer.stamp(10) + 3_000_000
    pacer.acked(10)  # in the first half second (50 messages at 100/s): left out
    clock.ns = pacer.stamp(60) + 3_000_000
    pacer.acked(60)
    assert pacer.publish_us == [3000.0]


def test_the_async_sender_sleeps_until_the_next_message_falls_due(monkeypatch):
    clock = FakeClock()
    slept = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.sleep(seconds)
    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    pacer = Pacer(2_000, 50, clock_ns=clock)

    async def run() -> list[int]:
        bursts = []
        while n := await pacer.adue():
            bursts.append(n)
            for _ in range(n):
                pacer.next_payload()
        return bursts
    assert asyncio.run(run()) == [1] * 50
    assert slept == pytest.approx([0.0005] * 49, abs=1e-9)
