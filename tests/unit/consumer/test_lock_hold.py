"""LockHold: the holder counts on a lock for half the broker's expiry after the asking the broker answered,
never longer, so it stops before the broker can let the lock go (lock_hold.py)."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from tidemark.client.consumer.lock_hold import DEFAULT_BROKER_LOCK_EXPIRY_MS, LockHold


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_hold_counts_half_the_broker_s_expiry_from_the_asking():
    clock = Clock()
    hold = LockHold(clock)
    assert hold.lapsed()  # nothing granted yet
    hold.confirm(sent_at=99.0, expiry_ms=3_000)  # answered a second after the asking
    clock.now = 100.49
    assert not hold.lapsed()
    clock.now = 100.5
    assert hold.lapsed()


def test_a_broker_that_does_not_say_is_taken_for_the_default_expiry():
    clock = Clock()
    hold = LockHold(clock)
    hold.confirm(sent_at=100.0, expiry_ms=0)
    clock.now = 100.0 + DEFAULT_BROKER_LOCK_EXPIRY_MS / 2000 - 0.01
    assert not hold.lapsed()
    clock.now += 0.02
    assert hold.lapsed()


def test_a_lapse_counts_on_nothing_until_the_next_confirmation():
    clock = Clock()
    hold = LockHold(clock)
    hold.confirm(sent_at=100.0, expiry_ms=60_000)
    hold.lapse()  # (its broker's stream broke: the broker may have restarted and forgotten the lock)
    assert hold.lapsed()
    hold.confirm(sent_at=100.0, expiry_ms=60_000)
    assert not hold.lapsed()


# (sent_at, expiry_ms) of answered requests, in any order: answers can come back out of order.
confirms = st.lists(st.tuples(st.floats(0, 1_000), st.integers(1, 120_000)), min_size=1, max_size=8)


@given(confirms, st.floats(0, 1_200))
def test_held_exactly_until_half_an_expiry_after_the_latest_deadline_and_never_past_a_broker_s(answers, now):
    clock = Clock()
    hold = LockHold(clock)
    for sent_at, expiry_ms in answers:
        hold.confirm(sent_at, expiry_ms)
    clock.now = now
    assert hold.lapsed() == (now >= max(s + e / 2000 for s, e in answers))
    if not hold.lapsed():
        # The broker that answered the request behind it keeps the lock at least until `expiry` after
        # the asking: half an expiry more than this holder counts on it.
        assert any(now + e / 2000 <= s + e / 1000 for s, e in answers)


def test_changed_returns_at_a_confirmation_or_the_queue_leaving_else_at_the_timeout():
    async def scenario():
        hold = LockHold()
        waiter = asyncio.create_task(hold.changed(30.0))
        await asyncio.sleep(0)
        hold.confirm(sent_at=0.0, expiry_ms=1_000)
        await asyncio.wait_for(waiter, 1)
        waiter = asyncio.create_task(hold.changed(30.0))
        await asyncio.sleep(0)
        hold.wake()  # (OwnedQueue.transition: the queue is leaving)
        await asyncio.wait_for(waiter, 1)
        await asyncio.wait_for(hold.changed(0.01), 1)  # nobody wakes it: the timeout ends it
    asyncio.run(scenario())
