"""ProducerTable (pure) and its journal: verdicts, the window, errors, expiry, replay, unstored batches."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.broker.errors import ConfigFileError, InvalidArgumentError
from tidemark.broker.producers.store import (
    STATE_FILE_NAME,
    ProducerStateStore,
    _encode_generic,
    decode_events,
    encode_events,
)
from tidemark.broker.producers.table import (
    WINDOW,
    Allocated,
    Appended,
    Forgotten,
    OutOfOrderSequenceError,
    ProducerFencedError,
    ProducerTable,
    SequenceGapError,
    UnknownProducerError,
    Verdict,
)


def store(table: ProducerTable, pid: int, seq: int, count: int, offset: int, *, epoch: int = 0,
          topic: str = "T", queue_id: int = 0) -> None:
    decision = table.check(pid, epoch, topic, queue_id, seq, count)
    assert decision.verdict is Verdict.APPEND
    table.will_append(pid, epoch, topic, queue_id, seq, count, offset, f"id-{offset}", 1000)


def test_sequences_follow_each_other_and_retries_are_duplicates_with_their_offsets():
    table = ProducerTable()
    pid = table.allocate("", 1000)
    store(table, pid, 0, 3, 10)
    store(table, pid, 3, 2, 13)
    assert table.check(pid, 0, "T", 0, 0, 3).first_offset == 10
    assert table.check(pid, 0, "T", 0, 3, 2).first_offset == 13
    assert table.check(pid, 0, "T", 1, 0, 1).verdict is Verdict.APPEND, "queues have their own sequences"
    with pytest.raises(OutOfOrderSequenceError, match="expected sequence 5, got 6"):
        table.check(pid, 0, "T", 0, 6, 1)
    with pytest.raises(OutOfOrderSequenceError, match="overlaps"):
        table.check(pid, 0, "T", 0, 1, 3)


def test_a_batch_ahead_of_its_predecessor_is_a_gap_and_any_of_the_last_window_batches_keeps_its_offsets():
    """Several batches in flight per queue (Kafka's rule): batch N+1 before N is a SequenceGapError (the
    producer sends it again after N), an overlap that matches nothing stays OutOfOrderSequenceError, and a
    retry of any batch a producer can have in flight (the last WINDOW) gets its original first offset."""
    table = ProducerTable()
    pid = table.allocate("", 0)
    with pytest.raises(SequenceGapError, match="must have sequence 0"):
        table.check(pid, 0, "T", 0, 2, 2)
    for i in range(WINDOW + 2):
        store(table, pid, i * 2, 2, 100 + i * 2)
    last = (WINDOW + 2) * 2
    with pytest.raises(SequenceGapError, match=f"expected sequence {last}, got {last + 2}"):
        table.check(pid, 0, "T", 0, last + 2, 2)
    with pytest.raises(OutOfOrderSequenceError) as overlap:
        table.check(pid, 0, "T", 0, last - 1, 2)
    assert not isinstance(overlap.value, SequenceGapError)
    for i in range(2, WINDOW + 2):
        decision = table.check(pid, 0, "T", 0, i * 2, 2)
        assert (decision.verdict, decision.first_offset) == (Verdict.DUPLICATE, 100 + i * 2)
    with pytest.raises(SequenceGapError, match="must have sequence 0"):
        table.check(pid, 1, "T", 0, 4, 2)  # a new epoch's second batch before its first


def test_batches_older_than_the_window_are_duplicates_without_an_offset():
    table = ProducerTable()
    pid = table.allocate("", 0)
    for i in range(WINDOW + 3):
        store(table, pid, i * 2, 2, 100 + i * 2)
    old = table.check(pid, 0, "T", 0, 0, 2)
    assert (old.verdict, old.first_offset) == (Verdict.DUPLICATE, -1)
    assert table.check(pid, 0, "T", 0, 2, 1).verdict is Verdict.DUPLICATE, "a replay may batch differently"


def test_epochs_fence_older_batches_and_a_new_epoch_starts_at_zero():
    table = ProducerTable()
    pid = table.allocate("", 0)
    store(table, pid, 0, 1, 0)
    with pytest.raises(OutOfOrderSequenceError, match="must have sequence 0"):
        table.check(pid, 1, "T", 0, 1, 1)
    store(table, pid, 0, 1, 1, epoch=1)
    with pytest.raises(ProducerFencedError):
        table.check(pid, 0, "T", 0, 1, 1)
    with pytest.raises(UnknownProducerError):
        table.check(pid + 1, 0, "T", 0, 0, 1)
    with pytest.raises(InvalidArgumentError):
        table.check(pid, -1, "T", 0, 0, 1)


def test_keys_keep_their_id_and_bounds_forget_the_least_recently_active():
    table = ProducerTable(max_producers=2, expiry_ms=1000)
    a = table.allocate("spark:q:1:0", 0)
    assert table.allocate("spark:q:1:0", 10) == a
    b = table.allocate("", 20)
    assert table.allocate("spark:q:1:0", 30) == a  # a is now the most recently active
    c = table.allocate("", 40)
    assert table.get(b) is None and table.get(a) is not None and table.get(c) is not None
    assert table.expire(1035) == 1 and table.get(a) is None, "idle for expiry_ms"
    with pytest.raises(InvalidArgumentError):
        table.allocate("bad\nkey", 0)
    assert len({table.allocate("", 50), table.allocate("", 50)}) == 2


def test_batches_the_store_does_not_hold_are_dropped_at_startup():
    table = ProducerTable()
    pid = table.allocate("", 0)
    store(table, pid, 0, 2, 0)
    store(table, pid, 2, 2, 2)
    assert table.drop_unstored(lambda topic, q, first, count, msg_id: first + count <= 2) == 1
    assert table.check(pid, 0, "T", 0, 2, 2).verdict is Verdict.APPEND, "the lost batch is sent again"


def test_the_journal_and_snapshots_restore_the_table(tmp_path):
    state = ProducerStateStore(tmp_path, max_producers=10, expiry_ms=10_000)
    table = state.load()
    pid = table.allocate("k", 0)
    store(table, pid, 0, 2, 5)
    state.write_snapshot(state.begin_snapshot(table))
    store(table, pid, 2, 1, 7)  # in the journal only
    state.close()
    again = ProducerStateStore(tmp_path, max_producers=10, expiry_ms=10_000).load()
    assert again.check(pid, 0, "T", 0, 2, 1).first_offset == 7
    assert again.check(pid, 0, "T", 0, 0, 2).first_offset == 5
    assert again.allocate("k", 1) == pid
    assert again.allocate("", 1) > pid, "ids never go back"
    for name in (STATE_FILE_NAME, STATE_FILE_NAME + ".bak"):
        (tmp_path / name).write_text("{broken")
    with pytest.raises(ConfigFileError, match="refusing to start"):
        ProducerStateStore(tmp_path, max_producers=10, expiry_ms=10_000).load()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(1, 4), st.booleans(), st.booleans()), max_size=40))
def test_model_every_batch_is_stored_exactly_once_however_retries_and_restarts_fall(tmp_path_factory, plan):
    """Two producers send batches; some answers are lost (the producer retries the same batch), and the
    broker may restart from its journal in between. Every batch ends up stored exactly once."""
    directory = tmp_path_factory.mktemp("producers")
    state = ProducerStateStore(directory, max_producers=10, expiry_ms=10**9)
    table = state.load()
    pids = [table.allocate("", 0), table.allocate("", 0)]
    next_seq = [0, 0]
    log: list[tuple[int, int]] = []  # the "store": (producer, sequence) per stored message
    for who, count, lost_answer, restart in plan:
        seq = next_seq[who]
        for _attempt in range(2 if lost_answer else 1):
            decision = table.check(pids[who], 0, "T", 0, seq, count)
            if decision.verdict is Verdict.APPEND:
                table.will_append(pids[who], 0, "T", 0, seq, count, len(log), "", 0)
                log.extend((who, seq + i) for i in range(count))
            else:
                assert decision.first_offset == -1 or log[decision.first_offset] == (who, seq)
            if restart:
                state.close()
                state = ProducerStateStore(directory, max_producers=10, expiry_ms=10**9)
                table = state.load()
        next_seq[who] = seq + count
    assert sorted(log) == sorted(set(log))
    assert sorted(log) == sorted((w, s) for w in (0, 1) for s in range(next_seq[w]))


class _EmptyStore:
    """A store without messages (what IdempotenceService.load asks of one)."""

    def max_offset(self, topic, queue_id):
        return 0

    def min_offset(self, topic, queue_id):
        return 0

    def message_at(self, topic, queue_id, offset):
        return None


def test_a_batch_the_store_refuses_after_its_journal_entry_is_not_taken_as_stored(tmp_path):
    from tidemark.broker.errors import StoreError
    from tidemark.broker.producers.service import BatchSequence, IdempotenceService
    from tidemark.broker.store import RecordsPut

    def service() -> IdempotenceService:
        s = IdempotenceService(tmp_path, store=_EmptyStore(), clock_ms=lambda: 0, max_producers=10, expiry_ms=10**6)
        s.load()
        return s

    producers = service()
    sequence = BatchSequence(producers.allocate("", "T"), 0, 0)

    def refused(journal):
        journal(0, "m0")
        raise StoreError("disk full")

    with pytest.raises(StoreError):
        producers.append(sequence, "T", 0, 1, refused)
    assert producers.check(sequence, "T", 0, 1).verdict is Verdict.APPEND, "the retry must be stored"
    producers.append(sequence, "T", 0, 1, lambda journal: (journal(0, "m0"), RecordsPut(0, ["m0"], 0, 100))[1])
    assert producers.check(sequence, "T", 0, 1).verdict is Verdict.DUPLICATE
    assert service().check(sequence, "T", 0, 1).verdict is Verdict.APPEND, \
        "after a restart, journaled batches the store lacks are dropped"


def test_a_gap_is_out_of_order_for_a_producer_that_does_not_understand_gaps(tmp_path):
    """Producers from before several batches in flight (one batch per queue) do not know SequenceGapError
    and would take it as final; they are told of a gap as OutOfOrderSequenceError, which they answer with
    a new epoch. A producer that says it understands gaps gets SequenceGapError (issue 27, review)."""
    from tidemark.broker.producers.service import BatchSequence, IdempotenceService
    from tidemark.broker.producers.table import SequenceGapError

    producers = IdempotenceService(tmp_path, store=_EmptyStore(), clock_ms=lambda: 0, max_producers=10,
                                   expiry_ms=10**6)
    producers.load()
    pid = producers.allocate("", "T")
    with pytest.raises(OutOfOrderSequenceError) as old:
        producers.check(BatchSequence(pid, 0, 5), "T", 0, 1)
    assert type(old.value) is OutOfOrderSequenceError
    with pytest.raises(SequenceGapError):
        producers.check(BatchSequence(pid, 0, 5, gaps=True), "T", 0, 1)


def test_a_duplicate_must_carry_the_stored_batch_s_messages():
    """A sequence reused for another batch (issue 27: a client that lost track of an unknown outcome) is
    refused, not answered with the stored batch's offsets; a retry of the same batch, and a keyed
    producer's replay under new ids, are still duplicates."""
    table = ProducerTable()
    pid = table.allocate("", 0)
    table.will_append(pid, 0, "T", 0, 0, 2, 10, "id-a", 1)
    assert table.check(pid, 0, "T", 0, 0, 2, "id-a").verdict is Verdict.DUPLICATE
    assert table.check(pid, 0, "T", 0, 0, 2).verdict is Verdict.DUPLICATE, "no id to compare: as before"
    with pytest.raises(OutOfOrderSequenceError, match="hold another batch"):
        table.check(pid, 0, "T", 0, 0, 2, "id-b")
    keyed = table.allocate("spark:q:0", 0)
    table.will_append(keyed, 0, "T", 0, 0, 2, 12, "id-x", 1)
    assert table.check(keyed, 0, "T", 0, 0, 2, "id-y").verdict is Verdict.DUPLICATE



def _outcome(table: ProducerTable, *args) -> tuple:
    try:
        decision = table.check(*args)
    except (OutOfOrderSequenceError, SequenceGapError, ProducerFencedError) as e:
        return type(e), str(e)
    return decision.verdict, decision.first_offset


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 2), st.integers(0, 12), st.integers(1, 3),
                          st.sampled_from(["", "id-0", "id-1", "id-2"]), st.booleans()), max_size=30))
def test_the_first_id_read_on_demand_gives_the_verdicts_of_the_id_given(plan):
    """The batch's first message id as a function (read only when the batch may be a duplicate) against
    the id itself: the same verdict, offset or error for keyed and unkeyed producers, retries of stored
    batches, batches matching a stored one's sequences with another first id, and new batches; the function
    called at most once, and never for a batch to append."""
    table = ProducerTable()
    pids = {False: table.allocate("", 0), True: table.allocate("spark:q:0", 0)}
    for keyed, epoch, seq, count, first_id, store_it in plan:
        args = (pids[keyed], epoch, "T", 0, seq, count)
        calls = []

        def read(first_id=first_id, calls=calls) -> str:
            calls.append(first_id)
            return first_id

        given_id = _outcome(table, *args, first_id)
        assert _outcome(table, *args, read) == given_id
        assert len(calls) <= 1 and not (calls and given_id[0] is Verdict.APPEND)
        if given_id[0] is Verdict.APPEND and store_it:
            table.will_append(*args, 100 * seq, first_id, 1)

_ints = st.integers(min_value=0, max_value=2**63 - 1)
_texts = st.text(max_size=40)
_events = st.lists(st.one_of(
    st.builds(Appended, _ints, _ints, _texts, _ints, _ints, _ints, _ints, _texts, _ints),
    st.builds(Allocated, _ints, _texts, _ints),
    st.builds(Forgotten, _ints)), max_size=8)


@given(_events)
@settings(max_examples=200, deadline=None)
def test_journal_events_decode_to_what_was_encoded(events):
    decoded = decode_events(encode_events(events))
    assert decoded.items == events and decoded.damage is None


@given(st.builds(Appended, _ints, _ints, _texts, _ints, _ints, _ints, _ints, _texts, _ints))
@settings(max_examples=200, deadline=None)
def test_a_batch_s_journal_entry_is_written_as_the_generic_encoder_writes_it(event):
    # The hand-written Appended body must stay byte for byte the JSON array: journals written before it
    # are replayed by the same decoder, and the decoder checks nothing about spacing or escapes.
    assert encode_events([event]) == _encode_generic(event)
    assert encode_events([event, event]) == _encode_generic(event) * 2
