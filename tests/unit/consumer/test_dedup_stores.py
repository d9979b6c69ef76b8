"""DedupListener's stores (client/consumer/dedup_stores.py): the bounded table of marks and the file store
whose CONSUMED marks survive a restart."""

from __future__ import annotations

import os
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_dedup import GROUP, Clock, Recorder, deliver, key, msg

from tidemark.client.consumer.dedup import DedupListener
from tidemark.client.consumer.dedup_stores import (
    ClaimOutcome,
    FileDedupStore,
    MemoryDedupStore,
    decode_log,
    encode_record,
)
from tidemark.client.errors import ClientStateError, InvalidArgumentError

# -- bounds ----------------------------------------------------------------------------------------


def test_consumed_marks_beyond_max_entries_are_evicted_oldest_first():
    store = MemoryDedupStore(max_entries=3)
    user = Recorder()
    dedup = DedupListener(user, group=GROUP, store=store)
    for k in "abcde":
        deliver(dedup, msg(k))
    assert len(store) == 3
    for k in "edc":
        deliver(dedup, msg(k))
    assert user.seen == list("abcde")
    deliver(dedup, msg("a"))  # evicted: the window no longer covers it
    assert user.seen[-1] == "a"


def test_consuming_marks_are_never_evicted():
    store = MemoryDedupStore(max_entries=2)
    held = store.claim(key("slow"), 60)
    for k in "abcd":
        store.mark_consumed(store.claim(key(k), 60), 60)
    assert store.claim(key("slow"), 60).outcome is ClaimOutcome.IN_FLIGHT
    store.mark_consumed(held, 60)
    assert len(store) == 2 and store.claim(key("slow"), 60).outcome is ClaimOutcome.DUPLICATE


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.floats(0, 5)), max_size=80), st.integers(1, 10))
def test_the_store_never_holds_more_than_max_entries(ops, max_entries):
    clock = Clock()
    store = MemoryDedupStore(max_entries=max_entries, clock=clock)
    for k, dt in ops:
        clock.now += dt
        claim = store.claim(key(str(k)), 1)
        if claim.outcome is ClaimOutcome.ACQUIRED:
            store.mark_consumed(claim, 10)
        assert len(store) <= max_entries


# -- the file store --------------------------------------------------------------------------------


def test_file_store_remembers_consumed_keys_after_a_restart(tmp_path):
    path = tmp_path / "dedup" / "orders.dedup"
    user = Recorder()
    with FileDedupStore(path) as store:
        dedup = DedupListener(user, group=GROUP, store=store)
        deliver(dedup, msg("a"), msg("b"))
        store.claim(key("c"), 60)  # in flight when the process stops: not remembered
    with FileDedupStore(path) as store:
        dedup = DedupListener(user, group=GROUP, store=store)
        deliver(dedup, msg("a"), msg("b"), msg("c"))
    assert user.calls == [["a", "b"], ["c"]]


def test_file_store_reload_replays_eviction_drops_expired_and_rewrites(tmp_path):
    path = tmp_path / "d.dedup"
    clock = Clock()
    with FileDedupStore(path, max_entries=3, clock=clock) as store:
        for k in "abc":
            store.mark_consumed(store.claim(key(k), 60), 10 if k == "a" else 1000)
        clock.now += 11  # a expired: consumed again, it moves to the new end
        for k, expire in (("a", 1000), ("d", 1000), ("e", 5)):
            store.mark_consumed(store.claim(key(k), 60), expire)
        in_memory = {k: store.claim(key(k), 60).outcome for k in "abcde"}
        assert len(path.read_text().splitlines()) == 7  # header + one appended line per mark
    clock.now += 6  # e expired while the process was down
    with FileDedupStore(path, max_entries=3, clock=clock) as store:
        reloaded = {k: store.claim(key(k), 60).outcome for k in "abcde"}
    D, A = ClaimOutcome.DUPLICATE, ClaimOutcome.ACQUIRED
    assert in_memory == {"a": D, "b": A, "c": A, "d": D, "e": D}  # b and c evicted by d and e
    assert reloaded == {"a": D, "b": A, "c": A, "d": D, "e": A}
    records, skipped = decode_log(path.read_bytes())
    assert [k[2] for k, _ in records] == ["a", "d"] and skipped == 0


def test_file_store_skips_a_torn_last_line_and_damaged_lines(tmp_path, caplog):
    path = tmp_path / "d.dedup"
    with FileDedupStore(path) as store:
        store.mark_consumed(store.claim(key("a"), 60), 3600)
    with open(path, "ab") as f:
        f.write(b"not json\n")
        f.write(b'["g","t"]\n')
        f.write(encode_record(key("b"), 2e9).encode())
        f.write(encode_record(key("c"), 2e9).encode()[:-8])  # the crash cut it short
    with FileDedupStore(path) as store:
        assert [store.claim(key(k), 60).outcome for k in "abc"] == [
            ClaimOutcome.DUPLICATE, ClaimOutcome.DUPLICATE, ClaimOutcome.ACQUIRED]
        store.mark_consumed(store.claim(key("d"), 60), 3600)
    assert "skipped 3" in caplog.text
    records, skipped = decode_log(path.read_bytes())
    assert [k[2] for k, _ in records] == ["a", "b", "d"] and skipped == 0


def test_file_store_compacts_the_log(tmp_path):
    path = tmp_path / "d.dedup"
    with FileDedupStore(path, max_entries=10) as store:
        for i in range(3000):
            store.mark_consumed(store.claim(key(str(i)), 60), 3600)
            assert len(store) <= 10
        lines = path.read_text().splitlines()
        assert len(lines) <= 1 + 10 + 1024
    with FileDedupStore(path, max_entries=10) as store:
        assert len(store) == 10
        assert store.claim(key("2999"), 60).outcome is ClaimOutcome.DUPLICATE
        assert store.claim(key("2989"), 60).outcome is ClaimOutcome.ACQUIRED


def test_file_store_with_fsync_and_threads(tmp_path):
    path = tmp_path / "d.dedup"
    with FileDedupStore(path, fsync=True) as store:
        dedup = DedupListener(Recorder(), group=GROUP, store=store)
        threads = [threading.Thread(target=lambda t=t: [deliver(dedup, msg(f"{t}-{i}")) for i in range(50)])
                   for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    records, skipped = decode_log(path.read_bytes())
    assert len(records) == 200 and skipped == 0


def test_file_store_refuses_a_foreign_file_and_leaves_it_alone(tmp_path):
    path = tmp_path / "important.json"
    path.write_text('{"offsetTable": {}}\n')
    with pytest.raises(InvalidArgumentError, match="not a Tidemark dedup file"):
        FileDedupStore(path)
    assert path.read_text() == '{"offsetTable": {}}\n'
    with pytest.raises(InvalidArgumentError, match="not a Tidemark dedup file"):  # not "in use": the
        FileDedupStore(path)  # failed store gave its file lock back


def test_file_store_is_one_store_per_file(tmp_path):
    path = tmp_path / "d.dedup"
    first = FileDedupStore(path)
    with pytest.raises(InvalidArgumentError, match="in use"):
        FileDedupStore(path)
    first.close()
    FileDedupStore(path).close()


def test_a_closed_file_store_refuses_use(tmp_path):
    store = FileDedupStore(tmp_path / "d.dedup")
    claim = store.claim(key("a"), 60)
    store.close()
    store.close()
    with pytest.raises(ClientStateError, match="closed"):
        store.claim(key("b"), 60)
    with pytest.raises(ClientStateError, match="closed"):
        store.mark_consumed(claim, 60)


def test_a_failing_write_keeps_the_mark_in_memory_and_rewrites_later(tmp_path, caplog):
    path = tmp_path / "d.dedup"
    store = FileDedupStore(path)
    os.close(store._fd)
    store._fd = os.open(os.devnull, os.O_RDONLY)  # writes fail with EBADF
    store.mark_consumed(store.claim(key("a"), 60), 3600)
    assert "cannot write dedup file" in caplog.text
    assert store.claim(key("a"), 60).outcome is ClaimOutcome.DUPLICATE
    store.mark_consumed(store.claim(key("b"), 60), 3600)  # rewrites the whole file
    store.close()
    records, _ = decode_log(path.read_bytes())
    assert [k[2] for k, _ in records] == ["a", "b"]
