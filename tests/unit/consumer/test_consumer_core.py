"""The consumer core without a broker: queue states and leases, listener results against stale leases,
ack_index and retries, suspend, offset-store fencing, the consume pool, orderly supervision, settings."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from consumer_testlib import MQ, FakeFetcher, FakeSendBack, FakeStore, lease, msg

from tidemark.client.consumer import consume_pool
from tidemark.client.consumer.consume_concurrently import ConsumeMessageConcurrentlyService
from tidemark.client.consumer.consume_orderly import ConsumeMessageOrderlyService
from tidemark.client.consumer.consume_pool import ConsumeThreadPool
from tidemark.client.consumer.lease import LeaseStatus, QueueLease
from tidemark.client.consumer.lock_hold import LockHold
from tidemark.client.consumer.offset_store import RemoteBrokerOffsetStore
from tidemark.client.consumer.queue_state import IllegalTransition, OwnedQueue, QueueState
from tidemark.client.errors import InvalidArgumentError
from tidemark.client.message import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    MessageExt,
    MessageModel,
)
from tidemark.client.settings import PullConsumerSettings, PushConsumerSettings, build
from tidemark.common.scheduler import Scheduler

# -- queue states and leases ------------------------------------------------------------------


def test_a_queue_s_lease_follows_its_state():
    oq = OwnedQueue(MQ)
    oq.transition(QueueState.LOCKING)
    with pytest.raises(IllegalTransition):
        oq.replace_lease(lease())  # a lease starts only once the queue is PULLING
    oq.transition(QueueState.PULLING)
    first = lease()
    assert oq.replace_lease(first) is None and oq.current(first)
    second = first.successor(40, reset_generation=3)
    assert oq.replace_lease(second) is first
    assert first.status is LeaseStatus.ENDED and not oq.current(first)  # a reset: the old generation is void
    assert (second.owner_epoch, second.reset_generation, second.start_offset) == (7, 3, 40)
    assert second.pq is not first.pq  # a new generation starts with an empty cache
    oq.transition(QueueState.DRAINING)
    assert second.status is LeaseStatus.DRAINING and not second.active and second.counts
    oq.transition(QueueState.RELEASED)
    assert second.status is LeaseStatus.ENDED and not second.counts
    with pytest.raises(IllegalTransition):
        oq.transition(QueueState.PULLING)


def test_wait_idle_returns_when_the_last_batch_finishes():
    async def scenario():
        le = lease()
        le.batch_started()
        le.batch_started()
        waiter = asyncio.ensure_future(le.wait_idle(5))
        await asyncio.sleep(0)
        le.batch_finished()
        await asyncio.sleep(0)
        assert not waiter.done()
        le.batch_finished()
        assert await waiter
        le.batch_started()
        assert not await le.wait_idle(0.05)  # a timeout is reported, not raised
    asyncio.run(scenario())


def test_wait_idle_keeps_waiting_when_a_batch_finishes_and_another_starts_in_one_step():
    """A skipped batch submitted again after a resume: the last batch finished (the idle event was set)
    and the next one started before the waiter woke. The waiter must not take that for idle."""
    async def scenario():
        le = lease()
        le.batch_started()
        waiter = asyncio.ensure_future(le.wait_idle(5))
        await asyncio.sleep(0)
        le.batch_finished()
        le.batch_started()
        await asyncio.sleep(0.01)
        assert not waiter.done()
        le.batch_finished()
        assert await waiter
    asyncio.run(scenario())


# -- listener results -------------------------------------------------------------------------


def consume(listener, msgs: list[MessageExt], *, suspended=False, le: QueueLease | None = None,
            send_ok: bool = True, before=None):
    """Run one submit through a real pool and service; returns (lease, store, send-back, fetcher, service)."""
    le = le or lease()
    store, send_back, fetcher = FakeStore(), FakeSendBack(send_ok), FakeFetcher()

    async def scenario():
        service_box = []
        pool = ConsumeThreadPool(max_threads=2, name="t", loop=asyncio.get_running_loop(),
                                 on_drained=lambda: service_box[0].apply_finished())
        service = ConsumeMessageConcurrentlyService(
            listener=listener, settings=PushConsumerSettings(group="g", local_retry_delay_s=0.01), pool=pool,
            offset_store=store, send_back=send_back, fetcher=fetcher, clustering=True,
            suspended=suspended if callable(suspended) else lambda: suspended)
        service_box.append(service)
        le.pq.put_messages(msgs)
        if before is not None:
            before(le)
        service.submit(le, msgs)
        # Batches (send-backs included) count in le.running until they are done and applied.
        assert await le.wait_idle(5)
        await asyncio.to_thread(pool.shutdown)
        return service

    service = asyncio.run(scenario())
    return le, store, send_back, fetcher, service


def test_successful_batches_move_the_offset_and_give_credit_back():
    le, store, send_back, fetcher, _ = consume(
        lambda m, c: ConsumeConcurrentlyStatus.CONSUME_SUCCESS, [msg(0), msg(1), msg(2)])
    assert store.offsets and store.offsets[-1] == 3 and not send_back.sent
    assert sum(n for n, _ in fetcher.granted) == 3 and le.pq.msg_count == 0


def test_ack_index_counts_the_head_and_sends_the_rest_back():
    def listener(msgs, ctx):
        ctx.ack_index = 0
        return ConsumeConcurrentlyStatus.RECONSUME_LATER

    settings = PushConsumerSettings(group="g", consume_message_batch_max_size=3)
    assert settings.consume_message_batch_max_size == 3
    le = lease()

    async def scenario():
        store, send_back, fetcher = FakeStore(), FakeSendBack(), FakeFetcher()
        done = asyncio.Event()
        box = []
        pool = ConsumeThreadPool(max_threads=1, name="t", loop=asyncio.get_running_loop(),
                                 on_drained=lambda: (box[0].apply_finished(), done.set()))
        service = ConsumeMessageConcurrentlyService(listener=listener, settings=settings, pool=pool,
                                                    offset_store=store, send_back=send_back, fetcher=fetcher,
                                                    clustering=True, suspended=lambda: False)
        box.append(service)
        msgs = [msg(0), msg(1), msg(2)]
        le.pq.put_messages(msgs)
        service.submit(le, msgs)
        await asyncio.wait_for(done.wait(), 5)
        for _ in range(50):  # the send-back task finishes on the loop
            if le.pq.msg_count == 0:
                break
            await asyncio.sleep(0.01)
        await asyncio.to_thread(pool.shutdown)
        return store, send_back

    store, send_back = asyncio.run(scenario())
    assert send_back.sent == [1, 2]  # only the messages after ack_index are retried
    assert store.offsets[-1] == 3 and le.pq.msg_count == 0


def test_results_of_a_lease_that_ended_do_not_count():
    def listener(msgs, ctx):
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    gate = threading.Event()

    def slow(msgs, ctx):
        gate.wait(5)
        return listener(msgs, ctx)

    le = lease()

    def end_while_running(le_):
        threading.Timer(0.1, lambda: (le_.end(), gate.set())).start()

    le, store, send_back, fetcher, _ = consume(slow, [msg(0)], le=le, before=end_while_running)
    assert store.offsets == [] and fetcher.granted == [] and le.pq.msg_count == 1  # nothing of it counted


def test_while_suspended_batches_and_failures_are_held_not_sent_back():
    le, store, send_back, fetcher, service = consume(
        lambda m, c: ConsumeConcurrentlyStatus.RECONSUME_LATER, [msg(0), msg(1)], suspended=True)
    assert send_back.sent == [] and store.offsets == [] and le.pq.msg_count == 2
    assert len(service._held) == 2  # resume() hands them to the listener again


def test_a_batch_skipped_just_before_resume_runs_after_it():
    answers = iter([True])  # the consume thread sees "suspended"; resume() comes before its completion does

    le, store, send_back, _, _ = consume(lambda m, c: ConsumeConcurrentlyStatus.CONSUME_SUCCESS, [msg(0)],
                                         suspended=lambda: next(answers, False))
    assert store.offsets[-1] == 1 and le.pq.msg_count == 0 and not send_back.sent


def test_a_send_back_in_flight_keeps_the_batch_running():
    gate = asyncio.Event()
    seen = []

    class SlowSendBack(FakeSendBack):
        async def send_back(self, m, delay_level=0):
            seen.append(le.running)  # the handover's wait_idle must wait for this send-back
            gate.set()
            return await super().send_back(m, delay_level)

    le = lease()

    async def scenario():
        store, fetcher = FakeStore(), FakeFetcher()
        box = []
        pool = ConsumeThreadPool(max_threads=1, name="t", loop=asyncio.get_running_loop(),
                                 on_drained=lambda: box[0].apply_finished())
        service = ConsumeMessageConcurrentlyService(
            listener=lambda m, c: ConsumeConcurrentlyStatus.RECONSUME_LATER, settings=PushConsumerSettings(group="g"),
            pool=pool, offset_store=store, send_back=SlowSendBack(), fetcher=fetcher, clustering=True,
            suspended=lambda: False)
        box.append(service)
        le.pq.put_messages([msg(0)])
        service.submit(le, [msg(0)])
        await asyncio.wait_for(gate.wait(), 5)
        assert await le.wait_idle(5)
        await asyncio.to_thread(pool.shutdown)
        return store
    store = asyncio.run(scenario())
    assert seen == [1] and store.offsets[-1] == 1 and le.pq.msg_count == 0


def test_a_listener_that_raises_anything_is_a_failure_and_the_thread_survives():
    def listener(msgs, ctx):
        raise SystemExit("listener called exit")

    le, store, send_back, _, _ = consume(listener, [msg(0)])
    assert send_back.sent == [0] and store.offsets[-1] == 1  # retried through the broker, then counted


# -- the consume pool ---------------------------------------------------------------------


def test_the_pool_reports_completions_in_bulk_and_outlives_failing_tasks():
    async def scenario():
        drains, results = [], []
        done = asyncio.Event()

        def drained():
            drains.append(len(results))
            if len(results) == 50:
                done.set()
        pool = ConsumeThreadPool(max_threads=4, name="t", loop=asyncio.get_running_loop(), on_drained=drained)

        def task(i):
            if i == 3:
                raise SystemExit("a task may raise anything")
            return lambda: results.append(i)
        pool.submit([lambda i=i: task(i) for i in range(51)])
        await asyncio.wait_for(done.wait(), 5)
        assert sorted(results) == [i for i in range(51) if i != 3]
        assert len(drains) < 50  # completions are applied per wake-up, not one loop callback each
        assert await pool.run(lambda: 42) == 42  # the threads survived the failing task
        await asyncio.to_thread(pool.shutdown)
    asyncio.run(scenario())


def test_a_listener_stuck_in_a_call_does_not_hold_up_work_queued_behind_it():
    async def scenario():
        pool = ConsumeThreadPool(max_threads=4, name="t", loop=asyncio.get_running_loop())
        stuck, release = threading.Event(), threading.Event()
        first = pool.run(lambda: (stuck.set(), release.wait(10)))
        await asyncio.to_thread(stuck.wait, 5)
        others = [pool.run(lambda i=i: i) for i in range(3)]  # fewer than a thread's share of work
        try:
            assert await asyncio.wait_for(asyncio.gather(*others), 5) == [0, 1, 2]
            assert not first.done()
        finally:
            release.set()
        await first
        await asyncio.to_thread(pool.shutdown)
    asyncio.run(scenario())


def test_a_thread_that_fails_to_start_leaves_the_pool_able_to_start_another(monkeypatch):
    real_start, failures = threading.Thread.start, [RuntimeError("can't start new thread")]

    def start(thread):
        if thread.name.startswith("t_") and failures:
            raise failures.pop()
        real_start(thread)
    monkeypatch.setattr(threading.Thread, "start", start)

    async def scenario():
        ran = threading.Event()
        pool = ConsumeThreadPool(max_threads=4, name="t", loop=asyncio.get_running_loop())
        with pytest.raises(RuntimeError, match="can't start new thread"):
            pool.submit([ran.set])
        assert pool._threads == [] and pool._waking == 0  # no dead thread counted as on its way
        assert await asyncio.wait_for(pool.run(lambda: 42), 5) == 42
        assert ran.is_set()  # the task queued by the failed hand-off ran too
        await asyncio.to_thread(pool.shutdown)
    asyncio.run(scenario())


def test_a_shutdown_while_a_thread_is_starting_joins_that_thread(monkeypatch):
    real_start, starting, go = threading.Thread.start, threading.Event(), threading.Event()

    def start(thread):
        if thread.name.startswith("t_"):
            starting.set()
            go.wait(5)
        real_start(thread)
    monkeypatch.setattr(threading.Thread, "start", start)

    class Mutex:  # the pool's mutex, telling when shutdown() asks for it
        def __init__(self):
            self.lock, self.asked = threading.Lock(), threading.Event()

        def __enter__(self):
            if threading.current_thread().name == "stopper":
                self.asked.set()
            self.lock.acquire()

        def __exit__(self, *exc):
            self.lock.release()

    async def scenario():
        pool = ConsumeThreadPool(max_threads=1, name="t", loop=asyncio.get_running_loop())
        pool._mutex = mutex = Mutex()
        outcome = []

        def stop():
            try:
                pool.shutdown()
                outcome.append(all(t.ident is not None and not t.is_alive() for t in pool._threads))
            except BaseException as e:  # e.g. "cannot join thread before it is started"
                outcome.append(e)
        stopper = threading.Thread(target=stop, name="stopper")

        def race():  # shutdown() called while the hand-off is starting a thread
            starting.wait(5)
            stopper.start()
            mutex.asked.wait(5)
            go.set()
        racer = threading.Thread(target=race)
        racer.start()
        pool.submit([lambda: None])
        await asyncio.to_thread(stopper.join, 5)
        racer.join()
        assert len(pool._threads) == 1 and outcome == [True]  # joined, not skipped
    asyncio.run(scenario())


async def idle_pool(threads: int, *, max_threads: int) -> ConsumeThreadPool:
    """A pool with this many threads, all parked."""
    pool = ConsumeThreadPool(max_threads=max_threads, name="t", loop=asyncio.get_running_loop())
    gate, busy = threading.Event(), []
    for _ in range(threads):  # this many listener calls stuck at once: as many threads
        started = threading.Event()
        busy.append(pool.run(lambda started=started: (started.set(), gate.wait(10))))
        assert await asyncio.to_thread(started.wait, 5)
    gate.set()
    await asyncio.wait_for(asyncio.gather(*busy), 5)
    await all_parked(pool)
    assert len(pool._threads) == threads
    return pool


async def all_parked(pool: ConsumeThreadPool) -> None:
    for _ in range(500):
        if len(pool._idle) == len(pool._threads):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(pool._threads) - len(pool._idle)} consume threads still busy")


def test_the_parts_of_a_frame_wake_one_thread_not_one_each():
    async def scenario():
        pool = await idle_pool(8, max_threads=20)
        results: list[int] = []
        for i in range(16):  # a frame of 16 parts, handed over in one loop turn
            pool.submit([lambda i=i: lambda: results.append(i)])
        # A thread woken for the first part counts as on its way until it takes work; before, each part
        # woke one more of the idle threads (the woken one still counted as idle).
        assert len(pool._idle) >= 5
        await asyncio.wait_for(pool.run(lambda: None), 5)
        await asyncio.to_thread(pool.shutdown)
        assert sorted(results) == list(range(16))
    asyncio.run(scenario())


def test_work_handed_over_in_the_turn_a_listener_gets_stuck_goes_to_an_idle_thread():
    async def scenario():
        pool = await idle_pool(4, max_threads=4)
        release, ran = threading.Event(), threading.Event()
        try:
            # Two frames in one loop turn: the thread woken for the first, whose listener hangs, was on its
            # way for the second too; when it takes the first, the second gets a thread of its own.
            pool.submit([lambda: release.wait(10) and None])
            pool.submit([lambda: ran.set()])
            assert await asyncio.to_thread(ran.wait, 5)
            release.set()
            await all_parked(pool)
            # The same with run(), as the orderly service hands over two queues' batches.
            release.clear()
            slow, other = pool.run(lambda: release.wait(10)), pool.run(lambda: "consumed")
            assert await asyncio.wait_for(other, 5) == "consumed"
            assert not slow.done()
        finally:
            release.set()
        await slow
        await asyncio.to_thread(pool.shutdown)
    asyncio.run(scenario())


def test_run_answers_at_once_while_submitted_completions_wait_to_be_collected(monkeypatch):
    monkeypatch.setattr(consume_pool, "COLLECT_S", 60.0)

    async def scenario():
        results: list[int] = []
        pool = ConsumeThreadPool(max_threads=1, name="t", loop=asyncio.get_running_loop())
        pool.submit([lambda i=i: lambda: results.append(i) for i in range(5)])
        # run()'s awaiter is woken by its completion, which brings along what finished before it, instead
        # of waiting for the collect a minute later.
        assert await asyncio.wait_for(pool.run(lambda: 42), 5) == 42
        assert results == [0, 1, 2, 3, 4]
        await asyncio.to_thread(pool.shutdown)
    asyncio.run(scenario())


def test_while_hurried_completions_reach_the_loop_at_once_not_at_the_collect(monkeypatch):
    # A handover's drain waits for its queue's batches; the collect (a minute here) must not add to it.
    monkeypatch.setattr(consume_pool, "COLLECT_S", 60.0)

    async def scenario():
        results: list[str] = []
        gate = threading.Event()
        pool = ConsumeThreadPool(max_threads=1, name="t", loop=asyncio.get_running_loop())
        pool.submit([lambda: lambda: results.append("before")])
        while not pool._done:  # (done by the thread; its completion now waits for the collect)
            await asyncio.sleep(0.001)
        pool.submit([lambda: (gate.wait(10), lambda: results.append("inside"))[1]])
        with pool.hurried():
            assert results == ["before"]  # what finished already is taken when the wait begins
            pool.submit([lambda: lambda: results.append("later")])  # (a hand-off: a collect is due again)
            gate.set()
            for _ in range(5000):  # what finishes while hurried wakes the loop itself
                if len(results) == 3:
                    break
                await asyncio.sleep(0.001)
            assert results == ["before", "inside", "later"]
        await asyncio.to_thread(pool.shutdown)
    asyncio.run(scenario())


def test_a_task_that_outlasts_the_collect_wakes_the_loop_itself(monkeypatch):
    monkeypatch.setattr(consume_pool, "COLLECT_S", 0.01)

    async def scenario():
        loop = asyncio.get_running_loop()
        collected, finished, gate = asyncio.Event(), asyncio.Event(), threading.Event()
        pool = ConsumeThreadPool(max_threads=1, name="t", loop=loop, on_drained=collected.set)
        pool.submit([lambda: (gate.wait(10), finished.set)[1]])
        await asyncio.wait_for(collected.wait(), 5)  # the collect came by before the task finished
        gate.set()
        await asyncio.wait_for(finished.wait(), 5)
        await asyncio.to_thread(pool.shutdown)
    asyncio.run(scenario())


def test_an_orderly_task_that_dies_drops_its_lease():
    async def scenario():
        died = []
        pool = ConsumeThreadPool(max_threads=1, name="t", loop=asyncio.get_running_loop())
        service = ConsumeMessageOrderlyService(
            listener=lambda m, c: ConsumeOrderlyStatus.SUCCESS, settings=PushConsumerSettings(group="g"), pool=pool,
            offset_store=FakeStore(), send_back=FakeSendBack(), fetcher=FakeFetcher(), suspended=lambda: False,
            on_death=lambda le, e: died.append((le, e)), on_lock_lapsed=lambda le: None)
        le = lease()
        le.pq.put_messages([msg(0)])

        def broken(msgs):
            raise RuntimeError("cache corrupted")
        le.pq.remove_messages = broken
        service.submit(le, [msg(0)])
        for _ in range(100):
            if died:
                break
            await asyncio.sleep(0.01)
        assert died and died[0][0] is le and isinstance(died[0][1], RuntimeError)
        assert le.running == 0
        await asyncio.to_thread(pool.shutdown)
    asyncio.run(scenario())


def test_an_orderly_batch_of_a_queue_whose_lock_lapsed_waits_for_its_renewal_outside_the_listener():
    async def scenario():
        called, lapsed = [], []
        pool = ConsumeThreadPool(max_threads=1, name="t", loop=asyncio.get_running_loop())
        service = ConsumeMessageOrderlyService(
            listener=lambda m, c: called.append([x.queue_offset for x in m]) or ConsumeOrderlyStatus.SUCCESS,
            settings=PushConsumerSettings(group="g"), pool=pool, offset_store=FakeStore(), send_back=FakeSendBack(),
            fetcher=FakeFetcher(), suspended=lambda: False, on_death=lambda le, e: None,
            on_lock_lapsed=lapsed.append)
        hold = LockHold()  # nothing confirmed: lapsed
        le = QueueLease(MQ, client_id="c1", owner_epoch=7, reset_generation=0, start_offset=0, lock=hold)
        le.pq.put_messages([msg(0), msg(1)])
        service.submit(le, [msg(0), msg(1)])
        for _ in range(500):
            if lapsed and le.running == 0:
                break
            await asyncio.sleep(0.01)
        # Told once, the batch put back, the worker ended: a handover draining the queue waits for nothing.
        assert lapsed == [le] and le.running == 0 and called == []
        service.resume()  # (a resume while the lock is still lapsed starts nothing)
        await asyncio.sleep(0.05)
        assert called == [] and lapsed == [le]
        hold.confirm(sent_at=time.monotonic(), expiry_ms=60_000)  # renewed
        service.resume()
        for _ in range(500):
            if len(called) == 2:
                break
            await asyncio.sleep(0.01)
        assert called == [[0], [1]]  # in order, from the batch put back
        await asyncio.to_thread(pool.shutdown)
    asyncio.run(scenario())


# -- offsets ----------------------------------------------------------------------------------


def test_commits_quote_the_fence_of_the_queue_s_current_lease():
    store = RemoteBrokerOffsetStore(cluster=None, group="g", client_id="c1", require_fence=True)
    store.update_offset(MQ, 5, increase_only=False)
    assert store.commit_for(MQ) is None  # with locking, no commit without an owner epoch
    first = lease(epoch=11)
    store.bind(first)
    c = store.commit_for(MQ)
    assert (c.offset, c.owner_epoch, c.reset_generation, c.client_id) == (5, 11, 0, "c1")
    store.bind(first.successor(40, reset_generation=2), 40)
    c = store.commit_for(MQ)
    assert (c.offset, c.owner_epoch, c.reset_generation) == (40, 11, 2)
    store.preload(MQ, 33, 4)
    assert store.read_memory(MQ) == 33 and store.generation(MQ) == 4


# -- the scheduler ------------------------------------------------------------------------


def test_stop_never_hangs_when_a_trigger_races_it_and_the_caller_s_cancel_propagates():
    async def scenario():
        runs = []
        sched = Scheduler("t")

        async def job():
            runs.append(time.monotonic())
            await asyncio.sleep(0)
        sched.every("j", 0.01, job, initial_delay_s=0)
        await sched.start()
        for _ in range(50):
            sched.trigger("j")  # set the wake event right when stop() cancels
            await asyncio.wait_for(sched.stop(), 2)
            await sched.start()
        await sched.stop()

        async def stopper():
            sched.every("slow", 5, lambda: asyncio.sleep(10), initial_delay_s=0)
            await sched.start()
            await asyncio.sleep(0.01)
            await sched.stop()
            await asyncio.sleep(10)
        task = asyncio.ensure_future(stopper())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(scenario())


# -- settings ---------------------------------------------------------------------------------


def test_settings_take_names_as_users_write_them_and_name_the_bad_one():
    s = build(PushConsumerSettings, None, dict(group="g", message_model="clustering",
                                               consume_from_where="FIRST_OFFSET", allocate_strategy="avg_by_circle"))
    assert s.message_model is MessageModel.CLUSTERING
    assert s.consume_from_where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    assert s.allocate_strategy.name == "AVG_BY_CIRCLE"
    room = build(PushConsumerSettings, None, dict(group="g", allocate_strategy="MACHINE_ROOM",
                                                  allocate_strategy_args={"consume_idcs": ["hz"]}))
    assert room.allocate_strategy.name == "MACHINE_ROOM"
    for bad, setting in ((dict(message_model="CLUSTER"), "message_model"),
                         (dict(consume_from_where="yesterday"), "consume_from_where"),
                         (dict(allocate_strategy="MACHINE_ROOM"), "allocate_strategy"),
                         (dict(allocate_strategy="CONFIG"), "allocate_strategy"),
                         (dict(pull_batch_size=0), "pull_batch_size")):
        with pytest.raises(InvalidArgumentError, match=setting):
            build(PushConsumerSettings, None, dict(group="g", **bad))
    for removed in ("consume_thread_min", "broker_suspend_max_time_ms"):
        with pytest.raises(InvalidArgumentError, match="unknown"):
            build(PushConsumerSettings, None, {"group": "g", removed: 1})
    assert build(PullConsumerSettings, None, dict(group="g", message_model="BROADCASTING")).message_model \
        is MessageModel.BROADCASTING


def test_a_fallback_retry_never_asks_for_more_delay_levels_than_the_broker_has():
    from tidemark.client.consumer.send_back import retry_delay_level
    assert retry_delay_level(0, 0, 18) == 3  # RocketMQ's 3 + reconsume times
    assert retry_delay_level(20, 0, 18) == 18
    assert retry_delay_level(0, 0, 2) == 2  # a broker configured with two levels
    assert retry_delay_level(5, 1, 2) == 1  # the listener's own choice, when it fits
