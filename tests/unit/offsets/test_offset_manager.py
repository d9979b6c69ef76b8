"""ConsumerOffsetManager: the table, its views, and persistence to consumerOffset.json."""

import asyncio
import json
import threading

import pytest

import tidemark.broker.offsets.snapshots as snapshots_module
from tidemark.broker.errors import ConfigFileError, InvalidArgumentError
from tidemark.broker.membership.epoch import EpochSequence
from tidemark.broker.offsets import ConsumerOffsetManager, LoadSource, decode_offset_table


@pytest.fixture
def mgr(tmp_path):
    m = ConsumerOffsetManager(tmp_path, epochs=EpochSequence(seed=0))
    assert m.load().source is LoadSource.NONE
    return m


def _file_table(path):
    return decode_offset_table(path.read_bytes()).table


# -- commit / query / views ------------------------------------------------


def test_query_is_minus_one_until_committed(mgr):
    assert mgr.query("g", "t", 0) == -1
    assert mgr.commit("g", "t", 0, 42) is True
    assert mgr.query("g", "t", 0) == 42
    assert mgr.query("g", "t", 1) == -1
    assert mgr.query("other", "t", 0) == -1


def test_commit_reports_whether_the_offset_changed(mgr):
    assert mgr.commit("g", "t", 0, 5) is True
    assert mgr.commit("g", "t", 0, 5) is False
    assert mgr.commit("g", "t", 0, 0) is True


@pytest.mark.parametrize(
    ("group", "topic", "queue_id", "offset", "match"),
    [
        ("g", "t", 0, -1, "negative"),
        ("g", "t", -1, 0, "queue id"),
        ("g", "t", 0, 1.5, "integer"),
        ("g@x", "t", 0, 0, "'@'"),
        ("g", "t@x", 0, 0, "'@'"),
        ("", "t", 0, 0, "non-empty"),
    ],
)
def test_invalid_commits_are_rejected_and_change_nothing(
    mgr, group, topic, queue_id, offset, match
):
    with pytest.raises(InvalidArgumentError, match=match):
        mgr.commit(group, topic, queue_id, offset)
    with pytest.raises(InvalidArgumentError, match=match):
        mgr.reset(group, topic, queue_id, offset)
    assert mgr.entry_count() == 0 and not mgr.dirty


def test_views_of_groups_and_topics(mgr):
    mgr.commit("g1", "t1", 0, 1)
    mgr.commit("g1", "t2", 3, 2)
    mgr.commit("g1", "t2", 1, 3)
    mgr.commit("g2", "t1", 0, 4)
    mgr.commit("g1", "%RETRY%g1", 0, 5)
    assert mgr.groups() == ["g1", "g2"]
    assert mgr.groups_of_topic("t1") == ["g1", "g2"]
    assert mgr.groups_of_topic("nope") == []
    assert mgr.topics_of_group("g1") == ["%RETRY%g1", "t1", "t2"]
    assert list(mgr.offsets("g1", "t2").items()) == [(1, 3), (3, 2)]
    assert mgr.offsets("g9", "t2") == {}
    assert mgr.entry_count() == 5


def test_offsets_returns_a_copy(mgr):
    mgr.commit("g", "t", 0, 1)
    mgr.offsets("g", "t")[0] = 99
    assert mgr.query("g", "t", 0) == 1


def test_clean_topic_removes_every_group_of_that_topic_only(mgr):
    mgr.commit("g1", "t1", 0, 1)
    mgr.commit("g1", "t1", 1, 1)
    mgr.commit("g2", "t1", 0, 1)
    mgr.commit("g1", "t2", 0, 7)
    asyncio.run(mgr.persist_if_dirty())
    assert mgr.clean_topic("t1") == 3
    assert mgr.dirty
    assert mgr.groups_of_topic("t1") == []
    assert mgr.query("g1", "t1", 0) == -1
    assert mgr.query("g1", "t2", 0) == 7
    assert mgr.clean_topic("t1") == 0
    asyncio.run(mgr.persist_if_dirty())
    assert _file_table(mgr.path) == {("t2", "g1"): {0: 7}}


def test_remove_group_removes_all_its_topics_including_retry(mgr):
    mgr.commit("g1", "t1", 0, 1)
    mgr.commit("g1", "%RETRY%g1", 0, 2)
    mgr.commit("g2", "t1", 0, 3)
    assert mgr.remove_group("g1") == 2
    assert mgr.groups() == ["g2"]
    assert mgr.topics_of_group("g1") == []
    assert mgr.remove_group("g1") == 0


def test_clean_topic_forgets_reset_generations(mgr):
    mgr.reset("g", "t", 0, 5)
    assert mgr.reset_generation("g", "t", 0) > 0
    mgr.clean_topic("t")
    assert mgr.reset_generation("g", "t", 0) == 0


def test_lag_per_queue_never_negative_and_uncommitted_counts_from_zero(mgr):
    mgr.commit("g", "t", 0, 90)
    mgr.commit("g", "t", 1, 120)  # past the max (e.g. store truncated): lag 0, not -20
    mgr.commit("g", "t", 5, 1)  # not in max_offsets: not reported
    lag = mgr.lag("g", "t", {2: 30, 0: 100, 1: 100})
    assert lag == {0: 10, 1: 0, 2: 30}
    assert list(lag) == [0, 1, 2]
    assert mgr.lag("unknown", "t", {0: 7}) == {0: 7}


# -- persistence -------------------------------------------------------------


def test_persist_only_when_dirty(mgr):
    assert not mgr.dirty
    assert asyncio.run(mgr.persist_if_dirty()) is None
    assert not mgr.path.exists()
    mgr.commit("test-group", "test-topic", 0, 88526)
    mgr.commit("test-group", "test-topic", 1, 88528)
    assert mgr.dirty
    report = asyncio.run(mgr.persist_if_dirty())
    assert report.entries == 2 and report.size_bytes == mgr.path.stat().st_size
    assert report.duration_s >= report.snapshot_s >= 0
    assert not mgr.dirty
    assert asyncio.run(mgr.persist_if_dirty()) is None
    # Committing the same offset again is not a change.
    assert mgr.commit("test-group", "test-topic", 0, 88526) is False
    assert not mgr.dirty
    assert asyncio.run(mgr.persist_if_dirty()) is None


def test_persisted_file_is_rocketmq_shaped(mgr):
    mgr.commit("test-group", "test-topic", 1, 88528)
    mgr.commit("test-group", "test-topic", 0, 88526)
    asyncio.run(mgr.persist_if_dirty())
    text = mgr.path.read_text()
    # RocketMQ's shape; the offset journal's mark is one extra top-level key (journal.py).
    assert text == json.dumps(
        {"offsetTable": {"test-topic@test-group": {"0": 88526, "1": 88528}}, "offsetJournalFrom": 2},
        indent=4,
        separators=(", ", ": "),
    )


def test_bak_holds_previous_content_after_two_persists(mgr):
    bak = mgr.path.with_name("consumerOffset.json.bak")
    mgr.commit("g", "t", 0, 1)
    asyncio.run(mgr.persist_if_dirty())
    first = mgr.path.read_bytes()
    assert not bak.exists()
    mgr.commit("g", "t", 0, 2)
    asyncio.run(mgr.persist_if_dirty())
    assert bak.read_bytes() == first
    assert _file_table(mgr.path) == {("t", "g"): {0: 2}}
    assert _file_table(bak) == {("t", "g"): {0: 1}}


def test_commit_during_write_keeps_table_dirty(mgr, monkeypatch):
    writing, proceed = threading.Event(), threading.Event()
    real_write = snapshots_module.write_offset_file

    def slow_write(path, data):
        writing.set()
        assert proceed.wait(5)
        real_write(path, data)

    monkeypatch.setattr(snapshots_module, "write_offset_file", slow_write)
    mgr.commit("g", "t", 0, 1)

    async def scenario():
        persist = asyncio.create_task(mgr.persist_if_dirty())
        assert await asyncio.to_thread(writing.wait, 5)
        mgr.commit("g", "t", 0, 2)  # on the loop thread, while the worker writes
        proceed.set()
        report = await persist
        assert report.entries == 1
        assert mgr.dirty  # offset 2 is not on disk yet
        assert _file_table(mgr.path) == {("t", "g"): {0: 1}}
        assert await mgr.persist_if_dirty() is not None
        assert not mgr.dirty

    asyncio.run(scenario())
    assert _file_table(mgr.path) == {("t", "g"): {0: 2}}


def test_concurrent_persists_never_overlap(mgr, monkeypatch):
    active, overlaps = [0], []
    real_write = snapshots_module.write_offset_file
    lock = threading.Lock()

    def tracking_write(path, data):
        with lock:
            active[0] += 1
            overlaps.append(active[0])
        threading.Event().wait(0.05)
        real_write(path, data)
        with lock:
            active[0] -= 1

    monkeypatch.setattr(snapshots_module, "write_offset_file", tracking_write)
    mgr.commit("g", "t", 0, 1)

    async def scenario():
        return await asyncio.gather(*(mgr.persist_if_dirty() for _ in range(3)))

    reports = asyncio.run(scenario())
    assert max(overlaps) == 1
    assert sum(r is not None for r in reports) == 1  # the others found nothing left to write


def test_older_snapshot_never_overwrites_a_newer_one(mgr):
    # A worker write whose awaiting task was abandoned may run after persist_now.
    mgr.commit("g", "t", 0, 1)
    old = mgr._snapshots.take(mgr._version, mgr._offsets, mgr._generations)
    mgr.commit("g", "t", 0, 2)
    mgr.persist_now()
    mgr._snapshots.write(old)
    assert _file_table(mgr.path) == {("t", "g"): {0: 2}}


def test_persist_now_writes_even_when_clean_and_reload_round_trips(tmp_path, mgr):
    for q in range(4):
        mgr.commit("g", "t", q, q * 10)
    report = mgr.persist_now()
    assert report.entries == 4 and not mgr.dirty
    again = ConsumerOffsetManager(tmp_path, epochs=EpochSequence(seed=0))
    loaded = again.load()
    assert (loaded.source, loaded.entries) == (LoadSource.MAIN, 4)
    assert again.offsets("g", "t") == {0: 0, 1: 10, 2: 20, 3: 30}
    assert not again.dirty


def test_load_replaces_table_and_uses_bak_when_main_is_torn(tmp_path, mgr):
    mgr.commit("g", "t", 0, 1)
    mgr.persist_now()
    mgr.commit("g", "t", 0, 2)
    mgr.persist_now()
    mgr.path.write_bytes(mgr.path.read_bytes()[:20])  # torn
    report = mgr.load()
    assert report.source is LoadSource.BACKUP
    assert mgr.query("g", "t", 0) == 1 and not mgr.dirty


def test_load_refuses_corrupt_files_unless_allowed(tmp_path):
    (tmp_path / "consumerOffset.json").write_bytes(b'{"offsetTable": {"t@g": {"0": 1')
    with pytest.raises(ConfigFileError):
        ConsumerOffsetManager(tmp_path, epochs=EpochSequence(seed=0)).load()
    forced = ConsumerOffsetManager(
        tmp_path, epochs=EpochSequence(seed=0), allow_empty_on_corruption=True
    )
    assert forced.load().source is LoadSource.FORCED_EMPTY
    assert forced.entry_count() == 0


def test_failed_write_raises_and_keeps_table_dirty(mgr, monkeypatch):
    def failing_write(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(snapshots_module, "write_offset_file", failing_write)
    mgr.commit("g", "t", 0, 1)
    with pytest.raises(OSError):
        asyncio.run(mgr.persist_if_dirty())
    assert mgr.dirty
    monkeypatch.undo()
    assert asyncio.run(mgr.persist_if_dirty()) is not None
    assert not mgr.dirty
