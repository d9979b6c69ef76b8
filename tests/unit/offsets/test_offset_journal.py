"""The offset journal: record format, torn tails, replay after a crash, retirement by snapshots."""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tidemark.broker.offsets.manager as manager_module
import tidemark.broker.offsets.snapshots as snapshots_module
from tidemark.broker.errors import StaleResetGenerationError, StoreError
from tidemark.broker.membership.epoch import EpochSequence
from tidemark.broker.offsets import ConsumerOffsetManager, Fence
from tidemark.broker.offsets.journal import (
    JOURNAL_PREFIX,
    JournalRecord,
    OffsetJournal,
    Op,
    SetEncoder,
    apply_records,
    decode_records,
    encode_record,
    encode_records,
    list_segments,
)
from tidemark.broker.offsets.persistence import remove_leftover_temp_files, temp_paths

names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="@"), min_size=1, max_size=12)
records = st.builds(JournalRecord, op=st.sampled_from(Op), topic=names, group=names,
                    queue_id=st.integers(0, 2**32 - 1), offset=st.integers(0, 2**63 - 1),
                    generation=st.integers(0, 2**63 - 1))


def crash_and_reload(directory: Path, **kw) -> ConsumerOffsetManager:
    """What a broker killed with -9 finds: nothing flushed at exit, the files as they are."""
    m = ConsumerOffsetManager(directory, epochs=EpochSequence(seed=10**9), **kw)
    m.load()
    return m


def state(m: ConsumerOffsetManager) -> tuple[dict, dict]:
    return ({k: dict(v) for k, v in m._offsets.items() if v}, {k: dict(v) for k, v in m._generations.items() if v})


def segments(directory: Path) -> list[str]:
    return [p.name for _, p in list_segments(directory)]


# -- format ---------------------------------------------------------------------------


@given(st.lists(records, max_size=20))
def test_records_round_trip(recs):
    decoded = decode_records(encode_records(recs))
    assert decoded.items == recs and decoded.damage is None


@settings(deadline=None)  # pure and fast; a loaded machine must not fail it on time
@given(st.lists(st.tuples(names, names, st.integers(0, 2**32 - 1), st.integers(0, 2**63 - 1)), max_size=20))
def test_the_fast_set_encoding_is_encode_records(sets):
    encoder = SetEncoder(limit=3)  # small: the cache also starts again in between
    assert b"".join(encoder.encode(*s) for s in sets) == encode_records(JournalRecord(Op.SET, *s) for s in sets)


@given(st.lists(records, min_size=1, max_size=8), st.data())
def test_a_torn_tail_keeps_every_whole_record_before_it(recs, data):
    encoded = [encode_record(r) for r in recs]
    blob = b"".join(encoded)
    cut = data.draw(st.integers(0, len(blob) - 1))
    decoded = decode_records(blob[:cut])
    whole = 0
    total = 0
    for e in encoded:
        if total + len(e) > cut:
            break
        total += len(e)
        whole += 1
    assert decoded.items == recs[:whole]
    assert decoded.valid_bytes == total
    assert (decoded.damage is None) == (cut == total)


@settings(deadline=None)  # one example took 320 ms once on a loaded machine (1.4 ms when repeated)
@given(st.lists(records, min_size=2, max_size=6), st.data())
def test_a_damaged_byte_ends_the_replay_at_its_record(recs, data):
    encoded = [encode_record(r) for r in recs]
    blob = bytearray(b"".join(encoded))
    at = data.draw(st.integers(0, len(blob) - 1))
    blob[at] ^= data.draw(st.integers(1, 255))
    decoded = decode_records(bytes(blob))
    starts = [sum(len(e) for e in encoded[:i]) for i in range(len(encoded))]
    hit = max(i for i, s in enumerate(starts) if s <= at)
    assert decoded.items == recs[:hit]  # never a damaged record, never one after it
    assert decoded.damage is not None


def test_zeros_after_the_last_record_are_damage_not_records():
    blob = encode_record(JournalRecord(Op.SET, "T", "g", 1, 5)) + bytes(64)
    decoded = decode_records(blob)
    assert decoded.items == [JournalRecord(Op.SET, "T", "g", 1, 5)]
    assert "impossible record length 0" in decoded.damage


def test_apply_records_follows_the_manager_rules():
    table = {("T", "g"): {0: 3}, ("U", "g"): {0: 1}, ("T", "h"): {1: 9}}
    gens: dict = {("U", "g"): {0: 77}}
    apply_records(table, gens, [
        JournalRecord(Op.SET, "T", "g", 0, 10),
        JournalRecord(Op.RESET, "T", "h", 1, 2, 88),
        JournalRecord(Op.REMOVE_GROUP, group="g"),
        JournalRecord(Op.SET, "U", "g", 2, 4),
        JournalRecord(Op.CLEAN_TOPIC, topic="T"),
    ])
    assert table == {("U", "g"): {2: 4}}
    assert gens == {}


# -- the manager: crash, replay, snapshot -----------------------------------------------------------

ops = st.one_of(
    st.tuples(st.just("commit"), st.sampled_from("gh"), st.sampled_from("TU"), st.integers(0, 3), st.integers(0, 50)),
    st.tuples(st.just("reset"), st.sampled_from("gh"), st.sampled_from("TU"), st.integers(0, 3), st.integers(0, 50)),
    st.tuples(st.just("remove_group"), st.sampled_from("gh")),
    st.tuples(st.just("clean_topic"), st.sampled_from("TU")),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("batch"), st.lists(st.tuples(st.sampled_from("gh"), st.integers(0, 3), st.integers(0, 50)),
                                         max_size=5)),
)


def run(m: ConsumerOffsetManager, op: tuple) -> None:
    kind = op[0]
    if kind == "commit":
        m.commit(op[1], op[2], op[3], op[4])
    elif kind == "reset":
        m.reset(op[1], op[2], op[3], op[4])
    elif kind == "remove_group":
        m.remove_group(op[1])
    elif kind == "clean_topic":
        m.clean_topic(op[1])
    elif kind == "snapshot":
        m.persist_now()
    else:
        with m.batch():
            for group, queue_id, offset in op[1]:
                m.commit(group, "T", queue_id, offset)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, max_size=30), st.booleans())
def test_after_a_crash_the_table_is_what_was_applied(sequence, previous_broker):
    with tempfile.TemporaryDirectory() as d:
        directory = Path(d)
        m = ConsumerOffsetManager(directory, epochs=EpochSequence(seed=1000))
        m.load()
        for op in sequence:
            run(m, op)
        if previous_broker:
            # A second life: the first one's journal is replayed, then more changes on top.
            m = crash_and_reload(directory)
            for op in sequence[: len(sequence) // 2]:
                run(m, op)
        again = crash_and_reload(directory)
        assert state(again) == state(m)
        for (topic, group), queues in m._generations.items():
            for q, gen in queues.items():
                assert again.reset_generation(group, topic, q) == gen


def test_a_snapshot_retires_the_journal(tmp_path):
    m = crash_and_reload(tmp_path)
    for i in range(100):
        m.commit("g", "T", i % 4, i)
    assert len(segments(tmp_path)) == 1
    report = m.persist_now()
    assert report.journal_segments_removed == 1
    assert segments(tmp_path) == []  # nothing changed since the snapshot
    m.commit("g", "T", 0, 500)
    (only,) = segments(tmp_path)
    assert decode_records((tmp_path / only).read_bytes()).items == [JournalRecord(Op.SET, "T", "g", 0, 500)]
    assert crash_and_reload(tmp_path).query("g", "T", 0) == 500


def test_the_periodic_snapshot_retires_the_journal_and_commits_during_it_survive(tmp_path):
    m = crash_and_reload(tmp_path)

    async def scenario():
        m.commit("g", "T", 0, 1)
        persist = asyncio.ensure_future(m.persist_if_dirty())
        await asyncio.sleep(0)  # the snapshot was taken on the loop; the write runs in a thread
        m.commit("g", "T", 0, 2)  # lands in the new segment
        report = await persist
        assert report.journal_segments_removed == 1
        assert m.dirty

    asyncio.run(scenario())
    assert len(segments(tmp_path)) == 1
    assert crash_and_reload(tmp_path).query("g", "T", 0) == 2


def test_a_failed_snapshot_keeps_the_journal(tmp_path, monkeypatch):
    m = crash_and_reload(tmp_path)
    m.commit("g", "T", 0, 7)

    def broken(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(snapshots_module, "write_offset_file", broken)
    with pytest.raises(OSError):
        m.persist_now()
    m.commit("g", "T", 1, 8)
    monkeypatch.undo()
    assert len(segments(tmp_path)) == 2
    assert crash_and_reload(tmp_path).offsets("g", "T") == {0: 7, 1: 8}
    m.persist_now()
    assert segments(tmp_path) == []


def test_a_torn_tail_is_tolerated_and_never_appended_to(tmp_path):
    m = crash_and_reload(tmp_path)
    m.commit("g", "T", 0, 10)
    m.commit("g", "T", 0, 11)
    (name,) = segments(tmp_path)
    torn = encode_record(JournalRecord(Op.SET, "T", "g", 0, 12))[:-3]  # the write the kill interrupted
    with open(tmp_path / name, "ab") as f:
        f.write(torn)
    second = crash_and_reload(tmp_path)
    assert second.query("g", "T", 0) == 11
    assert second.journal_report.damage and "torn record" in second.journal_report.damage[0]
    second.commit("g", "T", 0, 13)
    assert len(segments(tmp_path)) == 2  # a new segment: the torn one is never continued
    assert crash_and_reload(tmp_path).query("g", "T", 0) == 13


def test_a_reset_generation_survives_a_crash(tmp_path):
    m = crash_and_reload(tmp_path)
    m.commit("g", "T", 0, 40, Fence("c1", owner_epoch=5, reset_generation=0))
    m.reset("g", "T", 0, 3)
    generation = m.reset_generation("g", "T", 0)
    again = crash_and_reload(tmp_path)
    assert again.query("g", "T", 0) == 3 and again.reset_generation("g", "T", 0) == generation
    with pytest.raises(StaleResetGenerationError):
        again.commit("g", "T", 0, 41, Fence("c1", owner_epoch=5, reset_generation=0))


def test_group_removal_and_topic_cleanup_survive_a_crash(tmp_path):
    m = crash_and_reload(tmp_path)
    m.commit("g", "T", 0, 1)
    m.commit("h", "T", 0, 2)
    m.commit("h", "U", 0, 3)
    m.persist_now()
    m.remove_group("g")
    m.clean_topic("U")
    again = crash_and_reload(tmp_path)
    assert again.groups() == ["h"] and again.topics_of_group("h") == ["T"]


def test_a_batch_is_one_write(tmp_path, monkeypatch):
    m = crash_and_reload(tmp_path)
    writes = []
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(len(data)) or real(fd, data))
    with m.batch():
        for q in range(50):
            m.commit("g", "T", q, 1)
    assert len(writes) == 1
    assert crash_and_reload(tmp_path).entry_count() == 50


def test_without_the_journal_a_crash_loses_what_was_not_snapshotted(tmp_path):
    m = crash_and_reload(tmp_path, journal=False)
    m.commit("g", "T", 0, 5)
    m.persist_now()
    m.commit("g", "T", 0, 9)
    assert not any(p.name.startswith(JOURNAL_PREFIX) for p in tmp_path.iterdir())
    assert crash_and_reload(tmp_path, journal=False).query("g", "T", 0) == 5


def test_a_short_write_is_cut_off_and_the_segment_goes_on(tmp_path, monkeypatch):
    journal = OffsetJournal(tmp_path)
    journal.read_all()
    journal.append(encode_record(JournalRecord(Op.SET, "T", "g", 0, 1)))
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, data[:5]))  # a short write
    with pytest.raises(OSError):
        journal.append(encode_record(JournalRecord(Op.SET, "T", "g", 0, 2)))
    monkeypatch.undo()
    journal.append(encode_record(JournalRecord(Op.SET, "T", "g", 0, 3)))
    recs, report = OffsetJournal(tmp_path).read_all()
    assert [r.offset for r in recs] == [1, 3] and report.segments == 1 and report.damage == []


def test_whole_records_of_a_short_write_do_not_come_back(tmp_path, monkeypatch):
    m = crash_and_reload(tmp_path)
    m.commit("g", "T", 0, 1)
    first = len(encode_record(JournalRecord(Op.SET, "T", "g", 0, 2)))
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, data[:first + 3]))  # one record and a bit
    with pytest.raises(StoreError), m.batch():
        m.commit("g", "T", 0, 2)
        m.commit("g", "T", 1, 7)
    monkeypatch.undo()
    assert (m.query("g", "T", 0), m.query("g", "T", 1)) == (1, -1)
    again = crash_and_reload(tmp_path)
    assert (again.query("g", "T", 0), again.query("g", "T", 1)) == (1, -1)


# -- leftovers of an interrupted snapshot write (item 9) ----------------------------------------


def test_a_leftover_temp_file_is_removed_at_start(tmp_path):
    m = crash_and_reload(tmp_path)
    m.commit("g", "T", 0, 4)
    m.persist_now()
    m.commit("g", "T", 0, 6)
    m.persist_now()  # now there is a .bak too
    main_tmp, bak_tmp = temp_paths(tmp_path / "consumerOffset.json")
    assert main_tmp.name == ".consumerOffset.json.tmp"
    main_tmp.write_bytes(b'{\n    "offsetTable": {\n        "T@g": {\n            "0": 9')  # killed mid-write
    bak_tmp.write_bytes(b"")
    again = crash_and_reload(tmp_path)
    assert again.query("g", "T", 0) == 6
    assert not main_tmp.exists() and not bak_tmp.exists()


def test_removing_temp_files_leaves_the_real_ones(tmp_path):
    for name in ("consumerOffset.json", "consumerOffset.json.bak", ".consumerOffset.json.tmp"):
        (tmp_path / name).write_text("{}")
    removed = remove_leftover_temp_files(tmp_path / "consumerOffset.json", manager_module._log)
    assert [p.name for p in removed] == [".consumerOffset.json.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["consumerOffset.json", "consumerOffset.json.bak"]


# -- a journal that cannot be written (a full disk) -----------------------------------------------


def disk_full(fd, data):
    raise OSError(28, "No space left on device")


def test_a_full_disk_is_reported_once_leaves_no_empty_segments_and_recovers(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=manager_module._log.name)
    m = crash_and_reload(tmp_path)
    states = []
    m.on_journal_state = states.append
    m.commit("g", "T", 0, 1)
    monkeypatch.setattr(os, "write", disk_full)
    for i in range(2, 40):  # one failed append per commit batch
        with pytest.raises(StoreError, match="disk full.*offset journal.*not applied"):
            m.commit("g", "T", 0, i)
    assert m.query("g", "T", 0) == 1  # refused, so not applied: a crash could not have kept them
    assert m.journal_error is not None and "No space left" in m.journal_error
    assert segments(tmp_path) == ["consumerOffset.journal.0000000001"]  # no file per failed batch
    assert [r.levelname for r in caplog.records if "offset journal" in r.getMessage()] == ["ERROR"]
    monkeypatch.undo()
    m.commit("g", "T", 0, 40)  # the disk has room again: the same, intact segment goes on
    assert m.journal_error is None and len(states) == 2 and "No space left" in states[0] and states[1] is None
    assert segments(tmp_path) == ["consumerOffset.journal.0000000001"]
    assert [r.levelname for r in caplog.records if "offset journal" in r.getMessage()] == ["ERROR", "INFO"]
    assert crash_and_reload(tmp_path).query("g", "T", 0) == 40


def test_a_failed_first_append_removes_the_segment_it_created(tmp_path, monkeypatch):
    journal = OffsetJournal(tmp_path)
    journal.read_all()
    monkeypatch.setattr(os, "write", disk_full)
    for _ in range(5):
        with pytest.raises(OSError):
            journal.append(encode_record(JournalRecord(Op.SET, "T", "g", 0, 1)))
    assert segments(tmp_path) == [] and journal.current_seq == 1 and journal.write_errors == 5
    monkeypatch.undo()
    journal.append(encode_record(JournalRecord(Op.SET, "T", "g", 0, 2)))
    assert segments(tmp_path) == ["consumerOffset.journal.0000000001"]
    journal.close()


def test_a_snapshot_after_a_failed_append_ends_the_failing_state(tmp_path, monkeypatch):
    m = crash_and_reload(tmp_path)
    states = []
    m.on_journal_state = states.append
    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(StoreError):
        m.commit("g", "T", 0, 5)
    monkeypatch.undo()
    assert m.journal_error is not None
    asyncio.run(m.persist_if_dirty())  # written although nothing changed: it proves the disk takes writes
    assert m.journal_error is None and len(states) == 2 and states[-1] is None


def test_a_kept_change_the_journal_missed_reaches_the_snapshot_which_ends_the_failing_state(tmp_path, monkeypatch):
    m = crash_and_reload(tmp_path)
    monkeypatch.setattr(os, "write", disk_full)
    assert m.advance("g", "T", 0, 5)  # a pop watermark: kept in memory, not refused
    monkeypatch.undo()
    assert m.journal_error is not None and m.query("g", "T", 0) == 5
    asyncio.run(m.persist_if_dirty())
    assert m.journal_error is None and crash_and_reload(tmp_path).query("g", "T", 0) == 5


def test_a_change_the_journal_missed_is_not_undone_by_replaying_older_segments(tmp_path, monkeypatch):
    m = crash_and_reload(tmp_path)
    m.commit("g", "T", 0, 5)  # journalled in segment 1
    monkeypatch.setattr(os, "write", disk_full)
    m.advance("g", "T", 0, 10)  # kept in memory (a pop watermark); the journal cannot take it
    monkeypatch.undo()
    # Killed after the snapshot reached the disk, before the segments it covers were deleted.
    monkeypatch.setattr(OffsetJournal, "discard_before", lambda self, seq: 0)
    m.persist_now()
    assert segments(tmp_path) == ["consumerOffset.journal.0000000001"]
    assert crash_and_reload(tmp_path).query("g", "T", 0) == 10


def test_an_offset_file_without_the_journal_mark_replays_every_segment(tmp_path):
    (tmp_path / "consumerOffset.json").write_text('{\n    "offsetTable": {\n        "T@g": {\n'
                                                  '            "0": 3\n        }\n    }\n}')
    journal = OffsetJournal(tmp_path)
    journal.read_all()
    journal.append(encode_record(JournalRecord(Op.SET, "T", "g", 0, 8)))
    journal.close()
    assert crash_and_reload(tmp_path).query("g", "T", 0) == 8  # the old shape: every segment counts


def test_close_releases_the_segment(tmp_path):
    m = crash_and_reload(tmp_path)
    m.commit("g", "T", 0, 1)
    fd = m._journal._fd
    assert fd is not None
    m.close()
    assert m._journal._fd is None
    with pytest.raises(OSError):
        os.fstat(fd)


def test_the_broker_closes_the_journal_at_shutdown(tmp_path):
    from tidemark.broker.config import BrokerConfig
    from tidemark.broker.controller import BrokerController

    async def scenario():
        b = BrokerController(BrokerConfig(data_dir=tmp_path, flush_interval_ms=3_600_000))
        b.load()
        b.offsets.commit("g", "T", 0, 1)
        b.offsets.commit("g", "T", 0, 2)  # after any snapshot: the segment is open
        opened = []
        b.offsets._journal.close = lambda real=b.offsets._journal.close: opened.append(1) or real()
        await b.shutdown()
        assert opened and b.offsets._journal._fd is None

    asyncio.run(scenario())


def test_the_journal_state_reaches_broker_health(tmp_path, monkeypatch):
    from tidemark.broker.config import BrokerConfig
    from tidemark.broker.controller import BrokerController
    from tidemark.broker.observe.health import CONSUMER_OFFSETS

    async def scenario():
        b = BrokerController(BrokerConfig(data_dir=tmp_path, flush_interval_ms=3_600_000))
        b.load()
        try:
            monkeypatch.setattr(os, "write", disk_full)
            with pytest.raises(StoreError):
                b.offsets.commit("g", "T", 0, 1)
            monkeypatch.undo()
            assert "disk full" in b.persistence.failing_parts()[CONSUMER_OFFSETS]
            b.offsets.commit("g", "T", 0, 2)
            assert b.persistence.healthy
        finally:
            await b.shutdown()

    asyncio.run(scenario())


def test_after_a_restart_new_segments_are_numbered_from_the_snapshot_mark(tmp_path):
    m = crash_and_reload(tmp_path)
    m.commit("g", "T", 0, 1)
    m.persist_now()  # covers segment 1, marks 2, deletes segment 1
    m.close()
    again = crash_and_reload(tmp_path)
    again.commit("g", "T", 0, 2)  # must not go to segment 1, which the mark says the snapshot holds
    assert segments(tmp_path) == ["consumerOffset.journal.0000000002"]
    assert crash_and_reload(tmp_path).query("g", "T", 0) == 2
