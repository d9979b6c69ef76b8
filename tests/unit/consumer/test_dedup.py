"""DedupListener: skip what was consumed, retry what is in flight, map a batch back to ack_index (its stores' bounds
and the file store: test_dedup_stores.py)."""

from __future__ import annotations

import math
import threading
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.client.consumer.dedup import (
    ClaimOutcome,
    DedupKey,
    DedupListener,
    DedupStore,
    FileDedupStore,
    MemoryDedupStore,
)
from tidemark.client.consumer.listener import (
    ConsumeConcurrentlyContext,
    ConsumeOrderlyContext,
    split_by_ack_index,
)
from tidemark.client.errors import InvalidArgumentError, InvalidTypeError
from tidemark.client.message import (
    ConsumeConcurrentlyStatus,
    ConsumeOrderlyStatus,
    MessageExt,
    MessageQueue,
)

SUCCESS = ConsumeConcurrentlyStatus.CONSUME_SUCCESS
LATER = ConsumeConcurrentlyStatus.RECONSUME_LATER
MQ = MessageQueue("Orders", "broker-a", 0)
GROUP = "billing"


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def msg(msg_id: str, keys: str = "", topic: str = "Orders", offset: int = 0) -> MessageExt:
    return MessageExt(topic=topic, broker_name="broker-a", queue_id=0, queue_offset=offset, msg_id=msg_id,
                      body=b"x", keys=keys)


class Recorder:
    """A concurrent listener: records what it saw, answers with `status` and `ack_index`."""

    def __init__(self, status=SUCCESS, ack_index: int | None = None, raises: BaseException | None = None) -> None:
        self.status, self.ack_index, self.raises = status, ack_index, raises
        self.calls: list[list[str]] = []
        self.lock = threading.Lock()

    def __call__(self, msgs, context):
        with self.lock:
            self.calls.append([m.msg_id for m in msgs])
        if self.raises is not None:
            raise self.raises
        if self.ack_index is not None:
            context.ack_index = self.ack_index
        return self.status

    @property
    def seen(self) -> list[str]:
        return [i for call in self.calls for i in call]


def deliver(listener, *msgs: MessageExt) -> tuple[object, int]:
    """Call as the concurrent consume service does; (status, how many leading messages it consumed)."""
    ctx = ConsumeConcurrentlyContext(message_queue=MQ)
    status = listener(list(msgs), ctx)
    return status, split_by_ack_index(len(msgs), status, ctx.ack_index)


def key(k: str, group: str = GROUP, topic: str = "Orders") -> tuple[str, str, str]:
    return (group, topic, k)


# -- one message at a time ----------------------------------------------------------------------


def test_a_consumed_message_is_skipped_when_delivered_again():
    user = Recorder()
    dedup = DedupListener(user, group=GROUP)
    assert deliver(dedup, msg("a")) == (SUCCESS, 1)
    assert deliver(dedup, msg("a")) == (SUCCESS, 1)
    assert deliver(dedup, msg("b")) == (SUCCESS, 1)
    assert user.seen == ["a", "b"]
    assert dedup.stats().skipped == 1


def test_keys_mode_catches_a_resend_and_falls_back_to_msg_id():
    user = Recorder()
    dedup = DedupListener(user, group=GROUP, key=DedupKey.KEYS)
    deliver(dedup, msg("id1", keys="order-7"))
    deliver(dedup, msg("id2", keys="order-7"))  # the producer sent it again
    deliver(dedup, msg("id3"))
    deliver(dedup, msg("id3"))  # no keys: the msg id decides
    assert user.seen == ["id1", "id3"]
    by_id = DedupListener(user, group=GROUP, key=DedupKey.MSG_ID)
    deliver(by_id, msg("id4", keys="order-8"))
    deliver(by_id, msg("id5", keys="order-8"))  # a resend is a new message to MSG_ID
    assert user.seen[-2:] == ["id4", "id5"]


def test_key_function_none_means_not_deduplicated_and_a_non_str_is_an_error():
    user = Recorder()
    dedup = DedupListener(user, group=GROUP, key=lambda m: None if m.msg_id.startswith("x") else m.msg_id[:1])
    for i in ("x1", "x1", "a1", "a2"):
        deliver(dedup, msg(i))
    assert user.seen == ["x1", "x1", "a1"]
    bad = DedupListener(user, group=GROUP, key=lambda m: 42)
    with pytest.raises(InvalidTypeError, match="int"):
        deliver(bad, msg("z"))


def test_marks_are_per_group_and_topic_so_one_store_serves_several_groups():
    store = MemoryDedupStore()
    user_a, user_b = Recorder(), Recorder()
    a = DedupListener(user_a, group="billing", store=store)
    b = DedupListener(user_b, group="shipping", store=store)
    deliver(a, msg("m"))
    deliver(b, msg("m"))
    deliver(a, msg("m", topic="Refunds"))
    deliver(a, msg("m"))
    assert user_a.seen == ["m", "m"] and user_b.seen == ["m"]


def test_a_copy_in_flight_elsewhere_is_retried_not_skipped():
    store = MemoryDedupStore()
    user = Recorder()
    dedup = DedupListener(user, group=GROUP, store=store)
    holder = store.claim(key("a"), 60)  # another thread is running "a"
    ctx = ConsumeConcurrentlyContext(message_queue=MQ)
    assert dedup([msg("a")], ctx) is LATER and ctx.ack_index == -1
    assert user.seen == [] and dedup.stats().deferred == 1
    store.mark_consumed(holder, 3600)
    assert deliver(dedup, msg("a")) == (SUCCESS, 1)  # the retry finds it consumed
    assert user.seen == [] and dedup.stats().skipped == 1


def test_a_copy_in_flight_on_a_real_thread():
    started, finish = threading.Event(), threading.Event()
    calls = Counter()

    def slow(msgs, ctx):
        calls[msgs[0].msg_id] += 1
        started.set()
        assert finish.wait(10)
        return SUCCESS

    dedup = DedupListener(slow, group=GROUP)
    results = []
    t = threading.Thread(target=lambda: results.append(deliver(dedup, msg("a"))))
    t.start()
    assert started.wait(10)
    assert deliver(dedup, msg("a")) == (LATER, 0)
    finish.set()
    t.join(10)
    assert results == [(SUCCESS, 1)]
    assert deliver(dedup, msg("a")) == (SUCCESS, 1)
    assert calls == {"a": 1}


def test_consuming_mark_expires_and_the_stale_holder_cannot_delete_the_new_one():
    clock = Clock()
    store = MemoryDedupStore(clock=clock)
    user = Recorder()
    dedup = DedupListener(user, group=GROUP, store=store, consuming_expire_s=30)
    stale = store.claim(key("a"), 30)  # a listener call that hung
    clock.now += 29.9
    assert deliver(dedup, msg("a")) == (LATER, 0)
    clock.now += 0.2
    taken = store.claim(key("a"), 30)
    assert taken.outcome is ClaimOutcome.ACQUIRED and taken.token != stale.token
    store.release(stale)  # the hung call fails at last: it must not free the new holder's mark
    assert store.claim(key("a"), 30).outcome is ClaimOutcome.IN_FLIGHT
    store.mark_consumed(taken, 60)
    assert deliver(dedup, msg("a")) == (SUCCESS, 1) and user.seen == []


def test_a_stale_holder_that_succeeds_still_marks_consumed():
    clock = Clock()
    store = MemoryDedupStore(clock=clock)
    stale = store.claim(key("a"), 1)
    clock.now += 2
    fresh = store.claim(key("a"), 1)
    store.mark_consumed(stale, 60)  # its side effect happened
    assert store.claim(key("a"), 1).outcome is ClaimOutcome.DUPLICATE
    store.release(fresh)  # the second run failing does not undo the first one's success
    assert store.claim(key("a"), 1).outcome is ClaimOutcome.DUPLICATE


@pytest.mark.parametrize("failing", [
    Recorder(status=LATER),
    Recorder(status=None),  # not a status: RECONSUME_LATER, like the consume service
    Recorder(status=SUCCESS, ack_index=-1),
])
def test_a_failure_clears_the_mark_so_the_retry_runs(failing):
    store = MemoryDedupStore()
    dedup = DedupListener(failing, group=GROUP, store=store)
    assert deliver(dedup, msg("a")) == (LATER, 0)
    assert store.claim(key("a"), 60).outcome is ClaimOutcome.ACQUIRED  # no mark left behind


def test_an_exception_clears_the_mark_and_propagates():
    store = MemoryDedupStore()
    user = Recorder(raises=RuntimeError("db down"))
    dedup = DedupListener(user, group=GROUP, store=store)
    with pytest.raises(RuntimeError, match="db down"):
        deliver(dedup, msg("a"), msg("b"))
    user.raises = None
    assert deliver(dedup, msg("a"), msg("b")) == (SUCCESS, 2)
    assert user.seen == ["a", "b", "a", "b"]


def test_a_failing_key_function_releases_the_marks_already_taken():
    def key_of(m):
        if m.msg_id == "bad":
            raise ValueError("no key")
        return m.msg_id

    store = MemoryDedupStore()
    dedup = DedupListener(Recorder(), group=GROUP, store=store, key=key_of)
    with pytest.raises(ValueError, match="no key"):
        deliver(dedup, msg("a"), msg("bad"))
    assert store.claim(key("a"), 60).outcome is ClaimOutcome.ACQUIRED


def test_a_consumed_record_expires_after_record_expire_s():
    clock = Clock()
    user = Recorder()
    dedup = DedupListener(user, group=GROUP, store=MemoryDedupStore(clock=clock), record_expire_s=100)
    deliver(dedup, msg("a"))
    clock.now += 99
    deliver(dedup, msg("a"))
    clock.now += 2
    deliver(dedup, msg("a"))
    assert user.seen == ["a", "a"]


def test_threads_racing_on_the_same_keys_run_each_key_once():
    calls = Counter()
    lock = threading.Lock()

    def count(msgs, ctx):
        with lock:
            calls.update(m.msg_id for m in msgs)
        return SUCCESS

    dedup = DedupListener(count, group=GROUP)
    keys = [f"k{i}" for i in range(200)]

    def worker() -> None:
        for k in keys:
            while deliver(dedup, msg(k))[1] != 1:  # retried until it counts as consumed
                pass

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert calls == Counter(keys)
    assert dedup.stats().skipped == 7 * len(keys)


# -- batches: ack_index --------------------------------------------------------------------------


def test_batch_skips_duplicates_and_the_listener_gets_the_rest():
    store = MemoryDedupStore()
    user = Recorder()
    dedup = DedupListener(user, group=GROUP, store=store)
    deliver(dedup, msg("b"))
    ctx = ConsumeConcurrentlyContext(message_queue=MQ)
    assert dedup([msg("a"), msg("b"), msg("c")], ctx) is SUCCESS and ctx.ack_index is None
    assert user.calls == [["b"], ["a", "c"]]


def test_user_ack_index_counts_in_the_run_and_maps_back_to_the_batch():
    store = MemoryDedupStore()
    user = Recorder()
    dedup = DedupListener(user, group=GROUP, store=store)
    deliver(dedup, msg("b"))
    user.status, user.ack_index = SUCCESS, 0  # the run is [a, c, d]: only a succeeded
    ctx = ConsumeConcurrentlyContext(message_queue=MQ)
    status = dedup([msg("a"), msg("b"), msg("c"), msg("d")], ctx)
    assert (status, ctx.ack_index) == (SUCCESS, 1)  # a, then the skipped b; c and d are retried
    assert user.calls[-1] == ["a", "c", "d"]
    assert store.claim(key("c"), 60).outcome is ClaimOutcome.ACQUIRED
    assert store.claim(key("a"), 60).outcome is ClaimOutcome.DUPLICATE


def test_claiming_stops_at_a_message_in_flight_elsewhere():
    store = MemoryDedupStore()
    user = Recorder()
    dedup = DedupListener(user, group=GROUP, store=store)
    store.claim(key("b"), 60)
    ctx = ConsumeConcurrentlyContext(message_queue=MQ)
    assert dedup([msg("a"), msg("b"), msg("c")], ctx) is SUCCESS and ctx.ack_index == 0
    assert user.seen == ["a"]  # c would be retried with b anyway: not run now, not claimed
    assert store.claim(key("c"), 60).outcome is ClaimOutcome.ACQUIRED


def test_leading_duplicates_count_even_when_the_run_fails_and_the_users_delay_level_passes_through():
    store = MemoryDedupStore()
    dedup = DedupListener(Recorder(), group=GROUP, store=store)
    deliver(dedup, msg("a"))

    def later_with_delay(msgs, context):
        context.delay_level_when_next_consume = 5
        return LATER

    dedup.listener = later_with_delay
    ctx = ConsumeConcurrentlyContext(message_queue=MQ)
    assert dedup([msg("a"), msg("b")], ctx) is SUCCESS and ctx.ack_index == 0  # a skipped, b retried
    assert ctx.delay_level_when_next_consume == 5


@pytest.mark.parametrize("status, consumed", [(SUCCESS, 3), (LATER, 0)])
def test_copies_of_one_key_in_a_batch_run_once_and_share_the_outcome(status, consumed):
    user = Recorder(status=status)
    dedup = DedupListener(user, group=GROUP, key=DedupKey.KEYS)
    batch = [msg("1", keys="k"), msg("2", keys="j"), msg("3", keys="k")]
    assert deliver(dedup, *batch)[1] == consumed
    assert user.calls == [["1", "2"]]


@settings(max_examples=300, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(["new", "consumed", "in_flight", "copy", "untracked"]), min_size=1, max_size=8),
    user_status=st.sampled_from([SUCCESS, LATER]),
    user_ack=st.one_of(st.none(), st.integers(min_value=-2, max_value=9)),
)
def test_batch_outcome_is_a_prefix_holding_exactly_the_consumed_messages(kinds, user_status, user_ack):
    store = MemoryDedupStore()
    seen: list[list[MessageExt]] = []

    def user(msgs, ctx):
        seen.append(list(msgs))
        ctx.ack_index = user_ack
        return user_status

    dedup = DedupListener(user, group=GROUP, store=store, key=lambda m: m.keys or None)
    batch: list[MessageExt] = []
    before: dict[str, ClaimOutcome] = {}  # per key, what a claim would have found before the call
    for i, kind in enumerate(kinds):
        if kind == "copy" and batch and batch[-1].keys:
            batch.append(msg(f"m{i}", keys=batch[-1].keys))
            continue
        k = "" if kind == "untracked" else f"k{i}"
        batch.append(msg(f"m{i}", keys=k))
        if kind == "consumed":
            store.mark_consumed(store.claim(key(k), 60), 60)
            before[k] = ClaimOutcome.DUPLICATE
        elif kind == "in_flight":
            store.claim(key(k), 60)
            before[k] = ClaimOutcome.IN_FLIGHT
        elif k:
            before[k] = ClaimOutcome.ACQUIRED

    ctx = ConsumeConcurrentlyContext(message_queue=MQ)
    status = dedup(batch, ctx)
    n = split_by_ack_index(len(batch), status, ctx.ack_index)
    run = seen[0] if seen else []
    ok_run = run[:split_by_ack_index(len(run), user_status, user_ack)] if run else []
    ok_keys = {m.keys for m in ok_run}
    ok_ids = {m.msg_id for m in ok_run}

    # The listener never sees a consumed or in-flight key, nor one key twice.
    assert all(before.get(m.keys) is ClaimOutcome.ACQUIRED or not m.keys for m in run)
    tracked = [m.keys for m in run if m.keys]
    assert len(tracked) == len(set(tracked))
    # The prefix reported consumed holds only consumed messages, and every message the listener
    # handled is in it.
    for m in batch[:n]:
        assert m.msg_id in ok_ids or (m.keys and (before[m.keys] is ClaimOutcome.DUPLICATE or m.keys in ok_keys))
    assert ok_ids <= {m.msg_id for m in batch[:n]}
    assert n == len(batch) or status is LATER or ctx.ack_index == n - 1
    # Marks: handled keys CONSUMED, keys that were absent and not handled absent again.
    for k, outcome in before.items():
        now = store.claim(key(k), 60).outcome
        if k in ok_keys or outcome is ClaimOutcome.DUPLICATE:
            assert now is ClaimOutcome.DUPLICATE
        elif outcome is ClaimOutcome.IN_FLIGHT:
            assert now is ClaimOutcome.IN_FLIGHT
        else:
            assert now is ClaimOutcome.ACQUIRED, k


# -- orderly ---------------------------------------------------------------------------------------


def orderly_deliver(listener, *msgs: MessageExt) -> tuple[ConsumeOrderlyStatus, ConsumeOrderlyContext]:
    ctx = ConsumeOrderlyContext(message_queue=MQ)
    return listener(list(msgs), ctx), ctx


def test_orderly_skips_duplicates_and_passes_the_real_context():
    seen = []

    def user(msgs, ctx):
        seen.append([m.msg_id for m in msgs])
        ctx.suspend_current_queue_time_ms = 50
        return ConsumeOrderlyStatus.SUCCESS

    dedup = DedupListener(user, group=GROUP)
    orderly_deliver(dedup, msg("a"))
    status, ctx = orderly_deliver(dedup, msg("a"), msg("b"))
    assert status is ConsumeOrderlyStatus.SUCCESS and ctx.suspend_current_queue_time_ms == 50
    assert seen == [["a"], ["b"]] and dedup.stats().skipped == 1


def test_orderly_in_flight_suspends_and_the_part_before_it_stays_consumed():
    store = MemoryDedupStore()
    seen = []
    dedup = DedupListener(lambda msgs, ctx: seen.append([m.msg_id for m in msgs]) or ConsumeOrderlyStatus.SUCCESS,
                          group=GROUP, store=store)
    holder = store.claim(key("b"), 60)
    status, _ = orderly_deliver(dedup, msg("a"), msg("b"), msg("c"))
    assert status is ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
    assert seen == [["a"]]  # c must not run before b
    store.mark_consumed(holder, 60)
    status, _ = orderly_deliver(dedup, msg("a"), msg("b"), msg("c"))
    assert status is ConsumeOrderlyStatus.SUCCESS and seen == [["a"], ["c"]]


@pytest.mark.parametrize("answer", [ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT, "nonsense"])
def test_orderly_failure_releases_every_mark(answer):
    store = MemoryDedupStore()
    dedup = DedupListener(lambda msgs, ctx: answer, group=GROUP, store=store)
    status, _ = orderly_deliver(dedup, msg("a"), msg("b"))
    assert status is ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
    assert store.claim(key("a"), 60).outcome is ClaimOutcome.ACQUIRED
    assert store.claim(key("b"), 60).outcome is ClaimOutcome.ACQUIRED


# -- bad arguments ---------------------------------------------------------------------------------


def ok(msgs, ctx):
    return SUCCESS


@pytest.mark.parametrize("kwargs, match", [
    (dict(listener="nope"), "listener must be callable"),
    (dict(group=""), "group"),
    (dict(group=None), "group"),
    (dict(store={}), "DedupStore"),
    (dict(key="KEYS"), "DedupKey"),
    (dict(consuming_expire_s=0), "positive"),
    (dict(consuming_expire_s=-1), "positive"),
    (dict(consuming_expire_s=math.nan), "positive"),
    (dict(consuming_expire_s=math.inf), "positive"),
    (dict(consuming_expire_s=True), "number"),
    (dict(record_expire_s="60"), "number"),
    (dict(record_expire_s=0.0), "positive"),
])
def test_bad_listener_arguments_raise_invalid_argument(kwargs, match):
    args = dict(listener=ok, group=GROUP) | kwargs
    listener = args.pop("listener")
    with pytest.raises(InvalidArgumentError, match=match):
        DedupListener(listener, **args)


@pytest.mark.parametrize("max_entries", [0, -1, True, 1.5, "10"])
def test_bad_max_entries_raise_invalid_argument(max_entries, tmp_path):
    with pytest.raises(InvalidArgumentError, match="max_entries"):
        MemoryDedupStore(max_entries)
    with pytest.raises(InvalidArgumentError, match="max_entries"):
        FileDedupStore(tmp_path / "d.dedup", max_entries)


def test_bad_file_store_paths_and_claims_raise_invalid_argument(tmp_path):
    with pytest.raises(InvalidArgumentError, match="directory"):
        FileDedupStore(tmp_path)
    with pytest.raises(InvalidArgumentError, match="path"):
        FileDedupStore(42)
    store = MemoryDedupStore()
    store.mark_consumed(store.claim(key("a"), 60), 60)
    duplicate = store.claim(key("a"), 60)
    with pytest.raises(InvalidArgumentError, match="ACQUIRED"):
        store.mark_consumed(duplicate, 60)
    with pytest.raises(InvalidArgumentError, match="ACQUIRED"):
        store.release(duplicate)
    assert issubclass(InvalidTypeError, InvalidArgumentError)


def test_a_custom_store_only_needs_the_three_operations():
    class Shared(DedupStore):
        def __init__(self) -> None:
            self.inner = MemoryDedupStore()

        def claim(self, key, consuming_expire_s):
            return self.inner.claim(key, consuming_expire_s)

        def mark_consumed(self, claim, record_expire_s):
            self.inner.mark_consumed(claim, record_expire_s)

        def release(self, claim):
            self.inner.release(claim)

    user = Recorder()
    dedup = DedupListener(user, group=GROUP, store=Shared())
    deliver(dedup, msg("a"))
    deliver(dedup, msg("a"))
    assert user.seen == ["a"]
