"""QueueLockManager: grants, renewals, expiry, owner epochs, lock tokens and check_owner."""

import time

import pytest

from tidemark.broker.errors import FencedError
from tidemark.broker.membership.epoch import EpochSequence
from tidemark.broker.membership.locks import LockGrant, QueueLockManager


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.wall_ms = 1_700_000_000_000

    def __call__(self) -> float:
        return self.now

    def wall(self) -> int:
        return self.wall_ms

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall_ms += int(seconds * 1000)


G, T = "group-a", "topic-a"
Q0, Q1 = (T, 0), (T, 1)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def locks(clock):
    return QueueLockManager(
        epochs=EpochSequence(seed=1000), tokens=EpochSequence(seed=5000), expiry_ms=60_000, clock=clock,
        wall_clock_ms=clock.wall
    )


def test_grant_returns_queues_with_epoch_and_wall_expiry(locks, clock):
    grants = locks.lock(G, "c1", [Q0, Q1])
    assert grants == [
        LockGrant(T, 0, 1001, clock.wall_ms + 60_000, 5001),
        LockGrant(T, 1, 1002, clock.wall_ms + 60_000, 5002),
    ]
    assert locks.holder(G, T, 0) == "c1"
    assert locks.current_epoch(G, T, 0) == 1001


def test_duplicate_queue_in_one_request_is_granted_once(locks):
    assert len(locks.lock(G, "c1", [Q0, Q0])) == 1


def test_renewal_keeps_epoch_and_extends_expiry(locks, clock):
    first = locks.lock(G, "c1", [Q0])[0]
    clock.advance(50)
    renewed = locks.lock(G, "c1", [Q0])[0]
    assert renewed.owner_epoch == first.owner_epoch
    assert renewed.expire_timestamp == first.expire_timestamp + 50_000
    clock.advance(50)  # 100 s after the first grant, 50 s after the renewal
    assert locks.holder(G, T, 0) == "c1"
    assert locks.lock(G, "c2", [Q0]) == []


def test_a_renewal_keeps_the_lock_token_and_an_acquisition_takes_a_new_one(locks, clock):
    first = locks.lock(G, "c1", [Q0])[0]
    assert locks.lock(G, "c1", [Q0], renew=True)[0].lock_token == first.lock_token
    again = locks.lock(G, "c1", [Q0])[0]  # taken again by its holder (it let go, then it came back)
    assert again.lock_token > first.lock_token and again.owner_epoch == first.owner_epoch
    locks.unlock(G, "c1", [Q0])
    assert locks.lock(G, "c1", [Q0], renew=True)[0].lock_token > again.lock_token  # nothing left to renew


def test_an_unlock_quoting_an_earlier_grant_releases_nothing(locks):
    first = locks.lock(G, "c1", [Q0, Q1])
    second = locks.lock(G, "c1", [Q0])[0]
    tokens = {Q0: first[0].lock_token, Q1: first[1].lock_token}
    assert locks.superseded(G, "c1", T, 0, first[0].lock_token)
    assert not locks.superseded(G, "c1", T, 0, second.lock_token) and not locks.superseded(G, "c1", T, 0, 0)
    assert not locks.superseded(G, "c2", T, 0, first[0].lock_token)  # another client's: its epoch fences it
    assert locks.unlock(G, "c1", [Q0, Q1], tokens) == [Q1]  # Q0's late unlock leaves the new grant
    assert locks.holder(G, T, 0) == "c1"
    assert locks.unlock(G, "c1", [Q0], {Q0: second.lock_token}) == [Q0]


def test_lock_tokens_of_an_earlier_broker_process_name_no_grant_of_this_one(clock):
    old = QueueLockManager(epochs=EpochSequence(), clock=clock, wall_clock_ms=clock.wall)
    token = old.lock(G, "c1", [Q0])[0].lock_token
    time.sleep(0.001)
    new = QueueLockManager(epochs=EpochSequence(), clock=clock, wall_clock_ms=clock.wall)
    assert new.lock(G, "c1", [Q0])[0].lock_token > token


def test_other_client_is_blocked_while_lock_is_live(locks, clock):
    locks.lock(G, "c1", [Q0])
    clock.advance(59.9)
    assert locks.lock(G, "c2", [Q0, Q1]) == [LockGrant(T, 1, 1002, clock.wall_ms + 60_000, 5002)]
    assert locks.holder(G, T, 0) == "c1"


def test_takeover_after_expiry_bumps_epoch(locks, clock):
    first = locks.lock(G, "c1", [Q0])[0]
    clock.advance(60)
    assert locks.holder(G, T, 0) is None
    taken = locks.lock(G, "c2", [Q0])[0]
    assert taken.owner_epoch > first.owner_epoch
    assert locks.holder(G, T, 0) == "c2"
    assert locks.current_epoch(G, T, 0) == taken.owner_epoch


def test_regrant_to_same_holder_after_expiry_or_release_keeps_epoch(locks, clock):
    first = locks.lock(G, "c1", [Q0])[0]
    clock.advance(120)
    assert locks.lock(G, "c1", [Q0])[0].owner_epoch == first.owner_epoch
    assert locks.unlock(G, "c1", [Q0]) == [Q0]
    assert locks.lock(G, "c1", [Q0])[0].owner_epoch == first.owner_epoch


def test_regrant_after_someone_else_held_it_takes_a_new_epoch(locks, clock):
    e1 = locks.lock(G, "c1", [Q0])[0].owner_epoch
    locks.unlock(G, "c1", [Q0])
    e2 = locks.lock(G, "c2", [Q0])[0].owner_epoch
    locks.unlock(G, "c2", [Q0])
    e3 = locks.lock(G, "c1", [Q0])[0].owner_epoch
    assert e1 < e2 < e3


def test_groups_are_independent(locks):
    locks.lock(G, "c1", [Q0])
    assert locks.lock("group-b", "c2", [Q0]) != []
    assert locks.holder("group-b", T, 0) == "c2"


def test_unlock_only_by_holder_and_keeps_epoch_history(locks):
    grant = locks.lock(G, "c1", [Q0, Q1])
    assert locks.unlock(G, "c2", [Q0]) == []
    assert locks.holder(G, T, 0) == "c1"
    assert locks.unlock(G, "c1", [Q0, (T, 7)]) == [Q0]
    assert locks.holder(G, T, 0) is None
    assert locks.current_epoch(G, T, 0) == grant[0].owner_epoch
    assert locks.unlock(G, "c1", [Q0]) == []  # already released
    assert [i.queue_id for i in locks.locks(G)] == [1]


def test_release_client_frees_only_its_queues(locks):
    locks.lock(G, "c1", [Q0])
    locks.lock(G, "c2", [Q1])
    assert locks.release_client(G, "c1") == [Q0]
    assert locks.holder(G, T, 0) is None
    assert locks.holder(G, T, 1) == "c2"
    assert locks.release_client("unknown", "c1") == []


def test_current_epoch_none_when_never_locked(locks):
    assert locks.current_epoch(G, T, 0) is None
    assert locks.holder(G, T, 0) is None


def test_check_owner_accepts_live_holder_with_current_epoch(locks):
    epoch = locks.lock(G, "c1", [Q0])[0].owner_epoch
    locks.check_owner(G, "c1", T, 0, epoch)


def test_check_owner_accepts_expired_holder_when_nobody_took_over(locks, clock):
    epoch = locks.lock(G, "c1", [Q0])[0].owner_epoch
    clock.advance(61)
    locks.expire()
    locks.check_owner(G, "c1", T, 0, epoch)


def test_check_owner_rejects_wrong_epoch_naming_group_queue_and_both_epochs(locks):
    epoch = locks.lock(G, "c1", [Q0])[0].owner_epoch
    with pytest.raises(FencedError) as exc:
        locks.check_owner(G, "c1", T, 0, epoch - 1)
    text = str(exc.value)
    assert G in text and f"{T}:0" in text and str(epoch) in text and str(epoch - 1) in text


def test_check_owner_rejects_old_owner_after_takeover(locks, clock):
    old = locks.lock(G, "c1", [Q0])[0].owner_epoch
    clock.advance(61)
    new = locks.lock(G, "c2", [Q0])[0].owner_epoch
    with pytest.raises(FencedError):
        locks.check_owner(G, "c1", T, 0, old)
    # Even if c1 somehow quotes the new epoch, it is not the holder.
    with pytest.raises(FencedError):
        locks.check_owner(G, "c1", T, 0, new)
    locks.check_owner(G, "c2", T, 0, new)


def test_check_owner_rejects_queue_never_locked(locks):
    with pytest.raises(FencedError, match="never locked"):
        locks.check_owner(G, "c1", T, 0, 5)


def test_expire_returns_expired_locks_once_and_keeps_history(locks, clock):
    locks.lock(G, "c1", [Q0])
    clock.advance(30)
    locks.lock(G, "c2", [Q1])
    clock.advance(31)  # Q0 expired (61 s), Q1 live (31 s)
    expired = locks.expire()
    assert [(i.client_id, i.queue_id, i.live) for i in expired] == [("c1", 0, False)]
    assert locks.expire() == []
    assert locks.current_epoch(G, T, 0) is not None
    assert [(i.client_id, i.queue_id, i.live) for i in locks.locks()] == [("c2", 1, True)]


def test_release_all_frees_every_group_keeps_each_holder_the_owner_and_its_epoch(locks, clock):
    e0 = locks.lock(G, "c1", [Q0])[0].owner_epoch
    locks.lock(G, "c2", [Q1])
    eb = locks.lock("group-b", "c1", [Q0])[0].owner_epoch
    clock.advance(61)
    locks.lock(G, "c3", [("other", 0)])  # live; Q0 and Q1 of G expired but not reaped: released too
    released = locks.release_all()
    assert [(i.group, i.topic, i.queue_id, i.client_id) for i in released] == [
        (G, "other", 0, "c3"), (G, T, 0, "c1"), (G, T, 1, "c2"), ("group-b", T, 0, "c1")]
    assert locks.locks() == [] and locks.release_all() == []
    locks.check_owner(G, "c1", T, 0, e0)  # nobody was granted the queue since: c1 still owns it
    assert locks.lock("group-b", "c1", [Q0], renew=True)[0].owner_epoch == eb  # its renewal takes it again
    assert locks.lock(G, "c4", [Q0])[0].owner_epoch != e0  # or another client does, under a new epoch
    with pytest.raises(FencedError):
        locks.check_owner(G, "c1", T, 0, e0)


def test_locks_lists_expired_but_not_reaped_as_not_live(locks, clock):
    locks.lock(G, "c1", [Q0])
    clock.advance(61)
    [info] = locks.locks(G)
    assert (info.group, info.topic, info.queue_id, info.client_id, info.live) == (
        G,
        T,
        0,
        "c1",
        False,
    )


def test_forget_topic_and_group_drop_history(locks):
    locks.lock(G, "c1", [Q0, ("other", 0)])
    locks.lock("group-b", "c1", [Q0])
    locks.forget_topic(T)
    assert locks.current_epoch(G, T, 0) is None
    assert locks.current_epoch("group-b", T, 0) is None
    assert locks.current_epoch(G, "other", 0) is not None
    locks.forget_group(G)
    assert locks.current_epoch(G, "other", 0) is None
    assert locks.locks() == []


def test_epochs_stay_monotonic_across_broker_restarts(clock):
    # The lock manager of a restarted broker issues epochs above the old one's.
    old = QueueLockManager(epochs=EpochSequence(), clock=clock, wall_clock_ms=clock.wall)
    old_epochs = [g.owner_epoch for g in old.lock(G, "c1", [(T, q) for q in range(50)])]
    time.sleep(0.002)
    new = QueueLockManager(epochs=EpochSequence(), clock=clock, wall_clock_ms=clock.wall)
    new_epoch = new.lock(G, "c2", [Q0])[0].owner_epoch
    assert new_epoch > max(old_epochs)


def test_expiry_must_be_positive():
    with pytest.raises(ValueError):
        QueueLockManager(epochs=EpochSequence(seed=0), expiry_ms=0)
