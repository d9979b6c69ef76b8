"""QueueOwnership against a real broker process whose calls a test makes fail on the client's side (a
wrapper around the cluster's connections; the broker itself is real and holds the real locks): whatever
a lock request, a start, a stale grant's unlock or a drain raises, no queue is left LOCKING with nobody asking for
it, none is held on the broker for a lease that never started, and a shutdown against a broker that does
not answer waits once."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal

import pytest
from brokerproc import BrokerProcess, BrokerStubs

from tidemark.client.consumer import ownership as ownership_module
from tidemark.client.consumer import pending_unlocks
from tidemark.client.consumer.offset_store import RemoteBrokerOffsetStore
from tidemark.client.consumer.ownership import QueueOwnership
from tidemark.client.consumer.queue_state import QueueState
from tidemark.client.errors import UnavailableError
from tidemark.client.message import MessageQueue
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.v1 import admin_pb2, common_pb2, messaging_pb2

TIMEOUT = 15
_topics = itertools.count()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("ownership-faults") / "data").start()
    try:
        yield b
    finally:
        b.kill()


@pytest.fixture
def topic(broker) -> str:
    """A fresh topic of two queues of ten messages each (each test its own locks and offsets)."""
    name = f"OwnFaults{next(_topics)}"
    with BrokerStubs(broker.address) as s:
        s.admin.CreateTopic(admin_pb2.CreateTopicRequest(name=name, queue_nums=2), timeout=TIMEOUT)
        for queue_id in range(2):
            s.messaging.SendMessage(messaging_pb2.SendMessageRequest(
                topic=name, queue_id=queue_id, messages=[common_pb2.Message(body=b"m%d" % i) for i in range(10)]),
                timeout=TIMEOUT)
    return name


@pytest.fixture
def quick_retries(monkeypatch):
    monkeypatch.setattr(pending_unlocks, "LOCK_RETRY_DELAY_S", 0.05)
    monkeypatch.setattr(ownership_module, "LOCK_RETRY_DELAY_S", 0.05)


class Faults:
    """The real cluster, with faults a test sets: each entry of `lock_faults` / `unlock_faults` is raised
    by the next LockQueues / UnlockQueues instead of the call; with `hold` set, a LockQueues the broker
    answered hands its grants back only once `hold` is set (a waiting request still under way)."""

    def __init__(self, real: BrokerCluster) -> None:
        self.real = real
        self.moves = real.moves
        self.lock_faults: list[BaseException] = []
        self.unlock_faults: list[BaseException] = []
        self.unlock_calls = 0
        self.hold: asyncio.Event | None = None
        self.held = asyncio.Event()  # a LockQueues answered and waiting for `hold`

    async def connection(self, broker_name: str) -> FaultyConnection:
        return FaultyConnection(self, await self.real.connection(broker_name))


class FaultyConnection:
    def __init__(self, faults: Faults, conn) -> None:
        self._faults, self._conn = faults, conn

    def __getattr__(self, name: str):
        return getattr(self._conn, name)

    async def lock_queues(self, *args, **kwargs):
        if self._faults.lock_faults:
            raise self._faults.lock_faults.pop(0)
        grants = await self._conn.lock_queues(*args, **kwargs)
        if self._faults.hold is not None and not kwargs.get("renew"):
            self._faults.held.set()
            await self._faults.hold.wait()
        return grants

    async def unlock_queues(self, *args, **kwargs):
        self._faults.unlock_calls += 1
        if self._faults.unlock_faults:
            raise self._faults.unlock_faults.pop(0)
        return await self._conn.unlock_queues(*args, **kwargs)


class Hooks:
    commit_start_offset = True

    def __init__(self) -> None:
        self.started = []
        self.lost = []
        self.lost_event = asyncio.Event()
        self.start_faults: list[BaseException] = []  # raised by the next lease_started calls

    async def start_offset(self, mq, committed):
        return max(committed or 0, 0)

    async def lease_started(self, lease):
        if self.start_faults:
            raise self.start_faults.pop(0)
        self.started.append(lease)

    async def lease_draining(self, lease):
        pass

    def lease_ended(self, lease):
        pass

    def queue_lost(self, mq):
        self.lost.append(mq)
        self.lost_event.set()


class FaultyStore(RemoteBrokerOffsetStore):
    """The real offset store, whose preload raises for the queues in `preload_faults` (once each), and
    whose bind raises the entries of `bind_faults`."""

    preload_faults: set[MessageQueue]
    bind_faults: list[BaseException]

    def bind(self, lease, offset=None):
        if self.bind_faults:
            raise self.bind_faults.pop(0)
        return super().bind(lease, offset)

    def preload(self, mq, offset, generation):
        if mq in self.preload_faults:
            self.preload_faults.discard(mq)
            raise OSError(f"{mq}: offset cache: I/O error")
        return super().preload(mq, offset, generation)


def _ownership(faults: Faults, hooks: Hooks, store_type=RemoteBrokerOffsetStore) -> QueueOwnership:
    store = store_type(cluster=faults, group="g", client_id="c1", require_fence=True)
    if store_type is FaultyStore:
        store.preload_faults, store.bind_faults = set(), []
    return QueueOwnership(cluster=faults, group="g", client_id="c1", offset_store=store, locking=True, hooks=hooks)


async def _until(predicate, what: str, timeout: float = 10) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not predicate():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"not within {timeout} s: {what}") from None


def _pulling(own: QueueOwnership, *mqs: MessageQueue) -> bool:
    return all(own.get(mq) is not None and own.get(mq).state is QueueState.PULLING for mq in mqs)


async def _free(real: BrokerCluster, mq: MessageQueue) -> bool:
    """Whether another client of the group is granted the queue's lock now (it then holds it)."""
    conn = await real.connection(mq.broker_name)
    return bool(await conn.lock_queues("g", "c2", [mq]))


def _run(broker, scenario, *, timeout_s: float = 3.0) -> None:
    async def go():
        real = BrokerCluster([broker.address], timeout_s=timeout_s)
        try:
            await real.discover()
            await scenario(real, Faults(real))
        finally:
            await real.close()
    asyncio.run(go())


@pytest.mark.usefixtures("quick_retries")
def test_a_lock_request_raising_an_unexpected_error_is_asked_again(broker, topic):
    """lock_queues raising OSError (not a TidemarkError) ended the lock request's task: its queues stayed
    LOCKING and nothing asked for them again."""
    mqs = [MessageQueue(topic, "broker-a", i) for i in range(2)]

    async def scenario(real, faults):
        hooks = Hooks()
        own = _ownership(faults, hooks)
        faults.lock_faults = [OSError("socket: bad file descriptor")] * 2  # the first and the next request
        await own.update(topic, set(mqs))
        await own.settle()
        await _until(lambda: _pulling(own, *mqs), "both queues pulling once the fault cleared")
        assert not faults.lock_faults and len(hooks.started) == 2
        await own.stop()
        await own.release_all()
    _run(broker, scenario)


@pytest.mark.usefixtures("quick_retries")
def test_a_start_raising_for_one_queue_does_not_stop_the_others(broker, topic):
    """The starts of one grant are gathered: an OSError of one queue's start (its offset store's preload)
    stopped the others' under the ownership lock, and the failing queue was never asked for again."""
    mqs = [MessageQueue(topic, "broker-a", i) for i in range(2)]

    async def scenario(real, faults):
        hooks = Hooks()
        own = _ownership(faults, hooks, FaultyStore)
        own._store.preload_faults = {mqs[0]}
        await own.update(topic, set(mqs))
        await own.settle()
        assert [lease.mq for lease in hooks.started] == [mqs[1]]  # the other queue started at once
        await _until(lambda: _pulling(own, *mqs), "the failed queue asked again and started")
        assert sorted(lease.mq for lease in hooks.started) == mqs
        await own.stop()
        await own.release_all()
    _run(broker, scenario)


@pytest.mark.usefixtures("quick_retries")
def test_a_stale_grant_whose_unlock_raises_lets_the_queues_granted_beside_it_start(broker, topic):
    """One lock request granted two queues, one of which went away while the request waited (a stale
    grant, unlocked at once). That unlock raising OSError ended the request's task: the other queue,
    granted, stayed LOCKING and was never asked for again, and the stale lock was kept for us on the
    broker until it expired."""
    stale, wanted = (MessageQueue(topic, "broker-a", i) for i in range(2))

    async def scenario(real, faults):
        hooks = Hooks()
        own = _ownership(faults, hooks)
        faults.hold = asyncio.Event()
        await own.update(topic, {stale, wanted})
        await asyncio.wait_for(faults.held.wait(), 10)  # the broker granted both; the answer is on its way
        await own.update(topic, {wanted})  # `stale` goes away meanwhile
        faults.unlock_faults = [OSError("socket: connection reset")]
        faults.hold.set()
        await _until(lambda: _pulling(own, wanted), "the queue granted beside the stale one pulling")
        await _until(lambda: own.pending_unlocks == 0 and not faults.unlock_faults, "the stale unlock asked again")
        assert await _free(real, stale), "the stale grant was let go on the broker"
        await own.stop()
        await own.release_all()
    _run(broker, scenario)


@pytest.mark.usefixtures("quick_retries")
def test_a_lock_request_ending_early_asks_again_for_its_queues(broker, topic):
    """Whatever ends a lock request's task early (here a defect reading a grant), the queues it alone asked
    for are asked again after the pause instead of staying LOCKING."""
    mqs = [MessageQueue(topic, "broker-a", i) for i in range(2)]

    async def scenario(real, faults):
        hooks = Hooks()
        own = _ownership(faults, hooks)
        quote, defects = own._quote, [RuntimeError("grant: unexpected field")]

        def defective_quote(*args):
            if defects:
                raise defects.pop()
            return quote(*args)
        own._quote = defective_quote
        await own.update(topic, set(mqs))
        await own.settle()
        await _until(lambda: _pulling(own, *mqs), "both queues pulling")
        assert not defects and len(hooks.started) == 2
        await own.stop()
        await own.release_all()
    _run(broker, scenario)


@pytest.mark.usefixtures("quick_retries")
def test_a_granted_queue_let_go_before_it_started_is_unlocked_whatever_the_unlock_raises(broker, topic):
    """A queue granted whose start offset cannot be read goes away: its unlock raising OSError failed the
    rebalance's update() and the lock was kept for us on the broker until it expired."""
    mq = MessageQueue(topic, "broker-a", 0)

    class NoStartOffset(Hooks):
        async def start_offset(self, mq, committed):
            raise OSError("offset file: I/O error")

    async def scenario(real, faults):
        own = _ownership(faults, NoStartOffset())
        await own.update(topic, {mq})
        await own.settle()
        assert own.get(mq).state is QueueState.LOCKING and own.get(mq).owner_epoch is not None
        faults.unlock_faults = [OSError("socket: connection reset")]
        await own.update(topic, set())
        await _until(lambda: own.pending_unlocks == 0 and not faults.unlock_faults, "the unlock asked again")
        assert await _free(real, mq)
        await own.stop()
        await own.release_all()
    _run(broker, scenario)


@pytest.mark.usefixtures("quick_retries")
@pytest.mark.parametrize("fault", ["lease_started", "bind"])
def test_a_lease_that_cannot_start_is_unlocked_and_taken_again_after_a_pause(broker, topic, fault):
    """A new lease that cannot start (its fetch, or a step between PULLING and it: the offset store's bind)
    loses its queue. The lock stayed ours on the broker (its next owner waited for it to expire), and the
    consumer was told at once: its rebalance took the queue again, the same fault lost it again, with no
    pause. A fault in bind left the queue PULLING with nothing fetching it."""
    mq = MessageQueue(topic, "broker-a", 0)

    async def scenario(real, faults):
        hooks = Hooks()
        own = _ownership(faults, hooks, FaultyStore)
        (hooks.start_faults if fault == "lease_started" else own._store.bind_faults).append(OSError("closed"))
        await own.update(topic, {mq})
        await own.settle()
        assert own.get(mq) is None and not hooks.started
        assert hooks.lost == [], "told only after the pause"
        assert await _free(real, mq), "unlocked at once"
        await asyncio.wait_for(hooks.lost_event.wait(), 10)
        assert hooks.lost == [mq]
        await own.stop()
        await own.release_all()
    _run(broker, scenario)


@pytest.mark.usefixtures("quick_retries")
def test_a_restart_whose_lease_cannot_start_lets_the_queue_go(broker, topic):
    """restart() (a seek, an admin reset) raised what lease_started raised, and left the queue PULLING under
    a lease nothing fetched for, its lock renewed for good."""
    mq = MessageQueue(topic, "broker-a", 0)

    async def scenario(real, faults):
        hooks = Hooks()
        own = _ownership(faults, hooks)
        await own.update(topic, {mq})
        await own.settle()
        lease = own.get(mq).lease
        hooks.start_faults.append(OSError("fetcher closed"))
        assert await own.restart(lease, 0, lease.reset_generation, record=True) is None
        assert own.get(mq) is None and await _free(real, mq)
        await asyncio.wait_for(hooks.lost_event.wait(), 10)
        await own.stop()
        await own.release_all()
    _run(broker, scenario)


def test_a_shutdown_against_a_broker_that_does_not_answer_waits_once(broker, topic, monkeypatch, caplog):
    """The broker paused (SIGSTOP): stop() asked the unlock that had failed before, with the full request
    time; release_all then sent the final call, with the full time; and asked it once more, with the full
    time: three request timeouts, one after the other. Now the earlier unlock and the final call go at once,
    and a broker that did not answer is not asked again. The warning of lost final commits named the queue
    whose unlock had no commit to lose, too."""
    monkeypatch.setattr(pending_unlocks, "LOCK_RETRY_DELAY_S", 3600)  # (no retry in the background)
    pulled, unstarted = (MessageQueue(topic, "broker-a", i) for i in range(2))

    class NoStartOffsetFor(Hooks):
        async def start_offset(self, mq, committed):
            if mq == unstarted:
                raise OSError("offset file: I/O error")
            return await super().start_offset(mq, committed)

    async def scenario(real, faults):
        own = _ownership(faults, NoStartOffsetFor())
        await own.update(topic, {pulled, unstarted})
        await own.settle()
        assert _pulling(own, pulled) and own.get(unstarted).owner_epoch is not None
        own._store.update_offset(pulled, 5, increase_only=True)
        faults.unlock_faults = [UnavailableError("connection reset")]
        await own.update(topic, {pulled})  # the granted, unstarted queue's unlock (no commit) fails
        assert own.pending_unlocks == 1
        calls = faults.unlock_calls
        os.kill(broker.proc.pid, signal.SIGSTOP)
        try:
            await own.stop()
            await own.release_all()
        finally:
            os.kill(broker.proc.pid, signal.SIGCONT)
        assert faults.unlock_calls - calls == 2, "the earlier unlock and the final call, each asked once"
        assert own.pending_unlocks == 2
    _run(broker, scenario, timeout_s=1.0)
    (lost,) = [r for r in caplog.records if getattr(r, "tm_event", None) == "final_commit_lost"]
    assert lost.tm_fields["queues"] == str(pulled), "only the queue whose final commit is lost"


def test_a_release_raising_at_shutdown_leaves_the_others_final_commits_asked_once_more(broker, topic):
    """One queue's release raising (here its lease_ended) ended release_all before its last sweep: another
    queue's final commit, whose call had failed at once, was never asked again."""
    kept, failing = (MessageQueue(topic, "broker-a", i) for i in range(2))

    class EndRaises(Hooks):
        def lease_ended(self, lease):
            if lease.mq == failing:
                raise OSError("fetcher: closed")

    async def scenario(real, faults):
        own = _ownership(faults, EndRaises())
        await own.update(topic, {kept, failing})
        await own.settle()
        own._store.update_offset(kept, 7, increase_only=True)
        faults.unlock_faults = [UnavailableError("connection reset")]  # the final call fails, at once
        await own.stop()
        await own.release_all()
        conn = await real.connection("broker-a")
        assert (await conn.query_consumer_offset("g", kept))[0] == 7, "the final commit asked once more"
    _run(broker, scenario)


@pytest.mark.parametrize("when", ["shutdown", "rebalance"])
def test_a_drain_raising_still_commits_and_unlocks_its_queue(broker, topic, caplog, when):
    """lease_draining raising ended the queue's release before its final call: the queue stayed DRAINING,
    what it had consumed was never committed, and the broker kept its lock (renewed for good while the
    consumer ran, until it expired after a shutdown). Now it goes on as after a drain that timed out."""
    mq = MessageQueue(topic, "broker-a", 0)

    class DrainRaises(Hooks):
        async def lease_draining(self, lease):
            raise OSError("drain: listener pool gone")

    async def scenario(real, faults):
        own = _ownership(faults, DrainRaises())
        await own.update(topic, {mq})
        await own.settle()
        own._store.update_offset(mq, 4, increase_only=True)
        if when == "rebalance":
            await own.update(topic, set())  # (raised the drain's OSError)
        await own.stop()
        await own.release_all()
        conn = await real.connection("broker-a")
        assert (await conn.query_consumer_offset("g", mq))[0] == 4, "what was consumed, committed"
        assert await _free(real, mq), "the lock released"
        assert own.get(mq) is None and own.pending_unlocks == 0
    _run(broker, scenario)
    assert [str(r.tm_fields["queue"]) for r in caplog.records if getattr(r, "tm_event", None) == "drain_failed"] \
        == [str(mq)]
