"""What the offset journal cannot take is refused and undone; names from other processes are checked.

The manager alone (a refused batch leaves every entry as it was: offsets, fence states, reset
generations, removals), then OffsetCommitService on a broker domain without gRPC (checks before any
side effect: a bad commit of a batch is a rejection, a new group's config is written before its offset
moves, HandBackOffsets' names), then SendService (a refused send creates no topic).
"""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from tidemark.broker.config import BrokerConfig
from tidemark.broker.controller import BrokerController
from tidemark.broker.disk import metadata_file
from tidemark.broker.errors import InvalidArgumentError, StoreError
from tidemark.broker.ingest.send import OutgoingMessage
from tidemark.broker.membership.epoch import EpochSequence
from tidemark.broker.offsets import ConsumerOffsetManager, Fence
from tidemark.broker.offsets.commits import Commit, RejectReason
from tidemark.broker.offsets.persistence import invalid_names


def loaded(directory: Path) -> ConsumerOffsetManager:
    m = ConsumerOffsetManager(directory, epochs=EpochSequence(seed=10**9))
    m.load()
    return m


def state(m: ConsumerOffsetManager) -> tuple:
    return ({k: dict(v) for k, v in m._offsets.items()}, {k: dict(v) for k, v in m._generations.items()},
            {k: dict(v) for k, v in m._fences.items()}, set(m._removed))


@pytest.fixture
def full_disk(monkeypatch):
    """os.write fails with ENOSPC until `free()` (the journal's one write per batch)."""
    real = os.write

    class Disk:
        full = True

        def free(self) -> None:
            self.full = False

    disk = Disk()

    def write(fd, data):
        if disk.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    return disk


# -- the manager -----------------------------------------------------------------------------------------


def test_a_refused_batch_leaves_every_entry_as_it_was_and_a_crash_agrees(tmp_path, full_disk):
    full_disk.free()
    m = loaded(tmp_path)
    m.commit("g", "T", 0, 3, Fence("a", owner_epoch=5))
    m.reset("g", "T", 1, 4)
    m.commit("h", "T", 0, 9)
    before = state(m)
    full_disk.full = True
    with pytest.raises(StoreError, match="disk full.*offset journal.*not applied"), m.batch():
        m.commit("g", "T", 0, 6, Fence("a", owner_epoch=7))  # a new owner epoch: fence state changes
        m.commit("g", "T", 2, 1)  # a new queue
        m.commit("new", "T", 0, 1)  # a new entry
        m.reset("g", "T", 1, 0)  # a new generation
        m.remove_group("h")
    assert state(m) == before
    full_disk.free()
    assert state(loaded(tmp_path))[:2] == before[:2]


def test_each_refused_change_raises_and_changes_nothing(tmp_path, full_disk):
    full_disk.free()
    m = loaded(tmp_path)
    m.commit("g", "T", 0, 3)
    m.commit("g", "U", 0, 3)
    before = state(m)
    full_disk.full = True
    for change in (lambda: m.commit("g", "T", 0, 4), lambda: m.reset("g", "T", 0, 1),
                   lambda: m.remove_group("g"), lambda: m.remove_group_topic("g", "U"),
                   lambda: m.take_back({("T", "g"): {0: 8}}, {})):
        with pytest.raises(StoreError):
            change()
        assert state(m) == before


def test_a_refused_removal_still_keeps_a_handed_back_table_out_after_a_later_one(tmp_path, full_disk):
    full_disk.free()
    m = loaded(tmp_path)
    m.commit("g", "T", 0, 3)
    full_disk.full = True
    with pytest.raises(StoreError):
        m.remove_group_topic("g", "T")
    full_disk.free()
    assert m.take_back({("T", "g"): {0: 8}}, {}) == 1  # the removal did not happen: the entry is live
    m.remove_group_topic("g", "T")
    assert m.take_back({("T", "g"): {0: 9}}, {}) == 0  # removed by an admin now: stays out


def test_changes_that_repeat_state_kept_elsewhere_stand_in_memory(tmp_path, full_disk):
    full_disk.free()
    m = loaded(tmp_path)
    m.commit("g", "T", 0, 3)
    full_disk.full = True
    assert m.advance("p", "T", 0, 5)  # a pop watermark: the pop journal holds its acknowledgements
    assert m.mirror({("T", "g"): {0: 7}}, {}) == 1  # a master's table on its replica
    assert m.clean_topic("Gone") == 0 and m.query("p", "T", 0) == 5 and m.query("g", "T", 0) == 7
    assert m.journal_error is not None


def test_a_mirrored_table_leaves_out_names_no_rpc_accepts(tmp_path):
    m = loaded(tmp_path)
    assert m.mirror({("T", "g\n"): {0: 1}, ("T", "f:G"): {0: 1}, ("T", "g"): {0: 2}}, {}) == 1
    assert m.groups() == ["g"]


def test_invalid_names_says_which_keys_and_why():
    bad = invalid_names([("T", "g"), ("T", "g\n"), ("t\t", "g"), ("%RETRY%g", "g"), ("T", "x" * 300)])
    assert set(bad) == {("T", "g\n"), ("t\t", "g"), ("T", "x" * 300)}
    assert "may only contain" in bad[("T", "g\n")] and "at most" in bad[("T", "x" * 300)]


def test_a_replica_hands_back_only_well_named_entries(tmp_path):
    m = loaded(tmp_path)
    m._offsets[("T", "g\n")] = {0: 1}  # from a master before names were checked
    m.commit("g", "T", 0, 2)
    assert m.table(well_named=True)[0] == {("T", "g"): {0: 2}}


# -- OffsetCommitService and SendService on a broker domain -----------------------------------------------


def run(tmp_path: Path, scenario, **config) -> None:
    async def main():
        b = BrokerController(BrokerConfig(data_dir=tmp_path, flush_interval_ms=3_600_000, **config))
        b.load()
        await b.start()
        b.topics.create("T", 2)
        await b.flush_configs()
        try:
            await scenario(b)
        finally:
            await b.shutdown()
    asyncio.run(main())


def put(b: BrokerController, n: int):
    return b.sender.send("T", 0, [OutgoingMessage(body=b"x")] * n)


def test_a_bad_commit_of_a_batch_is_a_rejection_and_the_rest_apply(tmp_path):
    async def scenario(b):
        await put(b, 5)
        result = await b.commits.commit_batch([
            Commit("g", "T", 0, 1), Commit("g", "T", 0, 2, invalid="client id 'a b' may only contain ..."),
            Commit("g", "Nope", 0, 1), Commit("g", "T", 0, 3)])
        assert (result.applied, result.rejected) == (2, 2)
        assert [(r.commit.offset, r.reason) for r in result.rejections] == [(2, RejectReason.INVALID),
                                                                           (1, RejectReason.INVALID)]
        assert b.offsets.query("g", "T", 0) == 3
        assert "Nope" not in {t.name for t in b.topics.list(include_system=True)}
    run(tmp_path, scenario)


def test_every_commit_of_a_batch_is_checked_though_its_group_and_topic_were_already(tmp_path):
    """The batch checks a (group, topic) pair's names once; each commit's queue and offset still are."""
    async def scenario(b):
        await put(b, 5)
        await b.commits.commit_batch([Commit("g", "T", 0, 1)])  # the group exists: no config write between
        result = await b.commits.commit_batch([
            Commit("g", "T", 0, 2), Commit("g", "T", 7, 1), Commit("g", "T", 0, 6), Commit("g", "T", 1, 0),
            Commit("g", "T", 0, 4)])
        assert (result.applied, result.rejected) == (3, 2)
        assert [(r.commit.queue_id, r.commit.offset) for r in result.rejections] == [(7, 1), (0, 6)]
        assert "out of range" in result.rejections[0].message and "above the max" in result.rejections[1].message
        assert b.offsets.query("g", "T", 0) == 4
    run(tmp_path, scenario)


def test_a_new_group_whose_config_cannot_be_written_gets_no_offset(tmp_path, monkeypatch):
    real = metadata_file.save_json

    def full(path, doc):
        raise OSError(errno.ENOSPC, "No space left on device")

    async def scenario(b):
        await put(b, 5)
        monkeypatch.setattr(metadata_file, "save_json", full)
        with pytest.raises(StoreError, match="subscriptionGroup.json"):
            await b.commits.commit_acknowledged(Commit("new", "T", 0, 3))
        with pytest.raises(StoreError, match="subscriptionGroup.json"):
            await b.commits.commit_batch([Commit("newer", "T", 0, 3)])
        assert b.offsets.query("new", "T", 0) == b.offsets.query("newer", "T", 0) == -1
        assert b.groups.get("new") is None and b.groups.get("newer") is None
        # A refused commit of a new group creates nothing either, and needs no write.
        with pytest.raises(InvalidArgumentError):
            await b.commits.commit_acknowledged(Commit("newest", "T", 0, 99))
        assert b.groups.get("newest") is None
        monkeypatch.setattr(metadata_file, "save_json", real)
        await b.commits.commit_acknowledged(Commit("new", "T", 0, 3))
        assert b.offsets.query("new", "T", 0) == 3 and b.groups.get("new") is not None
    run(tmp_path, scenario)


def test_hand_back_refuses_a_bad_name_and_applies_nothing_of_the_call(tmp_path):
    async def scenario(b):
        with pytest.raises(InvalidArgumentError, match=r"'T@g\\n'"):
            b.commits.take_back({("T", "ok"): {0: 1}, ("T", "g\n"): {0: 1}}, {})
        assert b.offsets.groups() == []
        assert b.commits.take_back({("T", "ok"): {0: 1}}, {}) == 1
    run(tmp_path, scenario)


@pytest.mark.parametrize("topic, queue_id, message", [
    ("%RETRY%g", 99, OutgoingMessage(body=b"x")),
    ("%RETRY%g", None, OutgoingMessage(body=b"x", delay_level=99)),
    ("%RETRY%g", None, OutgoingMessage(body=b"x", properties={"RECONSUME_TIME": "x"})),
    ("%RETRY%g", None, OutgoingMessage(body=b"x", properties={"TRAN_MSG": "true"})),
    ("auto", 99, OutgoingMessage(body=b"x")),
    ("auto", None, OutgoingMessage(body=b"x", delay_level=99)),
], ids=["retry-queue", "retry-delay", "retry-reconsume", "retry-half", "auto-queue", "auto-delay"])
def test_a_refused_send_creates_no_topic(tmp_path, topic, queue_id, message):
    async def scenario(b):
        before = {t.name for t in b.topics.list(include_system=True)}
        with pytest.raises(InvalidArgumentError):
            await b.sender.send(topic, queue_id, [message])
        assert {t.name for t in b.topics.list(include_system=True)} == before
        await b.sender.send(topic, None, [OutgoingMessage(body=b"x")])  # a good one still creates it
        assert topic in {t.name for t in b.topics.list(include_system=True)}
    run(tmp_path, scenario, auto_create_topic=True)


def test_a_send_to_a_retry_topic_past_its_reconsume_limit_creates_the_dlq_when_stored(tmp_path):
    async def scenario(b):
        [sent] = await b.sender.send("%RETRY%g", None, [OutgoingMessage(
            body=b"x", properties={"RECONSUME_TIME": "5", "MAX_RECONSUME_TIMES": "3"})])
        assert b.topics.get("%DLQ%g") is not None and b.store.max_offset("%DLQ%g", 0) == 1
        assert sent.put.queue_offset == 0
    run(tmp_path, scenario)
