"""Review of the consumer's lock requests and hand-overs, against the scripted broker of test_ownership.py:
a lock request whose start raises something unexpected does not leave its queues waiting for a lock
nobody asks for, a queue lost between its grant and its start is unlocked, a final commit that
fails during shutdown is asked once more before the consumer lets go of it (also of a broker that once did
not answer), and a lease_ended hook that raises does not leave its queue half released."""

from __future__ import annotations

import asyncio

import pytest
from test_ownership import (  # noqa: F401 - a fixture
    MQ,
    MQ1,
    Hooks,
    ScriptedBroker,
    _held_then_released_with_a_failed_unlock,
    ownership,
    quick_retries,
)

from tidemark.client.consumer import ownership as ownership_module
from tidemark.client.consumer import pending_unlocks
from tidemark.client.consumer.final_unlocks import FinalUnlocks
from tidemark.client.consumer.queue_state import QueueState
from tidemark.client.errors import ClientStateError, UnavailableError


async def _until(predicate, what: str) -> None:
    async with asyncio.timeout(5):
        while not predicate():
            await asyncio.sleep(0.005)


@pytest.mark.usefixtures("quick_retries")
def test_a_start_offset_hook_raising_an_unexpected_error_is_asked_again():
    """The lock request's task died with the OSError: the queue stayed LOCKING, and nothing asked for it
    again (before lock requests ran in tasks, the rebalance's own wait asked again)."""
    class RaisesOnce(Hooks):
        async def start_offset(self, mq, committed):
            self.start_attempts += 1
            if self.start_attempts == 1:
                raise OSError("offset file: I/O error")
            return 0

    async def scenario():
        broker, hooks = ScriptedBroker(), RaisesOnce()
        broker.grant_now = True
        own = ownership(broker, hooks)
        await own.update("T", {MQ, MQ1})
        await _until(lambda: own.get(MQ).state is QueueState.PULLING and own.get(MQ1).state is QueueState.PULLING,
                     "both queues pulling")
        assert hooks.start_attempts == 3 and len(hooks.started) == 2
        await own.stop()
    asyncio.run(scenario())


@pytest.mark.usefixtures("quick_retries")
def test_a_lease_that_cannot_start_lets_its_queue_go():
    """lease_started raising left the queue PULLING with nothing fetching it, for good. (The consumer is
    told after a pause: tests/integration/test_ownership_faults.py.)"""
    class StartRaises(Hooks):
        def __init__(self) -> None:
            super().__init__()
            self.lost = []

        async def lease_started(self, lease):
            raise RuntimeError("fetcher closed")

        def queue_lost(self, mq):
            self.lost.append(mq)

    async def scenario():
        broker, hooks = ScriptedBroker(), StartRaises()
        broker.grant_now = True
        own = ownership(broker, hooks)
        await own.update("T", {MQ})
        assert own.get(MQ) is None and broker.unlocked == [MQ]
        await _until(lambda: hooks.lost == [MQ], "the consumer told")  # its next rebalance takes it again
        await own.stop()
    asyncio.run(scenario())


@pytest.mark.usefixtures("quick_retries")
def test_a_queue_lost_between_its_grant_and_its_start_is_unlocked(monkeypatch):
    """A commit of an older lease came back fenced (lose(mq)) while the new lease's grant waited for the
    ownership lock: the queue was forgotten with the broker still holding its lock for us, so its next
    owner waited for the lock to expire."""
    monkeypatch.setattr(ownership_module, "FIRST_LOCK_WAIT_MS", 60_000)  # (only the release ends the wait)

    async def scenario():
        broker = ScriptedBroker()
        own = ownership(broker, Hooks(), settle=False)
        await own.update("T", {MQ})
        await _until(lambda: broker.lock_calls, "the first lock request on the broker")
        await own._lock.acquire()  # (what the lock request's task waits for once granted)
        lose = asyncio.create_task(own.lose(MQ, "commit fenced"))
        await asyncio.sleep(0)  # lose() waits for the ownership lock first
        broker.grant_now = True
        broker.release_waiters.set()
        await _until(lambda: own.get(MQ).owner_epoch is not None, "the grant applied")
        token = own.get(MQ).lock_token
        own._lock.release()
        await lose
        await own.settle()
        assert own.get(MQ) is None
        await asyncio.wait_for(own._unlocks.wait(), 5)
        assert broker.unlocked == [MQ] and MQ not in broker.tokens and token
        await own.stop()
    asyncio.run(scenario())


def test_a_final_commit_failing_during_shutdown_is_asked_once_more():
    """release_all after stop(): a final call that failed was parked for a retry task that stop() had
    closed, so the final commit never went out (the next owner read the queue again from an older
    offset)."""
    async def scenario():
        broker = ScriptedBroker()
        broker.grant_now = True
        own = ownership(broker, Hooks())
        await own.update("T", {MQ})
        own._store.update_offset(MQ, 5, increase_only=True)
        await own.stop()
        # The full-time call at release fails (at once: a connection reset); the one after it goes through.
        broker.unlock_failures, broker.unlock_error = 1, UnavailableError
        await own.release_all()
        assert broker.unlock_calls == 2
        assert broker.final_offsets == [(MQ, 5)] and broker.unlocked == [MQ] and own.pending_unlocks == 0
    asyncio.run(scenario())


def test_a_final_commit_left_undelivered_at_shutdown_is_told(caplog):
    async def scenario():
        broker = ScriptedBroker()
        broker.grant_now = True
        own = ownership(broker, Hooks())
        await own.update("T", {MQ})
        await own.stop()
        broker.unlock_failures = 2
        await own.release_all()
        assert broker.final_offsets == [] and own.pending_unlocks == 1
    asyncio.run(scenario())
    assert any("not delivered at shutdown" in r.getMessage() for r in caplog.records)


def test_final_unlocks_refuse_calls_once_closed():
    """A call after close() failed with a TypeError (shield of None) instead of the client's error."""
    async def scenario():
        finals = FinalUnlocks(ScriptedBroker(), "g", "c1")
        await finals.close()
        with pytest.raises(ClientStateError):
            await finals.send(MQ, None, 7, None)
    asyncio.run(scenario())


@pytest.mark.parametrize("retried", [True, False])
def test_a_broker_that_once_did_not_answer_is_asked_once_more_at_shutdown(monkeypatch, retried):
    """A broker was marked silent (its unlock got no answer) and only a retry's call could clear the mark.
    The queue was ours again before that call: the retry found nothing to ask (or, `retried` False, shutdown
    came first), so the mark stayed, and at shutdown a final call that the broker refused at once was not
    asked once more; its final commit was lost."""
    if retried:
        monkeypatch.setattr(pending_unlocks, "LOCK_RETRY_DELAY_S", 0.01)

    async def scenario():
        broker = ScriptedBroker()
        own = ownership(broker, Hooks())
        await _held_then_released_with_a_failed_unlock(broker, own)  # no answer in time: silent
        await own.update("T", {MQ})  # ours again
        if retried:
            await asyncio.wait_for(own._unlocks.wait(), 5)  # (which found nothing to ask)
        assert own.get(MQ).state is QueueState.PULLING
        own._store.update_offset(MQ, 7, increase_only=True)
        await own.stop()
        broker.unlock_failures, broker.unlock_error = 1, UnavailableError  # refused at once, then through
        await own.release_all()
        assert broker.final_offsets == [(MQ, 7)] and own.pending_unlocks == 0
    asyncio.run(scenario())


class EndRaises(Hooks):
    """A lease_ended hook with a defect."""

    def lease_ended(self, lease):
        raise RuntimeError("fetcher closed")


@pytest.mark.parametrize("locking", [True, False])
def test_a_lease_ended_hook_that_raises_does_not_leave_the_queue_half_released(caplog, locking):
    """lease_ended raised inside the release: the queue stayed RELEASED (or DRAINING) among the owned
    ones, so no later rebalance could take it again, and each one that let it go raised once more."""
    async def scenario():
        broker = ScriptedBroker()
        broker.grant_now = True
        own = ownership(broker, EndRaises())
        own.locking = locking
        await own.update("T", {MQ})
        own._store.update_offset(MQ, 5, increase_only=True)
        await own.update("T", set())
        assert own.get(MQ) is None
        if locking:
            assert broker.final_offsets == [(MQ, 5)] and own.handovers == 1
        await own.update("T", {MQ})  # taken again
        assert own.get(MQ).state is QueueState.PULLING
        await own.stop()
    asyncio.run(scenario())
    assert any("lease_ended failed" in r.getMessage() for r in caplog.records)


def test_a_lease_ended_hook_that_raises_does_not_keep_a_lost_queue():
    """lease_ended raised as a fenced lease lost its queue: the entry stayed LOST among the owned ones, and
    no later rebalance took the queue again (update() counted it as current)."""
    async def scenario():
        broker = ScriptedBroker()
        broker.grant_now = True
        own = ownership(broker, EndRaises())
        await own.update("T", {MQ})
        own.lose_lease(own.get(MQ).lease, "fenced")
        assert own.get(MQ) is None
        await own.update("T", {MQ})  # taken again
        assert own.get(MQ).state is QueueState.PULLING
        await own.stop()
    asyncio.run(scenario())
