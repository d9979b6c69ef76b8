"""Review of the consumer's join and hand-over changes (issue 30), against the scripted broker of
test_ownership.py: lock requests that wait on the broker hold up neither the consumer's other changes
nor each other, a pause after a failed start delays that queue alone, a gathered final call that the
broker refuses whole is asked again queue by queue, a cancelled rider does not take the call down with
it, and a final call pending when the consumer stops is asked once more with the full request time."""

from __future__ import annotations

import asyncio

from test_ownership import MQ, MQ1, Hooks, ScriptedBroker, ownership

from tidemark.client.consumer import ownership as ownership_module
from tidemark.client.consumer import pending_unlocks
from tidemark.client.consumer.queue_state import QueueState
from tidemark.client.errors import PermissionDeniedError, RequestTimeoutError
from tidemark.client.message import MessageQueue

HELD = MessageQueue("H", "broker-a", 0)


class HeldElsewhere(ScriptedBroker):
    """Queues of topics other than H are held by another client until `released` is set; renewals and
    H's queue are granted at once. `waiting` counts the lock requests waiting on the broker now."""

    def __init__(self) -> None:
        super().__init__()
        self.released = asyncio.Event()
        self.waiting = 0
        self.asked: list[tuple[int, list[MessageQueue]]] = []  # (wait_ms, queues) of each lock request

    async def lock_queues(self, group, client_id, mqs, *, wait_ms=0, renew=False):
        self.asked.append((wait_ms, sorted(mqs)))
        if not renew and any(mq.topic != "H" for mq in mqs):
            self.waiting += 1
            try:
                await self.released.wait()
            finally:
                self.waiting -= 1
        self.grant_now = True
        return await super().lock_queues(group, client_id, mqs, renew=renew)


def test_first_lock_requests_that_wait_hold_up_neither_other_topics_nor_renewals(monkeypatch):
    """The first request of queues that arrive waits on the broker for a release (FIRST_LOCK_WAIT_MS):
    it ran inside update() under the ownership lock, one topic after the other, so a pass over N topics
    whose queues nobody released took N waits, and renewals (and lose(), and waiters' grants) waited
    behind it."""
    monkeypatch.setattr(ownership_module, "FIRST_LOCK_WAIT_MS", 60_000)  # (only the release ends a wait)

    async def scenario():
        broker, hooks = HeldElsewhere(), Hooks()
        own = ownership(broker, hooks, settle=False)
        await own.update("H", {HELD})
        await asyncio.wait_for(own.settle(), 5)
        assert own.get(HELD).state is QueueState.PULLING
        for i in range(5):  # a pass over five topics whose queues are all held elsewhere
            await asyncio.wait_for(own.update(f"T{i}", {MessageQueue(f"T{i}", "broker-a", 0)}), 5)
        while broker.waiting < 5:
            await asyncio.sleep(0)  # all five first requests wait on the broker at once
        await asyncio.wait_for(own.renew_locks(), 5)  # not behind them
        assert own.get(HELD).state is QueueState.PULLING and broker.waiting == 5
        broker.released.set()
        await asyncio.wait_for(own.settle(), 5)
        assert all(own.get(MessageQueue(f"T{i}", "broker-a", 0)).state is QueueState.PULLING for i in range(5))
        assert [wait for wait, _ in broker.asked if wait] == [60_000] * 6  # one request each, no second
        await own.stop()
    asyncio.run(scenario())


def test_a_failed_start_pauses_that_queue_alone(monkeypatch):
    """A start offset that cannot be read is asked again after LOCK_RETRY_DELAY_S; the sibling asked for
    in the same request, simply not granted yet (held by its previous owner), waited that pause too
    instead of having its waiting request go at once."""
    monkeypatch.setattr(ownership_module, "LOCK_RETRY_DELAY_S", 60.0)  # (the pause never ends here)

    class GrantsMQ(ScriptedBroker):
        def __init__(self) -> None:
            super().__init__()
            self.asked: list[tuple[int, list[MessageQueue]]] = []

        async def lock_queues(self, group, client_id, mqs, *, wait_ms=0, renew=False):
            self.asked.append((wait_ms, sorted(mqs)))
            self.grant_now = True
            return await super().lock_queues(group, client_id, [mq for mq in mqs if mq == MQ], renew=renew)

    class FailsOnce(Hooks):
        async def start_offset(self, mq, committed):
            self.start_attempts += 1
            if self.start_attempts == 1:
                raise RequestTimeoutError("max offset: no answer")
            return 0

    async def scenario():
        broker, hooks = GrantsMQ(), FailsOnce()
        own = ownership(broker, hooks)
        await own.update("T", {MQ, MQ1})  # MQ granted, its start fails; MQ1 held by its previous owner
        for _ in range(1000):
            if (ownership_module.LOCK_WAIT_MS, [MQ1]) in broker.asked:
                break
            await asyncio.sleep(0)
        assert broker.asked[1:] == [(ownership_module.LOCK_WAIT_MS, [MQ1])]  # at once, MQ's own retry later
        assert own.get(MQ).state is QueueState.LOCKING and hooks.start_attempts == 1
        await own.stop()
    asyncio.run(scenario())


def test_a_gathered_final_call_refused_whole_is_asked_again_queue_by_queue():
    """The group may no longer consume topic B (an operator revoked it): the broker refuses any call
    naming B whole. Released together, A's final commit went down with B's, and at shutdown nothing
    asked again."""
    A0, B0 = MessageQueue("A", "broker-a", 0), MessageQueue("B", "broker-a", 0)

    class RefusesB(ScriptedBroker):
        async def unlock_queues(self, group, client_id, mqs, final_offsets=(), tokens=()):
            if any(mq.topic == "B" for mq in mqs):
                self.unlock_calls += 1
                raise PermissionDeniedError("group g may not consume B")
            return await super().unlock_queues(group, client_id, mqs, final_offsets, tokens)

    async def scenario():
        broker = RefusesB()
        broker.grant_now = True
        own = ownership(broker, Hooks())
        await own.update("A", {A0})
        await own.update("B", {B0})
        own._store.update_offset(A0, 5, increase_only=True)
        await own.stop()  # shutdown: stop, then release_all
        await own.release_all()
        assert broker.final_offsets == [(A0, 5)] and broker.unlocked == [A0]
        assert own.pending_unlocks == 0  # B's refusal is for good: not parked to be asked again
    asyncio.run(scenario())


def test_a_cancelled_rider_does_not_cost_the_others_in_its_call_their_final_commit():
    """The gathered call was sent by the first queue's release task: cancelling that task failed the
    other queues in the call with CancelledError, left them DRAINING with no unlock and no final commit,
    and update() raised CancelledError though nobody had cancelled it."""
    async def scenario():
        broker = ScriptedBroker()
        broker.grant_now = True
        own = ownership(broker, Hooks())
        await own.update("T", {MQ, MQ1})
        own._store.update_offset(MQ1, 7, increase_only=True)
        broker.unlock_gate = asyncio.Event()  # the call is under way at the broker
        handing_over = asyncio.ensure_future(own.update("T", set()))
        while broker.unlock_calls == 0:
            await asyncio.sleep(0)
        own.get(MQ).release_task.cancel()
        broker.unlock_gate.set()
        await asyncio.wait_for(handing_over, 5)
        assert own.get(MQ1) is None and (MQ1, 7) in broker.final_offsets and MQ1 in broker.unlocked
        await own.stop()
    asyncio.run(scenario())


def test_a_bounded_final_call_pending_when_the_consumer_stops_is_asked_again_with_the_full_time(monkeypatch):
    """A hand-over's final call started during a rebalance with the running bound (FINAL_UNLOCK_WAIT_S),
    still pending when stop() ran, timed out after it: retries were closed by then, and its final commit
    was lost."""
    monkeypatch.setattr(pending_unlocks, "FINAL_UNLOCK_WAIT_S", 0.05)

    class BusyOnce(ScriptedBroker):
        async def unlock_queues(self, *args, **kwargs):
            if self.unlock_calls == 0:
                self.unlock_calls += 1
                await asyncio.Event().wait()  # the first call gets no answer (the bound gives it up)
            return await super().unlock_queues(*args, **kwargs)

    async def scenario():
        broker = BusyOnce()
        broker.grant_now = True
        own = ownership(broker, Hooks())
        await own.update("T", {MQ})
        own._store.update_offset(MQ, 5, increase_only=True)
        rebalance = asyncio.ensure_future(own.update("T", set()))  # a rebalance hands MQ over...
        while broker.unlock_calls == 0:
            await asyncio.sleep(0)
        await own.stop()  # ...and the consumer shuts down meanwhile
        await asyncio.wait_for(own.release_all(), 5)
        await asyncio.wait_for(rebalance, 5)
        assert broker.final_offsets == [(MQ, 5)] and own.pending_unlocks == 0
    asyncio.run(scenario())
