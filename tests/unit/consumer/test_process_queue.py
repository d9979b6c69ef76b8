"""ProcessQueue: the min-offset commit rule (the smallest unfinished offset), flow-control counters."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tidemark.client.consumer.process_queue import ProcessQueue
from tidemark.client.message import MessageExt


def msg(offset: int, body: bytes = b"x") -> MessageExt:
    return MessageExt(
        topic="t",
        broker_name="broker-a",
        queue_id=0,
        queue_offset=offset,
        msg_id=f"id-{offset}",
        body=body,
        store_size=len(body),  # the cache counts record bytes; here a record is its body
    )


def msgs(*offsets: int) -> list[MessageExt]:
    return [msg(o) for o in offsets]


# -- concurrent consumption and the commit offset: the smallest still unfinished -------------------


def test_seed_000_slow_first_message_holds_the_commit_offset_back():
    pq = ProcessQueue()
    m = {i: msg(100 + i) for i in range(1, 11)}  # m1..m10 at offsets 101..110
    pq.put_messages(list(m.values()))
    # m10 finishes first: committing past m1 would lose m1 on a crash.
    assert pq.remove_messages([m[10]]) == m[1].queue_offset
    assert pq.remove_messages([m[i] for i in range(2, 10)]) == m[1].queue_offset
    # m1 finishes last: everything pulled is done, commit max + 1.
    assert pq.remove_messages([m[1]]) == 111
    assert pq.msg_count == 0 and pq.min_offset() is None


def test_remove_returns_minus_one_when_cache_was_already_empty():
    pq = ProcessQueue()
    assert pq.remove_messages(msgs(1)) == -1
    pq.put_messages(msgs(1, 2))
    assert pq.remove_messages(msgs(1, 2)) == 3
    assert pq.remove_messages(msgs(1, 2)) == -1


def test_remove_of_unknown_offsets_changes_nothing_but_still_reports():
    pq = ProcessQueue()
    pq.put_messages(msgs(5, 6))
    assert pq.remove_messages(msgs(99)) == 5
    assert pq.msg_count == 2


def test_duplicate_offsets_are_ignored_and_the_first_copy_kept():
    pq = ProcessQueue()
    first = msg(7, b"first")
    pq.put_messages([first, msg(8)])
    pq.put_messages([msg(7, b"a much longer duplicate"), msg(8)])
    assert pq.msg_count == 2
    assert pq.msg_size == len(b"first") + 1


def test_counters_track_body_bytes_and_offset_max():
    pq = ProcessQueue()
    assert pq.queue_offset_max == -1 and pq.msg_count == 0 and pq.msg_size == 0
    pq.put_messages([msg(3, b"abc"), msg(10, b"0123456789"), msg(4, b"")])
    assert (pq.msg_count, pq.msg_size, pq.queue_offset_max) == (3, 13, 10)
    pq.remove_messages([msg(10, b"")])  # size comes from the cached copy, not the argument
    assert (pq.msg_count, pq.msg_size, pq.queue_offset_max) == (2, 3, 10)


def test_max_span_is_largest_minus_smallest_cached_offset():
    pq = ProcessQueue()
    assert pq.max_span() == 0
    pq.put_messages(msgs(5))
    assert pq.max_span() == 0
    pq.put_messages(msgs(20, 9))
    assert pq.max_span() == 15
    pq.remove_messages(msgs(20))
    assert pq.max_span() == 4
    pq.remove_messages(msgs(5))
    assert pq.max_span() == 0


def test_a_long_stuck_message_does_not_let_dead_entries_pile_up():
    # Private look at the heaps: lazy deletion must not keep O(all ever pulled).
    pq = ProcessQueue()
    pq.put_messages(msgs(7))
    for start in range(10, 20_010, 100):
        batch = msgs(*range(start, start + 100))
        pq.put_messages(batch)
        assert pq.max_span() == start + 99 - 7
        assert pq.remove_messages(batch) == 7
        assert pq.max_span() == 0
    assert len(pq._min_heap) <= 2 * pq.msg_count + 64
    assert len(pq._max_heap) <= 2 * pq.msg_count + 64
    # The rebuilt heaps still answer correctly, at both ends.
    pq.put_messages(msgs(3))
    assert pq.max_span() == 7 - 3
    pq.put_messages(msgs(50_000))
    assert pq.max_span() == 50_000 - 3
    assert pq.remove_messages(msgs(3)) == 7


@settings(max_examples=200, deadline=None)
@given(
    offsets=st.lists(st.integers(0, 5_000), min_size=1, max_size=150, unique=True).map(sorted),
    data=st.data(),
)
def test_commit_offset_never_passes_an_unfinished_message(offsets, data):
    """Pulls arrive in ascending batches; completions in any order and batch size."""
    pq = ProcessQueue()
    unpulled = list(offsets)
    unfinished: set[int] = set()
    finished: set[int] = set()
    committed = -1  # an increase-only offset store fed with remove_messages' results

    while unpulled or unfinished:
        if unpulled and (not unfinished or data.draw(st.booleans(), label="pull")):
            size = data.draw(st.integers(1, len(unpulled)), label="pull size")
            batch, unpulled = unpulled[:size], unpulled[size:]
            pq.put_messages(msgs(*batch))
            unfinished.update(batch)
            continue
        done = data.draw(
            st.lists(
                st.sampled_from(sorted(unfinished)),
                min_size=1,
                max_size=len(unfinished),
                unique=True,
            ),
            label="completed",
        )
        # Redelivered completions of already finished messages must not matter.
        if finished:
            done += data.draw(
                st.lists(st.sampled_from(sorted(finished)), max_size=3), label="repeat"
            )
        data.draw(st.randoms(use_true_random=False), label="shuffle").shuffle(done)
        returned = pq.remove_messages(msgs(*done))
        unfinished.difference_update(done)
        finished.update(done)

        assert returned != -1
        smallest_unfinished = min(unfinished | set(unpulled), default=None)
        if smallest_unfinished is not None:
            assert returned <= smallest_unfinished
        previous, committed = committed, max(committed, returned)
        assert committed >= previous
        assert pq.msg_count == len(unfinished)
        assert pq.min_offset() == min(unfinished, default=None)

    assert committed == offsets[-1] + 1


def test_filtered_offsets_count_as_consumed_once_the_cache_is_empty():
    """Tags paid, shipped, shipped with a `paid` subscription: the broker delivers offset 0 and says it
    read to 3. The commit must reach 3, not stop at 1 (a lag that never clears)."""
    pq = ProcessQueue()
    pq.put_messages(msgs(0))
    pq.advance_to(3)
    assert pq.remove_messages(msgs(0)) == 3
    # Skipping while messages are held: commit stops at the first unfinished one, then jumps.
    pq.put_messages(msgs(5, 6))
    pq.advance_to(10)
    assert pq.remove_messages(msgs(6)) == 5
    assert pq.remove_messages(msgs(5)) == 10


# -- model-based: any mix of operations keeps the bookkeeping exact -----------


class ProcessQueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pq = ProcessQueue()
        self.waiting: dict[int, int] = {}  # offset -> body length
        self.offset_max = -1

    @rule(offsets=st.lists(st.integers(0, 300), max_size=20), size=st.integers(0, 5))
    def put(self, offsets, size):
        new = [o for o in dict.fromkeys(offsets) if o not in self.waiting]
        self.pq.put_messages([msg(o, b"z" * size) for o in offsets])
        for o in new:
            self.waiting[o] = size
            self.offset_max = max(self.offset_max, o)

    @rule(data=st.data())
    def remove(self, data):
        pool = sorted(self.waiting) + [301, 302]
        done = data.draw(st.lists(st.sampled_from(pool), max_size=10))
        was_empty = not self.waiting
        returned = self.pq.remove_messages(msgs(*done))
        for o in done:
            self.waiting.pop(o, None)
        if was_empty:
            assert returned == -1
        else:
            assert returned == min(self.waiting, default=self.offset_max + 1)

    @invariant()
    def bookkeeping_matches_the_model(self):
        pq = self.pq
        assert pq.msg_count == len(self.waiting)
        assert pq.msg_size == sum(self.waiting.values())
        assert pq.queue_offset_max == self.offset_max
        assert pq.min_offset() == min(self.waiting, default=None)
        span = max(self.waiting) - min(self.waiting) if len(self.waiting) > 1 else 0
        assert pq.max_span() == span


TestProcessQueueModel = ProcessQueueMachine.TestCase
TestProcessQueueModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
