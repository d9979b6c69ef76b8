"""QueueOwnership against a scripted broker (no gRPC): a late lock grant for a queue that came back to
us leaves the new owner's lock alone, a start offset that cannot be read does not spin, and an unlock
that failed is asked again (with its final commit) unless the queue came back to us meanwhile."""

from __future__ import annotations

import asyncio

import pytest

from tidemark.client.consumer import lock_renewal, pending_unlocks
from tidemark.client.consumer import ownership as ownership_module
from tidemark.client.consumer.offset_store import RemoteBrokerOffsetStore
from tidemark.client.consumer.ownership import QueueOwnership
from tidemark.client.consumer.queue_state import QueueState
from tidemark.client.errors import FencedError, RequestTimeoutError
from tidemark.client.message import MessageQueue
from tidemark.client.remoting.moves import MasterMoves
from tidemark.client.types import QueueLockGrant

MQ = MessageQueue("T", "broker-a", 0)
MQ1 = MessageQueue("T", "broker-a", 1)


class ScriptedBroker:
    """Answers LockQueues as told: waiting calls (wait_ms > 0) block until `release_waiters` is set.
    Names grants as the broker does: every acquisition a new lock token, a renewal the same; an unlock
    quoting an older token than the queue's latest grant releases nothing and commits nothing."""

    def __init__(self) -> None:
        self.grant_now = False
        self.release_waiters = asyncio.Event()
        self.wait_grants: set[MessageQueue] | None = None  # what a waiting call grants (None: all asked)
        self.lock_calls: list[int] = []  # wait_ms of each call
        self.unlocked: list[MessageQueue] = []
        self.final_offsets: list[tuple[MessageQueue, int]] = []  # final commits of successful unlocks
        self.commits: list[tuple[MessageQueue, int]] = []  # other commits
        self.unlock_failures = 0  # how many unlock calls fail (as when the broker cannot be reached)
        self.unlock_error = RequestTimeoutError  # how they fail (UnavailableError: at once, not unanswered)
        self.unlock_gate: asyncio.Event | None = None  # unlock calls wait for it (a call under way)
        self.unlock_calls = 0
        self.tokens: dict[MessageQueue, int] = {}  # the latest grant of each queue
        self.names_grants = True  # False: a broker older than lock tokens (every grant's token 0)
        self.moves = MasterMoves()  # BrokerCluster's: the broker never moves here
        self.lock_expiry_ms = 0  # what grants say of the broker's lock expiry (0: not said)
        self.lock_error: Exception | None = None  # LockQueues fails so (the broker cut off)
        self.taken: set[MessageQueue] = set()  # queues another client holds now: renewals do not grant them
        self.epoch = 9  # the owner epoch of every grant (a restarted broker grants under a new one)

    async def connection(self, broker_name):
        return self

    async def lock_queues(self, group, client_id, mqs, *, wait_ms=0, renew=False):
        self.lock_calls.append(wait_ms)
        if self.lock_error is not None:
            raise self.lock_error
        mqs = [mq for mq in mqs if mq not in self.taken]
        if wait_ms and not self.grant_now:
            try:  # (a waiter's wait, 5 s, lasts until told here)
                await asyncio.wait_for(self.release_waiters.wait(), None if wait_ms >= 5000 else wait_ms / 1000)
            except TimeoutError:
                return []
            mqs = [mq for mq in mqs if self.wait_grants is None or mq in self.wait_grants]
        elif not self.grant_now:
            return []
        for mq in mqs:
            if not renew or mq not in self.tokens:
                self.tokens[mq] = max(self.tokens.values(), default=100) + 1
        return [QueueLockGrant(mq, self.epoch, 0, 0, 0, self.tokens[mq] if self.names_grants else 0,
                               self.lock_expiry_ms)
                for mq in mqs]

    async def update_consumer_offset(self, commit):  # a resumed queue commits its start at once
        self.commits.append((commit.queue, commit.offset))

    async def unlock_queues(self, group, client_id, mqs, final_offsets=(), tokens=()):
        self.unlock_calls += 1
        if self.unlock_gate is not None:
            await self.unlock_gate.wait()
        if self.unlock_failures:
            self.unlock_failures -= 1
            raise self.unlock_error("unlock: no answer")
        quoted = dict(zip(mqs, tokens, strict=True)) if tokens else {}
        current = [mq for mq in mqs if quoted.get(mq, 0) in (0, self.tokens.get(mq))]
        for mq in current:
            self.tokens.pop(mq, None)
        self.unlocked.extend(current)
        self.final_offsets.extend((c.queue, c.offset) for c in final_offsets if c.queue in current)
        return [(c.queue, FencedError(f"{c.queue}: locked again")) for c in final_offsets if c.queue not in current]


class Hooks:
    commit_start_offset = True
    orderly = False

    def __init__(self, fail_start: bool = False) -> None:
        self.fail_start = fail_start
        self.started = []
        self.start_attempts = 0

    async def start_offset(self, mq, committed):
        self.start_attempts += 1
        if self.fail_start:
            raise RequestTimeoutError("max offset: no answer")
        return 0

    async def lease_started(self, lease):
        self.started.append(lease)

    async def lease_draining(self, lease):
        pass

    def lease_ended(self, lease):
        pass

    def queue_lost(self, mq):
        pass


def ownership(broker: ScriptedBroker, hooks: Hooks, *, settle: bool = True) -> QueueOwnership:
    """QueueOwnership over the scripted broker; with `settle`, update() returns once the first lock
    requests of the queues it took are answered (as a rebalance pass does, RebalanceService.do_rebalance)."""
    store = RemoteBrokerOffsetStore(cluster=broker, group="g", client_id="c1", require_fence=True)
    own = QueueOwnership(cluster=broker, group="g", client_id="c1", offset_store=store, locking=True, hooks=hooks)
    if settle:
        update = own.update

        async def update_and_settle(topic, target):
            changed = await update(topic, target)
            await own.settle()
            return changed
        own.update = update_and_settle
    return own


def test_a_late_grant_for_a_queue_that_came_back_leaves_the_new_owner_s_lock_alone():
    async def scenario():
        broker, hooks = ScriptedBroker(), Hooks()
        own = ownership(broker, hooks)
        await own.update("T", {MQ})  # its first request's short wait runs out; a waiting request follows
        while broker.lock_calls[-1:] != [5000]:
            await asyncio.sleep(0)
        await own.update("T", set())  # the queue goes away while the waiter still waits...
        broker.grant_now = True
        await own.update("T", {MQ})  # ...and comes back, locked and read by a new OwnedQueue
        assert own.get(MQ).state is QueueState.PULLING and len(hooks.started) == 1
        assert len(own._lock_waiters) == 1
        broker.release_waiters.set()  # the old wait is granted now
        await asyncio.wait_for(own._lock_waiters.wait(), 5)  # it handled the grant, nothing left to ask
        assert broker.unlocked == []  # the lock is the new owner's: not given up
        assert own.get(MQ).state is QueueState.PULLING
        # The broker holds the later grant (the old wait's token): handing the queue over quotes it, so
        # the lock is released at once instead of when it expires.
        await own.update("T", set())
        assert broker.unlocked == [MQ]
    asyncio.run(scenario())


def test_a_start_offset_that_cannot_be_read_is_retried_after_a_pause_not_at_once():
    async def scenario():
        broker, hooks = ScriptedBroker(), Hooks(fail_start=True)
        broker.release_waiters.set()
        own = ownership(broker, hooks)
        await own.update("T", {MQ})  # granted to the first request (released): the start fails
        while hooks.start_attempts == 0:
            await asyncio.sleep(0)
        for _ in range(100):  # a spinning waiter would try again within a few loop turns
            await asyncio.sleep(0)
        await own.stop()
        assert own.get(MQ).state is QueueState.LOCKING
        assert hooks.start_attempts == 1  # the next try waits LOCK_RETRY_DELAY_S (1 s)
    asyncio.run(scenario())


def test_a_wait_that_ended_with_a_queue_we_no_longer_want_asks_again_for_the_rest_at_once():
    async def scenario():
        broker, hooks = ScriptedBroker(), Hooks()
        own = ownership(broker, hooks)
        await own.update("T", {MQ, MQ1})  # both held elsewhere: one waiting call for the two
        while broker.lock_calls[-1:] != [5000]:
            await asyncio.sleep(0)
        await own.update("T", {MQ1})  # MQ goes to another member meanwhile
        broker.wait_grants = {MQ}
        broker.release_waiters.set()  # the wait ends with MQ granted: stale, handed back
        for _ in range(100):
            if broker.lock_calls.count(5000) == 2:
                break
            await asyncio.sleep(0)
        await own.stop()
        assert broker.lock_calls.count(5000) == 2  # MQ1 asked for again at once, not after a pause
        assert broker.unlocked == [MQ]
    asyncio.run(scenario())


def test_a_queue_that_arrives_during_a_wait_is_asked_for_at_once_not_after_it():
    async def scenario():
        broker, hooks = ScriptedBroker(), Hooks()
        own = ownership(broker, hooks)
        await own.update("T", {MQ})  # held elsewhere: a waiting call for MQ (up to 5 s)
        while broker.lock_calls[-1:] != [5000]:
            await asyncio.sleep(0)
        await own.update("T", {MQ, MQ1})  # MQ1 arrives, also held elsewhere
        for _ in range(100):
            if broker.lock_calls.count(5000) == 2:
                break
            await asyncio.sleep(0)
        first = ownership_module.FIRST_LOCK_WAIT_MS
        assert broker.lock_calls == [first, 5000, first, 5000]  # its own wait, beside the one under way
        broker.release_waiters.set()
        while own.get(MQ1).state is not QueueState.PULLING or own.get(MQ).state is not QueueState.PULLING:
            await asyncio.sleep(0)
        await own.stop()
    asyncio.run(scenario())


def test_a_queue_released_while_its_first_lock_request_waits_is_granted_by_that_request(monkeypatch):
    monkeypatch.setattr(ownership_module, "FIRST_LOCK_WAIT_MS", 60_000)  # (the release below ends the wait)

    async def scenario():
        broker, hooks = ScriptedBroker(), Hooks()
        own = ownership(broker, hooks)
        taking = asyncio.ensure_future(own.update("T", {MQ}))  # held elsewhere, its handover under way
        while not broker.lock_calls:
            await asyncio.sleep(0)
        broker.release_waiters.set()  # the previous owner's unlock arrives
        await taking
        assert own.get(MQ).state is QueueState.PULLING
        assert broker.lock_calls == [60_000]  # no refusal first, no second request after it
        await own.stop()
    asyncio.run(scenario())


def test_queues_leaving_together_are_committed_and_unlocked_in_one_call_each_with_its_own_answer():
    async def scenario():
        broker, hooks = ScriptedBroker(), Hooks()
        broker.grant_now = True
        own = ownership(broker, hooks)
        await own.update("T", {MQ, MQ1})
        own._store.update_offset(MQ, 5, increase_only=True)
        own._store.update_offset(MQ1, 7, increase_only=True)
        broker.tokens[MQ1] += 1  # MQ1 was locked again since our grant: its final commit is fenced
        await own.update("T", set())
        assert broker.unlock_calls == 1
        assert broker.unlocked == [MQ] and broker.final_offsets == [(MQ, 5)]
        assert own.handovers == 1  # MQ1's fenced commit lost that queue alone
    asyncio.run(scenario())


@pytest.fixture(autouse=True)
def short_first_lock_wait(monkeypatch):
    """A first lock request that nobody releases for waits 1 ms here, not 100 (the tests that wait on it)."""
    monkeypatch.setattr(ownership_module, "FIRST_LOCK_WAIT_MS", 1)


@pytest.fixture
def quick_retries(monkeypatch):
    monkeypatch.setattr(ownership_module, "LOCK_RETRY_DELAY_S", 0.01)
    monkeypatch.setattr(pending_unlocks, "LOCK_RETRY_DELAY_S", 0.01)


async def _held_then_released_with_a_failed_unlock(broker: ScriptedBroker, own: QueueOwnership) -> None:
    broker.grant_now = True
    await own.update("T", {MQ})
    own._store.update_offset(MQ, 5, increase_only=True)  # consumed up to 5
    broker.unlock_failures = 1
    await own.update("T", set())  # handed over: the final commit and unlock fail
    assert own.get(MQ) is None and broker.unlocked == []


@pytest.fixture
def short_final_unlock(monkeypatch):
    monkeypatch.setattr(pending_unlocks, "FINAL_UNLOCK_WAIT_S", 0.05)


async def _held_to_5_as_unlocks_hang(broker: ScriptedBroker, hooks: Hooks) -> QueueOwnership:
    """MQ held and consumed up to 5; from now on unlock calls wait for `broker.unlock_gate`."""
    broker.grant_now = True
    own = ownership(broker, hooks)
    await own.update("T", {MQ})
    own._store.update_offset(MQ, 5, increase_only=True)
    broker.unlock_gate = asyncio.Event()
    return own


async def _retry_under_way(broker: ScriptedBroker) -> None:
    """From now on unlock calls hang (as to a broker cut off); returns once the first retry is on one."""
    broker.unlock_gate = asyncio.Event()
    while broker.unlock_calls < 2:
        await asyncio.sleep(0.005)


def test_an_unlock_that_failed_is_asked_again_with_its_final_commit(quick_retries):
    """Issue 27 (partition seed 9021): without this, the broker kept the lock of a queue we had let go of
    until it expired (60 s), and its next owner waited all that time."""
    async def scenario():
        broker = ScriptedBroker()
        own = ownership(broker, Hooks())
        await _held_then_released_with_a_failed_unlock(broker, own)
        assert own.pending_unlocks == 1
        broker.unlock_failures = 2  # still cut off for the first two retries
        await asyncio.wait_for(own._unlocks.wait(), 5)
        assert own.pending_unlocks == 0 and own.unlock_retries == 3
        assert broker.unlocked == [MQ]
        assert broker.final_offsets == [(MQ, 5)]  # the handover keeps its final commit
        await own.stop()
    asyncio.run(scenario())


def test_a_failed_call_of_queues_leaving_together_is_asked_again_for_each_with_its_final_commit(quick_retries):
    async def scenario():
        broker = ScriptedBroker()
        broker.grant_now = True
        own = ownership(broker, Hooks())
        await own.update("T", {MQ, MQ1})
        own._store.update_offset(MQ, 5, increase_only=True)
        own._store.update_offset(MQ1, 7, increase_only=True)
        broker.unlock_failures = 1
        await own.update("T", set())  # one call for both, which fails
        assert broker.unlock_calls == 1 and own.pending_unlocks == 2
        while own.pending_unlocks:
            await asyncio.sleep(0.005)
        assert sorted(broker.final_offsets) == [(MQ, 5), (MQ1, 7)]
        await own.stop()
    asyncio.run(scenario())


def test_a_queue_that_came_back_before_the_unlock_was_asked_again_keeps_its_new_lock(quick_retries):
    async def scenario():
        broker = ScriptedBroker()
        own = ownership(broker, Hooks())
        await _held_then_released_with_a_failed_unlock(broker, own)
        await own.update("T", {MQ})  # ours again (the same client: the broker renews the same lock)
        assert own.get(MQ).state is QueueState.PULLING
        await asyncio.wait_for(own._unlocks.wait(), 5)
        assert broker.unlocked == [] and broker.final_offsets == []  # neither released nor moved back to 5
        assert own.get(MQ).state is QueueState.PULLING
        await own.stop()
    asyncio.run(scenario())


def test_unlocks_are_not_asked_again_once_the_lock_expired_on_the_broker(quick_retries, monkeypatch):
    monkeypatch.setattr(pending_unlocks, "LOCK_LIFETIME_S", 0.0)

    async def scenario():
        broker = ScriptedBroker()
        own = ownership(broker, Hooks())
        await _held_then_released_with_a_failed_unlock(broker, own)
        broker.unlock_failures = 1000  # the broker is never reached again
        await asyncio.wait_for(own._unlocks.wait(), 5)
        assert broker.unlock_failures == 1000  # given up without asking: the broker freed the lock itself
        await own.stop()
    asyncio.run(scenario())


def test_a_retried_unlock_under_way_does_not_hold_up_changes_of_other_queues(quick_retries):
    """Review of issue 27's fix: the retry held the ownership lock across its call, so while a broker was
    cut off every rebalance of the consumer waited a request timeout behind it."""
    async def scenario():
        broker = ScriptedBroker()
        own = ownership(broker, Hooks())
        await _held_then_released_with_a_failed_unlock(broker, own)
        await _retry_under_way(broker)
        await asyncio.wait_for(own.update("T", {MQ1}), 1)  # not behind the retry
        assert own.get(MQ1).state is QueueState.PULLING
        broker.unlock_gate.set()
        await asyncio.wait_for(own._unlocks.wait(), 5)
        assert broker.unlocked == [MQ] and broker.final_offsets == [(MQ, 5)]
        await own.stop()
    asyncio.run(scenario())


def test_a_handover_to_a_broker_cut_off_holds_up_queue_changes_for_the_bound_only(quick_retries, short_final_unlock):
    """Review of issue 27: the final commit and unlock ran under the ownership lock for a whole request
    timeout when the broker was cut off. Past FINAL_UNLOCK_WAIT_S the call is asked again outside it, final
    commit included."""
    async def scenario():
        broker = ScriptedBroker()
        own = await _held_to_5_as_unlocks_hang(broker, Hooks())  # cut off: the unlock call never answers
        await asyncio.wait_for(own.update("T", set()), 2)  # would wait for the gate without the bound
        assert own.get(MQ) is None and own.pending_unlocks == 1
        await asyncio.wait_for(own.update("T", {MQ1}), 1)  # other queues change meanwhile
        assert own.get(MQ1).state is QueueState.PULLING
        broker.unlock_gate.set()  # reachable again: the retry hands the queue over with its final commit
        await asyncio.wait_for(own._unlocks.wait(), 5)
        assert broker.unlocked == [MQ] and broker.final_offsets == [(MQ, 5)] and own.pending_unlocks == 0
        await own.stop()
    asyncio.run(scenario())


def test_at_shutdown_a_slow_final_commit_gets_its_full_time(quick_retries, short_final_unlock):
    """Review of the bound: stop() closes the retries before release_all, so a final commit past the bound
    was parked and never sent, and the next owner re-read what this client had consumed."""
    async def scenario():
        broker = ScriptedBroker()
        own = await _held_to_5_as_unlocks_hang(broker, Hooks())
        asyncio.get_running_loop().call_later(0.2, broker.unlock_gate.set)  # slow, past the bound, not dead
        await own.stop()  # ConsumerCore.shutdown's order: stop, then release_all
        await asyncio.wait_for(own.release_all(), 5)
        assert broker.final_offsets == [(MQ, 5)] and own.pending_unlocks == 0
    asyncio.run(scenario())


def test_a_queue_back_before_its_unlock_was_asked_again_resumes_from_the_final_commit(quick_retries,
                                                                                          short_final_unlock):
    """Review of the bound: the pending unlock was dropped with its final commit when the queue came back
    to us first, and the new lease started from the broker's older offset."""
    async def scenario():
        broker, hooks = ScriptedBroker(), Hooks()
        own = await _held_to_5_as_unlocks_hang(broker, hooks)  # the hand-over's call gets no answer within the bound
        await asyncio.wait_for(own.update("T", set()), 2)
        assert own.pending_unlocks == 1
        broker.unlock_gate.set()
        await asyncio.wait_for(own.update("T", {MQ}), 2)  # ours again before the retry
        assert hooks.started[-1].start_offset == 5, "resumed from this client's final commit"
        assert broker.commits == [(MQ, 5)]  # and the broker hears of it at once
        await own.stop()
    asyncio.run(scenario())


def test_a_late_unlock_does_not_release_the_lock_taken_again_nor_move_its_offset(quick_retries):
    async def scenario():
        broker = ScriptedBroker()
        own = ownership(broker, Hooks())
        await _held_then_released_with_a_failed_unlock(broker, own)
        old_grant = broker.tokens[MQ]
        await _retry_under_way(broker)  # the retry is under way...
        await asyncio.wait_for(own.update("T", {MQ}), 1)  # ...when the queue comes back to us: a new grant
        assert own.get(MQ).state is QueueState.PULLING and broker.tokens[MQ] != old_grant
        broker.unlock_gate.set()  # the retry arrives now, quoting the old grant
        await asyncio.wait_for(own._unlocks.wait(), 5)
        assert broker.unlocked == [] and broker.final_offsets == []  # neither released nor moved back to 5
        assert broker.tokens[MQ] == own.get(MQ).lock_token
        await own.renew_locks()  # a renewal keeps the grant
        assert broker.tokens[MQ] == own.get(MQ).lock_token and own.get(MQ).state is QueueState.PULLING
        await own.stop()
    asyncio.run(scenario())


def test_against_a_broker_without_lock_tokens_a_retry_under_way_holds_queue_changes_back(quick_retries):
    """Review finding: an older broker names no grants (token 0), so only the ownership lock keeps a late
    retry from releasing a lock taken again; such retries still run under it."""
    async def scenario():
        broker = ScriptedBroker()
        broker.names_grants = False
        own = ownership(broker, Hooks())
        await _held_then_released_with_a_failed_unlock(broker, own)
        await _retry_under_way(broker)
        back = asyncio.ensure_future(own.update("T", {MQ}))
        await asyncio.sleep(0.05)
        assert not back.done(), "the queue comes back only after the retry's answer"
        broker.unlock_gate.set()
        await asyncio.wait_for(back, 5)
        assert own.get(MQ).state is QueueState.PULLING and broker.unlocked == [MQ]  # released, then locked again
        await own.stop()
    asyncio.run(scenario())


# -- the lock's hold on this client's clock (lock_hold.py, lock_renewal.py) ---------------------------


async def _lapsed_lease(broker: ScriptedBroker, own: QueueOwnership):
    """MQ granted with a lock the broker keeps 20 ms: its hold lapses 10 ms after the asking."""
    broker.grant_now, broker.lock_expiry_ms = True, 20
    await own.update("T", {MQ})
    lease = own.get(MQ).lease
    assert lease.lock is own.get(MQ).hold and lease.lock.valid_until > float("-inf")  # the grant confirmed it
    while not lease.lock.lapsed():
        await asyncio.sleep(0.005)
    return lease


def _confirming(own: QueueOwnership, lease) -> asyncio.Event:
    """Tell ownership the lease's lock lapsed; the event is set once it was confirmed (or the lease ended)."""
    done = asyncio.Event()
    own.lock_lapsed(lease, done.set)
    own.lock_lapsed(lease, done.set)  # (a second worker of the queue saying so changes nothing)
    return done


def test_a_renewal_the_broker_answers_confirms_the_lock_and_one_it_refuses_loses_the_queue():
    async def scenario():
        broker = ScriptedBroker()
        own = ownership(broker, Hooks())
        lease = await _lapsed_lease(broker, own)
        broker.lock_expiry_ms = 60_000
        await own.renew_locks()
        assert not lease.lock.lapsed() and lease.active  # 30 s from the renewal's asking
        broker.lock_expiry_ms = 20
        await own.renew_locks()
        assert not lease.lock.lapsed()  # an answer never shortens what an earlier one confirmed

        broker = ScriptedBroker()
        own = ownership(broker, Hooks())
        lease = await _lapsed_lease(broker, own)
        broker.taken = {MQ}  # the lock expired on the broker and went to another member
        calls = len(broker.lock_calls)
        await asyncio.wait_for(_confirming(own, lease).wait(), 5)
        assert not lease.active and own.get(MQ) is None
        assert len(broker.lock_calls) == calls + 1  # one renewal for both workers' word
    asyncio.run(scenario())


def test_a_renewal_a_restarted_broker_grants_anew_is_let_go_of_for_the_group_s_next_owner():
    async def scenario():
        broker = ScriptedBroker()
        broker.grant_now = True
        own = ownership(broker, Hooks())
        await own.update("T", {MQ})
        lease = own.get(MQ).lease
        broker.epoch, broker.tokens = 10, {}  # restarted: no lock known, a new epoch for every grant
        await own.renew_locks()
        assert not lease.active and own.get(MQ) is None  # not the ownership it had: lost
        assert MQ in broker.unlocked and MQ not in broker.tokens  # and the new grant released at once
    asyncio.run(scenario())


async def _unanswered_confirmation(asks: int = 1):
    """MQ's lock lapsed and confirmed against a broker that does not answer, once it was asked `asks`
    times: (broker, ownership, lease, the event set once the lock is confirmed or the lease ended)."""
    broker = ScriptedBroker()
    own = ownership(broker, Hooks())
    lease = await _lapsed_lease(broker, own)
    broker.lock_error = RequestTimeoutError("LockQueues: no answer")
    calls = len(broker.lock_calls)
    confirmed = _confirming(own, lease)
    while len(broker.lock_calls) < calls + asks:
        await asyncio.sleep(0.005)
    return broker, own, lease, confirmed


def test_confirming_a_lapsed_lock_asks_again_while_the_broker_cannot_be_reached(monkeypatch):
    monkeypatch.setattr(lock_renewal, "LOCK_RETRY_DELAY_S", 0.01)

    async def scenario():
        broker, own, lease, confirmed = await _unanswered_confirmation(asks=3)  # again, after a pause each time
        assert not confirmed.is_set() and lease.active
        broker.lock_error, broker.lock_expiry_ms = None, 60_000
        await asyncio.wait_for(confirmed.wait(), 5)
        assert not lease.lock.lapsed() and lease.active
    asyncio.run(scenario())


def test_a_queue_leaving_ends_the_wait_for_its_lapsed_lock_at_once(monkeypatch):
    monkeypatch.setattr(lock_renewal, "LOCK_RETRY_DELAY_S", 30.0)  # only the queue's leaving ends it

    async def scenario():
        broker, own, lease, confirmed = await _unanswered_confirmation()
        broker.lock_error = None
        await own.update("T", set())  # handed over: drained (nothing runs), committed, unlocked
        await asyncio.wait_for(confirmed.wait(), 5)
        assert not lease.active and MQ in broker.unlocked
    asyncio.run(scenario())


def test_stopping_ends_a_confirmation_the_broker_does_not_answer(monkeypatch):
    monkeypatch.setattr(lock_renewal, "LOCK_RETRY_DELAY_S", 30.0)

    async def scenario():
        _, own, _, confirmed = await _unanswered_confirmation()
        await asyncio.wait_for(own.stop(), 5)  # (the consumer's shutdown: its queues are handed back next)
        assert not confirmed.is_set()  # nothing was confirmed: nothing consumes on
    asyncio.run(scenario())
