"""topics.json / subscriptionGroup.json on a full disk: refused changes are rolled back, nothing latches."""

from __future__ import annotations

import asyncio
import errno

import pytest

from tidemark.broker.disk import metadata_file
from tidemark.broker.errors import StoreError
from tidemark.broker.membership.groups import SubscriptionGroupManager
from tidemark.broker.topics import TopicConfigManager


class Disk:
    """Replaces metadata_file.save_json; full until freed."""

    def __init__(self, monkeypatch) -> None:
        self.full = False
        self._real = metadata_file.save_json
        monkeypatch.setattr(metadata_file, "save_json", self)

    def __call__(self, path, doc) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        self._real(path, doc)


def test_a_change_that_cannot_be_written_is_refused_rolled_back_and_can_be_retried(tmp_path, monkeypatch):
    topics, groups = TopicConfigManager(tmp_path), SubscriptionGroupManager(tmp_path)
    topics.load()
    groups.load()
    disk = Disk(monkeypatch)
    states: list[tuple[bool, str]] = []
    topics.file.on_state = lambda ok, reason: states.append((ok, reason))

    async def scenario():
        topics.create("Kept", 2)
        await topics.file.flush()
        disk.full = True
        topics.create("Orders", 4)
        topics.update("Kept", write_queue_nums=1)
        with pytest.raises(StoreError, match=r"disk full: .*topics.json.*retry later"):
            await topics.file.flush()
        assert topics.get("Orders") is None and topics.get("Kept").write_queue_nums == 2
        assert not topics.file.dirty  # reads are not refused: memory is the file again
        groups.ensure("billing")
        with pytest.raises(StoreError, match="subscriptionGroup.json"):
            await groups.file.flush()
        assert groups.get("billing") is None
        disk.full = False
        topics.file.retry()  # the broker's timer: the write works, the failing state ends
        async with asyncio.timeout(5):
            while topics.file.failing:
                await asyncio.sleep(0.01)
        topics.create("Orders", 4)  # the same request again works
        await topics.file.flush()

    asyncio.run(scenario())
    assert [ok for ok, _ in states] == [False, True]
    assert states[0][1] == "disk full: No space left on device"
    reloaded = TopicConfigManager(tmp_path)
    reloaded.load()
    assert reloaded.get("Orders").write_queue_nums == 4 and reloaded.get("Kept").write_queue_nums == 2


def test_every_request_whose_change_was_rolled_back_hears_so_whichever_flush_rolled_back(tmp_path, monkeypatch):
    """Two requests change topics.json while the disk is full: both are told, though only one flush
    does the rollback; a request that changed nothing (a read flushes too) still succeeds."""
    topics = TopicConfigManager(tmp_path)
    topics.load()
    disk = Disk(monkeypatch)

    async def request(name: str) -> str:
        topics.create(name, 1)
        try:
            await topics.file.flush()
        except StoreError:
            return "refused"
        return "ok"

    async def scenario():
        disk.full = True
        outcomes = await asyncio.gather(request("A"), request("B"))
        assert outcomes == ["refused", "refused"]
        assert topics.list() == []
        await topics.file.flush()  # a read after the rollback: nothing of its own to write
        disk.full = False
        assert await request("A") == "ok" and [t.name for t in topics.list()] == ["A"]

    asyncio.run(scenario())
