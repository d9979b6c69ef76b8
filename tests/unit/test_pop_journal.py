"""The pop journal and snapshot: record format, torn tails, crash and reload, retirement, damage."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tidemark.broker.pop.journal as journal_module
from tidemark.broker.errors import ConfigFileError
from tidemark.broker.pop.handles import QueueKey
from tidemark.broker.pop.journal import (
    JOURNAL_PREFIX,
    STATE_FILE_NAME,
    LoadSource,
    PopStore,
    decode_events,
    encode_event,
    encode_events,
    list_segments,
)
from tidemark.broker.pop.ledger import (
    Acked,
    Changed,
    Dropped,
    PopLedger,
    Popped,
    PopSettings,
    Redelivered,
    Renewed,
    Reset,
    Revived,
)
from tidemark.common.fsutil import backup_path

K = QueueKey("g", "T", 0)
MIN = 60_000
n = st.integers(0, 2**63 - 1)
names = st.text(st.characters(blacklist_categories=("Cs",)), max_size=10)
keys = st.builds(QueueKey, names, names, st.integers(0, 2**31 - 1))
events = st.one_of(
    st.builds(Reset, keys, n), st.builds(Dropped, keys), st.builds(Acked, keys, n, n),
    st.builds(Changed, keys, n, n, n, n), st.builds(Renewed, keys, n, n, n), st.builds(Revived, keys, n, n),
    st.builds(Redelivered, keys, n, n),
    st.builds(Popped, keys, n, n, n, names, st.booleans(), n, st.lists(st.tuples(n, n, n), max_size=4).map(tuple)),
)


def segments(directory: Path) -> list[str]:
    return [p.name for _, p in list_segments(directory)]


def crash_and_load(directory: Path, **kw) -> tuple[PopLedger, PopStore]:
    """What a broker killed with -9 finds: the files as they are, nothing flushed at exit."""
    store = PopStore(directory, **kw)
    return store.load(), store


def pop(ledger, offsets, next_cursor, *, now=0, invisible=MIN, auto_renew=False):
    return ledger.pop(K, [(o, 1) for o in offsets], next_cursor, now_ms=now, invisible_ms=invisible,
                      client_id="c1", auto_renew=auto_renew)


# -- format ---------------------------------------------------------------------------------------


@given(st.lists(events, max_size=12))
def test_events_round_trip(evs):
    decoded = decode_events(encode_events(evs))
    assert decoded.items == evs and decoded.damage is None


@given(st.lists(events, min_size=1, max_size=6), st.data())
def test_a_torn_tail_at_any_byte_keeps_every_whole_record(evs, data):
    encoded = [encode_event(e) for e in evs]
    blob = b"".join(encoded)
    cut = data.draw(st.integers(0, len(blob) - 1))
    whole, total = 0, 0
    for e in encoded:
        if total + len(e) > cut:
            break
        total += len(e)
        whole += 1
    decoded = decode_events(blob[:cut])
    assert decoded.items == evs[:whole] and decoded.valid_bytes == total
    assert (decoded.damage is None) == (cut == total)


@given(st.lists(events, min_size=2, max_size=5), st.data())
def test_a_damaged_byte_ends_the_replay_at_its_record(evs, data):
    encoded = [encode_event(e) for e in evs]
    blob = bytearray(b"".join(encoded))
    at = data.draw(st.integers(0, len(blob) - 1))
    blob[at] ^= data.draw(st.integers(1, 255))
    starts = [sum(len(e) for e in encoded[:i]) for i in range(len(encoded))]
    hit = max(i for i, s in enumerate(starts) if s <= at)
    decoded = decode_events(bytes(blob))
    assert decoded.items == evs[:hit] and decoded.damage is not None


def test_a_checksummed_record_with_bad_fields_is_damage():
    def frame(body: bytes) -> bytes:
        import struct
        import zlib
        return struct.pack("<II", len(body), zlib.crc32(body)) + body

    good = encode_event(Acked(K, 1, 2))
    for body in (b"[4,\"g\",\"T\",0,1]", b"[4,\"g\",\"T\",0,1,-2]", b"[9,\"g\",\"T\",0]", b"{}",
                 b"[3,\"g\",\"T\",0,0,1,1,\"c\",2,0,[1,2]]", b"[4,\"g\",\"T\",0,true,2]", b"\xff\xfe"):
        decoded = decode_events(good + frame(body) + good)
        assert decoded.items == [Acked(K, 1, 2)] and "malformed record" in decoded.damage, body


def test_zeros_after_the_last_record_are_damage_not_records():
    decoded = decode_events(encode_event(Acked(K, 1, 2)) + bytes(32))
    assert decoded.items == [Acked(K, 1, 2)] and "impossible record length 0" in decoded.damage


# -- crash and reload ---------------------------------------------------------------------------------

ops = st.one_of(
    st.tuples(st.just("pop"), st.integers(0, 1), st.lists(st.booleans(), max_size=5), st.booleans()),
    st.tuples(st.just("ack"), st.integers(0, 50)),
    st.tuples(st.just("change"), st.integers(0, 50), st.integers(0, 3000)),
    st.tuples(st.just("tick"), st.integers(0, 3000)),
    st.tuples(st.just("revive"), st.booleans()),
    st.tuples(st.just("renew"),),
    st.tuples(st.just("reset"), st.integers(0, 1), st.integers(0, 20)),
    st.tuples(st.just("snapshot"),),
)
KEYS = [K, QueueKey("g", "U", 3)]


class Driver:
    """Runs ops on a ledger; `issued` and the clock survive a reload (they are the clients' side)."""

    def __init__(self) -> None:
        self.now = 0
        self.issued = []

    def run(self, ledger: PopLedger, store: PopStore, op: tuple) -> None:
        kind = op[0]
        if kind == "pop":
            key = KEYS[op[1]]
            ledger.ensure_queue(key, 0)
            cursor = ledger.cursor(key)
            pending = [(p.offset, p.attempt) for p in ledger.pending(key)]
            taken = pending + [(cursor + i, 1) for i, t in enumerate(op[2]) if t]
            r = ledger.pop(key, taken, cursor + len(op[2]), now_ms=self.now, invisible_ms=1000, client_id="c",
                           auto_renew=op[3])
            self.issued.extend(r.handles)
        elif kind in ("ack", "change") and self.issued:
            h = self.issued[op[1] % len(self.issued)]
            try:
                if kind == "ack":
                    ledger.ack(h)
                else:
                    self.issued.append(ledger.change_invisible(h, now_ms=self.now, invisible_ms=op[2]))
            except Exception as e:  # stale: fine, nothing changed
                assert "stale" in str(e)
        elif kind == "tick":
            self.now += op[1]
        elif kind == "revive":
            for e in ledger.expired(self.now, 2):
                if op[1]:
                    ledger.redeliver_in_place(e.key, e.offset, e.entry.pop_id)
                else:
                    ledger.revived(e.key, e.offset, e.entry.pop_id)
        elif kind == "renew":
            ledger.renewals(self.now, {"c"})
        elif kind == "reset":
            ledger.reset(KEYS[op[1]], op[2])
        elif kind == "snapshot":
            store.snapshot(ledger)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, max_size=30), st.lists(ops, max_size=15))
def test_after_a_crash_the_state_is_what_was_applied(first_life, second_life):
    with tempfile.TemporaryDirectory() as d:
        directory, driver = Path(d), Driver()
        ledger, store = crash_and_load(directory)
        for op in first_life:
            driver.run(ledger, store, op)
        ledger, store = crash_and_load(directory)  # replays what the first life journaled
        for op in second_life:
            driver.run(ledger, store, op)
        again, _ = crash_and_load(directory)
        assert again.snapshot() == ledger.snapshot()
        assert {k: again.watermark(k) for k in again.keys()} == {k: ledger.watermark(k) for k in ledger.keys()}


def test_pop_ids_keep_growing_across_snapshot_and_reload(tmp_path):
    ledger, store = crash_and_load(tmp_path)
    ledger.ensure_queue(K, 0)
    old = pop(ledger, [0, 1, 2], 3).handles
    store.snapshot(ledger)
    h = ledger.change_invisible(old[0], now_ms=0, invisible_ms=1)  # journaled only
    ledger, _ = crash_and_load(tmp_path)
    (new,) = pop(ledger, [3], 4).handles
    assert new.pop_id > max(x.pop_id for x in [*old, h])
    floored, _ = crash_and_load(tmp_path, pop_id_floor=10**15)  # the wall clock, after a lost journal
    assert pop(floored, [4], 5).handles[0].pop_id == 10**15 + 1


def test_an_acked_entry_stays_acked_and_an_in_flight_one_keeps_its_deadline(tmp_path):
    ledger, _ = crash_and_load(tmp_path)
    ledger.ensure_queue(K, 10)
    a, b = pop(ledger, [10, 11], 12, now=5, invisible=1000).handles
    ledger.ack(a)
    again, _ = crash_and_load(tmp_path)
    assert again.watermark(K) == 11 and again.inflight(K)[11].deadline_ms == 1005
    assert [e.offset for e in again.expired(1005)] == [11]
    assert again.ack(b) == 12  # the client's handle works across the restart


# -- snapshot and journal segments ------------------------------------------------------------------------


def test_a_snapshot_retires_the_journal_and_marks_where_replay_starts(tmp_path):
    ledger, store = crash_and_load(tmp_path)
    ledger.ensure_queue(K, 0)
    pop(ledger, range(10), 10)
    assert segments(tmp_path) == [f"{JOURNAL_PREFIX}0000000001"]
    assert store.dirty(ledger)
    assert store.snapshot(ledger) == 1
    assert segments(tmp_path) == [] and not store.dirty(ledger)
    pop(ledger, [10], 11)
    assert segments(tmp_path) == [f"{JOURNAL_PREFIX}0000000002"]
    again, again_store = crash_and_load(tmp_path)
    assert again.snapshot() == ledger.snapshot()
    assert again_store.report.journal_from == 2 and again_store.report.events == 1


def test_a_crash_before_the_covered_segments_are_deleted_never_replays_them(tmp_path, monkeypatch):
    ledger, store = crash_and_load(tmp_path)
    ledger.ensure_queue(K, 0)
    pop(ledger, [0, 1], 2)
    monkeypatch.setattr(journal_module.PopJournal, "discard_before", lambda self, seq: 0)
    store.snapshot(ledger)  # durable, then "killed" before the deletion
    monkeypatch.undo()
    ledger.reset(K, 7)
    again, again_store = crash_and_load(tmp_path)
    assert again.snapshot() == ledger.snapshot()
    assert again_store.report.segments == 1 and again_store.report.events == 1  # only the Reset


def test_events_during_a_snapshot_write_land_in_the_next_segment(tmp_path):
    ledger, store = crash_and_load(tmp_path)
    ledger.ensure_queue(K, 0)
    (h,) = pop(ledger, [0], 1).handles
    pending = store.begin_snapshot(ledger)  # on the loop
    ledger.ack(h)  # while the worker thread writes the copy
    store.write_snapshot(pending)
    assert store.dirty(ledger)
    assert len(segments(tmp_path)) == 1
    again, _ = crash_and_load(tmp_path)
    assert again.watermark(K) == 1 and again.inflight_count(K) == 0


def test_a_failed_snapshot_deletes_nothing(tmp_path, monkeypatch):
    ledger, store = crash_and_load(tmp_path)
    ledger.ensure_queue(K, 0)
    pop(ledger, [0], 1)

    def full(*args, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(journal_module, "atomic_write", full)
    with pytest.raises(OSError):
        store.snapshot(ledger)
    monkeypatch.undo()
    pop(ledger, [1], 2)
    assert len(segments(tmp_path)) == 2 and store.dirty(ledger)
    again, _ = crash_and_load(tmp_path)
    assert again.snapshot() == ledger.snapshot()
    store.snapshot(ledger)
    assert segments(tmp_path) == []


def test_a_torn_tail_is_tolerated_and_never_appended_to(tmp_path):
    ledger, _ = crash_and_load(tmp_path)
    ledger.ensure_queue(K, 0)
    pop(ledger, [0], 1)
    (name,) = segments(tmp_path)
    with open(tmp_path / name, "ab") as f:
        f.write(encode_event(Acked(K, 0, 1))[:-2])  # the write the kill interrupted
    second, store = crash_and_load(tmp_path)
    assert second.inflight_count(K) == 1
    assert "torn record" in store.report.problems[0]
    pop(second, [1], 2)
    assert len(segments(tmp_path)) == 2
    third, _ = crash_and_load(tmp_path)
    assert third.snapshot() == second.snapshot()


def test_a_failed_append_changes_nothing_and_leaves_no_empty_segment(tmp_path, monkeypatch):
    ledger, _ = crash_and_load(tmp_path)

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError):
        ledger.ensure_queue(K, 0)
    assert K not in ledger and segments(tmp_path) == []
    monkeypatch.undo()
    ledger.ensure_queue(K, 0)
    assert crash_and_load(tmp_path)[0].snapshot() == ledger.snapshot()


def test_a_short_write_moves_on_to_a_new_segment(tmp_path, monkeypatch):
    ledger, _ = crash_and_load(tmp_path)
    ledger.ensure_queue(K, 0)
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, data[:3]))
    with pytest.raises(OSError, match="short write"):
        pop(ledger, [0], 1)
    monkeypatch.undo()
    assert ledger.cursor(K) == 0
    pop(ledger, [0], 1)
    assert len(segments(tmp_path)) == 2
    assert crash_and_load(tmp_path)[0].snapshot() == ledger.snapshot()


def test_a_batch_of_renewals_is_one_write(tmp_path, monkeypatch):
    ledger, _ = crash_and_load(tmp_path)
    ledger.ensure_queue(K, 0)
    pop(ledger, range(40), 40, auto_renew=True)
    writes = []
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(len(data)) or real(fd, data))
    assert len(ledger.renewals(55_000, {"c1"})) == 40
    assert len(writes) == 1


# -- damaged snapshots -----------------------------------------------------------------------------------


def two_snapshots(directory: Path) -> PopLedger:
    ledger, store = crash_and_load(directory)
    ledger.ensure_queue(K, 0)
    pop(ledger, [0], 1)
    store.snapshot(ledger)
    pop(ledger, [1], 2)
    store.snapshot(ledger)
    return ledger


def test_a_damaged_snapshot_falls_back_to_the_backup_and_is_kept_aside(tmp_path):
    two_snapshots(tmp_path)
    main = tmp_path / STATE_FILE_NAME
    main.write_bytes(main.read_bytes()[:-5])  # torn
    again, store = crash_and_load(tmp_path)
    assert store.report.source is LoadSource.BACKUP
    assert again.inflight_count(K) == 1  # the backup is one snapshot older
    assert (tmp_path / f"{STATE_FILE_NAME}.corrupt").exists() and not main.exists()
    assert store.dirty(again)  # so the next snapshot writes a good main file


def test_two_damaged_snapshots_refuse_to_start_unless_allowed(tmp_path):
    two_snapshots(tmp_path)
    (tmp_path / STATE_FILE_NAME).write_text("{")
    backup_path(tmp_path / STATE_FILE_NAME).write_text('{"format": 1}')
    with pytest.raises(ConfigFileError, match="refusing to start"):
        crash_and_load(tmp_path)
    ledger, store = crash_and_load(tmp_path, allow_empty_on_corruption=True)
    assert store.report.source is LoadSource.FORCED_EMPTY and list(ledger.keys()) == []


def test_a_new_broker_starts_empty_and_settings_reach_the_ledger(tmp_path):
    ledger, store = crash_and_load(tmp_path, settings=PopSettings(max_inflight_per_queue=2))
    assert store.report.source is LoadSource.NONE and not store.dirty(ledger)
    ledger.ensure_queue(K, 0)
    assert len(pop(ledger, range(5), 5).handles) == 2


def test_leftover_temp_files_are_removed(tmp_path):
    two_snapshots(tmp_path)
    tmp = tmp_path / f".{STATE_FILE_NAME}.tmp"
    tmp.write_text("half")
    crash_and_load(tmp_path)
    assert not tmp.exists()
