"""The queue lock table across broker restarts: QueueLockManager.snapshot/restore, and queueLocks.json
(broker/membership/lock_file.py): its format, its damage, and when it is written."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_locks import Q0, Q1, FakeClock, G, T

from tidemark.broker.membership import lock_file
from tidemark.broker.membership.epoch import EpochSequence
from tidemark.broker.membership.lock_file import LockFile, decode_locks, encode_locks
from tidemark.broker.membership.locks import QueueLockManager, SavedLock

EXPIRY_MS = 60_000


def manager(clock: FakeClock, epochs: int = 1000, tokens: int = 5000) -> QueueLockManager:
    return QueueLockManager(epochs=EpochSequence(seed=epochs), tokens=EpochSequence(seed=tokens),
                            expiry_ms=EXPIRY_MS, clock=clock, wall_clock_ms=clock.wall)


def restarted(before: QueueLockManager) -> tuple[QueueLockManager, FakeClock]:
    """A new broker process (its own clock and, as the wall clock seeds them, larger epochs and tokens)
    that restored what `before` saved, through the file's bytes."""
    clock = FakeClock()
    after = manager(clock, epochs=10**9, tokens=10**9)
    saved, expiry_ms = decode_locks(encode_locks(before.snapshot(), before.expiry_ms))
    after.restore(saved, earlier_expiry_ms=expiry_ms)
    return after, clock


_names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
_saved = st.builds(SavedLock, _names, _names, st.integers(0, 2**31), _names, st.integers(0, 2**62),
                   st.integers(0, 2**62), st.booleans(), st.none() | st.integers(-1, 2**62))


@given(st.lists(_saved, max_size=20), st.integers(1, 2**31))
def test_the_file_gives_back_every_entry_as_written(saved, expiry_ms):
    assert decode_locks(encode_locks(saved, expiry_ms)) == (saved, expiry_ms)


@pytest.mark.parametrize("data, says", [
    (b"{not json", "not JSON"),
    (b'{"version": 2, "lockExpiryMs": 60000, "locks": []}', "version 1"),
    (b'{"version": 1, "locks": []}', "lockExpiryMs is None"),
    (b'{"version": 1, "lockExpiryMs": 60000, "locks": [{"group": "g"}]}', "entry 0: topic"),
    (b'{"version": 1, "lockExpiryMs": 60000, "locks": [{"group": "g", "topic": "t", "queueId": true, '
     b'"clientId": "c", "ownerEpoch": 1, "lockToken": 2, "held": true}]}', "queueId is True"),
    (b'{"version": 1, "lockExpiryMs": 60000, "locks": [{"group": "g", "topic": "t", "queueId": 0, '
     b'"clientId": "c", "ownerEpoch": 1, "lockToken": 2, "held": 1}]}', "held is 1"),
    (b'{"version": 1, "lockExpiryMs": 60000, "locks": [7]}', "entry 0 is not an object"),
])
def test_a_damaged_file_is_refused_whole_saying_what_is_wrong(data, says):
    with pytest.raises(ValueError, match=says):
        decode_locks(data)


def test_a_restored_lock_is_its_holder_s_for_half_the_expiry_and_renewed_as_it_was():
    clock = FakeClock()
    before = manager(clock)
    first = before.lock(G, "c1", [Q0])[0]
    after, clock = restarted(before)
    assert after.lock(G, "c2", [Q0]) == []  # no other member gets it while c1 may count on its grant
    renewal = after.lock(G, "c1", [Q0], renew=True)[0]  # c1 goes on: same epoch, same token
    assert (renewal.owner_epoch, renewal.lock_token) == (first.owner_epoch, first.lock_token)
    after.check_owner(G, "c1", T, 0, first.owner_epoch)  # its commits are not fenced

    after, clock = restarted(before)
    clock.advance(EXPIRY_MS / 2000 - 0.001)
    assert after.lock(G, "c2", [Q0]) == []
    clock.advance(0.002)  # half the expiry after the restart: c1 counts on it no more
    taken = after.lock(G, "c2", [Q0])[0]
    assert taken.owner_epoch > first.owner_epoch and taken.lock_token > first.lock_token


def test_a_broker_restarted_with_a_shorter_expiry_holds_a_lock_for_half_the_one_its_grant_told():
    clock = FakeClock()
    before = manager(clock)  # 60 s: the holder counts on its grant for 30 s
    before.lock(G, "c1", [Q0])
    clock = FakeClock()
    after = QueueLockManager(epochs=EpochSequence(seed=10**9), tokens=EpochSequence(seed=10**9), expiry_ms=10_000,
                             clock=clock, wall_clock_ms=clock.wall)
    saved, expiry_ms = decode_locks(encode_locks(before.snapshot(), before.expiry_ms))
    after.restore(saved, earlier_expiry_ms=expiry_ms)
    clock.advance(29.9)
    assert after.lock(G, "c2", [Q0]) == []
    clock.advance(0.2)
    assert after.lock(G, "c2", [Q0]) != []


def test_a_promoted_replica_takes_its_master_s_locks_but_keeps_the_ones_it_holds(tmp_path):
    clock = FakeClock()
    master = manager(clock, epochs=10**12, tokens=10**12)  # (the master's sequences run ahead of the replica's)
    held = master.lock(G, "c1", [Q0, Q1])
    replica_clock = FakeClock()
    replica = manager(replica_clock)
    stand_in = replica.lock(G, "c2", [Q1])[0]  # granted here while the master was away, still held
    saved = LockFile(tmp_path / "queueLocks.json", replica, fsync=False)
    saved.keep_master(encode_locks(master.snapshot(), master.expiry_ms))
    assert saved.adopt_master() == 1
    assert replica.holder(G, T, 0) == "c1" and replica.holder(G, T, 1) == "c2"
    assert replica.lock(G, "c3", [Q0]) == []  # c1 may still count on the master's grant
    renewal = replica.lock(G, "c1", [Q0], renew=True)[0]  # and goes on with it here
    assert (renewal.owner_epoch, renewal.lock_token) == (held[0].owner_epoch, held[0].lock_token)
    replica.unlock(G, "c2", [Q1])
    fresh = replica.lock(G, "c3", [Q1])[0]
    assert fresh.owner_epoch > held[1].owner_epoch and fresh.lock_token > held[1].lock_token  # never reused
    assert stand_in.owner_epoch < held[0].owner_epoch
    (tmp_path / "other").mkdir()
    assert LockFile(tmp_path / "other" / "queueLocks.json", manager(FakeClock()), fsync=False).adopt_master() == 0


def test_a_copy_of_the_master_s_table_that_cannot_be_written_is_logged_held_in_memory_and_written_at_the_next_copy(
        tmp_path, monkeypatch, caplog):
    writes = CountingWrites(monkeypatch)
    path = tmp_path / "queueLocks.json"
    saved = LockFile(path, manager(FakeClock()), fsync=False)
    master = manager(FakeClock(), epochs=10**12)
    master.lock(G, "c1", [Q0])
    data = encode_locks(master.snapshot(), master.expiry_ms)
    writes.fail = True
    saved.keep_master(data)  # (the replica's copy goes on)
    assert "master_locks_not_kept" in caplog.text
    assert LockFile(path, manager(FakeClock()), fsync=False).adopt_master() == 0  # a restart: no copy on disk
    writes.fail = False
    saved.keep_master(data)  # the same table again: written now
    assert LockFile(path, manager(FakeClock()), fsync=False).adopt_master() == 1
    assert saved.adopt_master() == 1  # (promoted in this run: the copy in memory)


def test_a_promoted_replica_takes_the_copy_it_got_last_even_when_the_file_holds_an_older_one(tmp_path, monkeypatch):
    writes = CountingWrites(monkeypatch)
    replica = manager(FakeClock())
    saved = LockFile(tmp_path / "queueLocks.json", replica, fsync=False)
    master = manager(FakeClock(), epochs=10**12)
    saved.keep_master(encode_locks(master.snapshot(), master.expiry_ms))  # no lock yet: on disk
    master.lock(G, "c1", [Q0])
    writes.fail = True
    saved.keep_master(encode_locks(master.snapshot(), master.expiry_ms))  # the grant: not on disk
    assert saved.adopt_master() == 1 and replica.holder(G, T, 0) == "c1"


def test_released_grants_come_back_as_history_for_the_epoch_rule():
    clock = FakeClock()
    before = manager(clock)
    first = before.lock(G, "c1", [Q0, Q1])
    before.unlock(G, "c1", [Q0])
    after, _ = restarted(before)
    assert after.holder(G, T, 0) is None and after.holder(G, T, 1) == "c1"
    after.check_owner(G, "c1", T, 0, first[0].owner_epoch)  # still the owner until another takes it
    again = after.lock(G, "c1", [Q0])[0]
    assert again.owner_epoch == first[0].owner_epoch  # the same client again: the same epoch


def test_grants_and_releases_are_changes_and_renewals_are_not():
    locks = manager(FakeClock())
    locks.lock(G, "c1", [Q0, Q1])
    assert locks.changes == 2
    locks.lock(G, "c1", [Q0, Q1], renew=True)
    assert locks.changes == 2
    locks.unlock(G, "c1", [Q0])
    locks.release_client(G, "c1")
    locks.unlock(G, "c1", [Q0])  # (nothing held: nothing changed)
    assert locks.changes == 4


class CountingWrites:
    """Replaces the file's atomic_write: records each write and whether it was fsynced; fails while `fail`
    is set (a full disk)."""

    def __init__(self, monkeypatch) -> None:
        self.writes: list[bytes] = []
        self.syncs: list[bool] = []
        self.fail = False
        real = lock_file.atomic_write

        def write(path, data, *, sync):
            if self.fail:
                raise OSError(28, "No space left on device")
            self.writes.append(data)
            self.syncs.append(sync)
            real(path, data, sync=sync)
        monkeypatch.setattr(lock_file, "atomic_write", write)


def test_changes_of_one_moment_share_a_write_and_renewals_wait_for_none(tmp_path, monkeypatch):
    async def scenario():
        writes = CountingWrites(monkeypatch)
        locks = manager(FakeClock())
        saved = LockFile(tmp_path / "queueLocks.json", locks, fsync=True)
        locks.lock(G, "c1", [Q0])
        locks.lock(G, "c2", [Q1])
        await asyncio.gather(saved.save(), saved.save())
        assert len(writes.writes) == 1 and writes.syncs == [True]
        locks.lock(G, "c1", [Q0], renew=True)
        await saved.save()
        assert len(writes.writes) == 1  # nothing new to write
        locks.unlock(G, "c1", [Q0])
        saved.save_soon()
        await saved.close()
        assert len(writes.writes) == 2
        assert [lk.held for lk in decode_locks((tmp_path / "queueLocks.json").read_bytes())[0]] == [False, True]
    asyncio.run(scenario())


def test_a_release_is_written_soon_or_with_the_grant_that_follows_it(tmp_path, monkeypatch):
    monkeypatch.setattr(lock_file, "SOON_S", 0.01)

    async def scenario():
        writes = CountingWrites(monkeypatch)
        locks = manager(FakeClock())
        saved = LockFile(tmp_path / "queueLocks.json", locks, fsync=False)
        locks.lock(G, "c1", [Q0])
        await saved.save()
        locks.unlock(G, "c1", [Q0])
        saved.save_soon()
        locks.lock(G, "c2", [Q0])  # the handover's next owner, granted at the release
        await saved.save()
        assert len(writes.writes) == 2  # the release went with the grant
        await asyncio.sleep(0.05)
        assert len(writes.writes) == 2  # and nothing was left for its own write
        locks.unlock(G, "c2", [Q0])
        saved.save_soon()
        saved.save_soon()
        assert len(writes.writes) == 2  # not at once...
        await asyncio.sleep(0.05)
        assert len(writes.writes) == 3  # ...but soon, once
        assert not decode_locks((tmp_path / "queueLocks.json").read_bytes())[0][0].held
        await saved.close()
    asyncio.run(scenario())


def test_a_failed_write_is_logged_answered_all_the_same_and_written_at_shutdown(tmp_path, monkeypatch, caplog):
    async def scenario():
        writes = CountingWrites(monkeypatch)
        locks = manager(FakeClock())
        saved = LockFile(tmp_path / "queueLocks.json", locks, fsync=False)
        locks.lock(G, "c1", [Q0])
        writes.fail = True
        await asyncio.wait_for(saved.save(), 5)  # ends: the grant is answered
        assert "lock_file_write_failed" in caplog.text and not (tmp_path / "queueLocks.json").exists()
        writes.fail = False
        await saved.close()  # the disk has room again: written once more
        assert writes.syncs == [False]
        assert decode_locks((tmp_path / "queueLocks.json").read_bytes())[0][0].client_id == "c1"
    asyncio.run(scenario())


def test_a_damaged_file_is_set_aside_and_the_broker_starts_with_no_locks(tmp_path, caplog):
    path = tmp_path / "queueLocks.json"
    path.write_text(json.dumps({"version": 1, "lockExpiryMs": 60_000, "locks": [{"group": G}]}))
    locks = manager(FakeClock())
    assert LockFile(path, locks, fsync=False).load() == 0
    assert locks.snapshot() == [] and not path.exists()
    assert (tmp_path / "queueLocks.json.damaged").exists() and "lock_file_damaged" in caplog.text


def test_load_restores_what_was_saved(tmp_path):
    async def scenario():
        clock = FakeClock()
        before = manager(clock)
        before.lock(G, "c1", [Q0, Q1])
        before.unlock(G, "c1", [Q1])
        await LockFile(tmp_path / "queueLocks.json", before, fsync=False).save()
        after = manager(FakeClock(), epochs=10**9)
        assert LockFile(tmp_path / "queueLocks.json", after, fsync=False).load() == 1
        assert after.snapshot() == before.snapshot()
    asyncio.run(scenario())


def test_a_large_copy_of_the_master_s_table_is_written_off_the_loop_the_latest_copy_only(tmp_path, monkeypatch):
    async def scenario():
        writes = CountingWrites(monkeypatch)
        path = tmp_path / "queueLocks.json"
        saved = LockFile(path, manager(FakeClock()), fsync=False)
        master = manager(FakeClock(), epochs=10**12)
        copies = []
        for client in range(3):
            master.lock(G, f"c{client}", [(T, q) for q in range(client * 500, client * 500 + 500)])
            copies.append(encode_locks(master.snapshot(), master.expiry_ms))
            saved.keep_master(copies[-1])  # written in a thread, once the loop turns: the copies meanwhile coalesce
        assert len(copies[0]) > lock_file.INLINE_MAX_MASTER_BYTES and writes.writes == []
        await saved.close()  # (finishes the write)
        assert writes.writes == [copies[2]]  # one write, of the latest copy
        assert saved.adopt_master() == 1500
        assert LockFile(path, manager(FakeClock()), fsync=False).adopt_master() == 1500
    asyncio.run(scenario())
