"""An orderly queue leaving while its listener call outlives the drain timeout (ownership.py,
`_release_when_idle`): kept, locked and renewed, until the call returns, without holding up the rebalance
that let it go; at shutdown handed back after one more drain at most. Other consumers let the queue go at
the timeout, as before."""

from __future__ import annotations

import asyncio

from test_ownership import MQ, Hooks, ScriptedBroker, ownership

from tidemark.client.consumer.queue_state import QueueState

DRAIN_S = 0.02  # the drain timeout of these hooks


class DrainingHooks(Hooks):
    """Drains as a push consumer does (up to DRAIN_S for the lease's running listener calls); counts the
    drains and the rebalances asked for."""

    def __init__(self, *, orderly: bool) -> None:
        super().__init__()
        self.orderly = orderly
        self.drains = 0
        self.rebalances: list = []

    async def lease_draining(self, lease):
        self.drains += 1
        await lease.wait_idle(DRAIN_S)

    def queue_lost(self, mq):
        self.rebalances.append(mq)


async def _held_with_a_call_running(orderly: bool):
    """MQ held, one listener call of its lease running: (broker, hooks, ownership, lease)."""
    broker, hooks = ScriptedBroker(), DrainingHooks(orderly=orderly)
    broker.grant_now = True
    own = ownership(broker, hooks)
    await own.update("T", {MQ})
    lease = own.get(MQ).lease
    lease.batch_started()
    return broker, hooks, own, lease


def test_an_orderly_queue_stays_locked_until_its_listener_call_returns_without_holding_up_the_rebalance():
    async def scenario():
        broker, hooks, own, lease = await _held_with_a_call_running(orderly=True)
        await asyncio.wait_for(own.update("T", set()), 5)  # returns after one drain timeout
        oq = own.get(MQ)
        assert oq is not None and oq.state is QueueState.DRAINING and oq.kept
        assert broker.unlocked == [] and not lease.active
        while hooks.drains < 4:  # drained again and again, the lock kept...
            await asyncio.sleep(DRAIN_S / 2)
        renewals = len(broker.lock_calls)
        await asyncio.wait_for(own.renew_locks(), 5)  # ...and renewed: the ownership lock is free
        assert len(broker.lock_calls) == renewals + 1 and own.get(MQ) is oq and broker.unlocked == []
        await asyncio.wait_for(own.update("T", set()), 5)  # a later rebalance does not wait for it either
        lease.batch_finished()  # the listener call returns: committed, unlocked, and the group rebalances
        await asyncio.wait_for(oq.release_task, 5)
        assert broker.unlocked == [MQ] and oq.state is QueueState.RELEASED and own.get(MQ) is None
        assert hooks.rebalances == [MQ] and own.handovers == 1
    asyncio.run(scenario())


def test_a_kept_orderly_queue_is_handed_back_at_shutdown_after_one_more_drain_at_most():
    async def scenario():
        broker, hooks, own, lease = await _held_with_a_call_running(orderly=True)
        await own.update("T", set())
        assert own.get(MQ).kept
        await own.stop()
        await asyncio.wait_for(own.release_all(), 5)  # the call never returns: the shutdown ends all the same
        assert broker.unlocked == [MQ] and own.get(MQ) is None and lease.running == 1
    asyncio.run(scenario())


def test_a_concurrent_consumer_lets_a_queue_go_at_the_drain_timeout():
    async def scenario():
        broker, hooks, own, lease = await _held_with_a_call_running(orderly=False)
        await asyncio.wait_for(own.update("T", set()), 5)
        assert broker.unlocked == [MQ] and own.get(MQ) is None and hooks.drains == 1
    asyncio.run(scenario())
