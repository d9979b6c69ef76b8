"""Commit fencing: owner epochs, reset generations, forward-only within an epoch."""

import pytest

from tidemark.broker.errors import FencedError, StaleResetGenerationError
from tidemark.broker.membership.epoch import EpochSequence
from tidemark.broker.membership.locks import QueueLockManager
from tidemark.broker.offsets import ConsumerOffsetManager, Fence

G, T = "g", "t"


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def locks(clock):
    return QueueLockManager(epochs=EpochSequence(seed=1000), clock=clock)


@pytest.fixture
def mgr(tmp_path, locks):
    # Locks and resets share one broker-wide sequence in the broker; separate
    # ones here keep the numbers easy to read.
    m = ConsumerOffsetManager(tmp_path, epochs=EpochSequence(seed=5000), ownership=locks)
    m.load()
    return m


def _epoch(locks, client):
    return locks.lock(G, client, [(T, 0)])[0].owner_epoch


# -- rule 1: no fence, RocketMQ's last write wins -----------------------------


@pytest.mark.parametrize("fence", [None, Fence(), Fence(client_id="c1")])
def test_unfenced_commit_is_last_write_wins(mgr, fence):
    assert mgr.commit(G, T, 0, 100, fence)
    assert mgr.commit(G, T, 0, 40, fence)
    assert mgr.query(G, T, 0) == 40


def test_unfenced_commit_still_last_write_wins_after_fenced_ones(mgr, locks):
    e1 = _epoch(locks, "c1")
    mgr.commit(G, T, 0, 100, Fence("c1", e1))
    assert mgr.commit(G, T, 0, 40)
    assert mgr.query(G, T, 0) == 40


# -- rule 2: reset generation -------------------------------------------------


def test_reset_sets_offset_bumps_generation_and_returns_old(mgr):
    assert mgr.reset_generation(G, T, 0) == 0
    assert mgr.reset(G, T, 0, 10) == -1
    gen1 = mgr.reset_generation(G, T, 0)
    assert gen1 > 0 and mgr.query(G, T, 0) == 10
    mgr.commit(G, T, 0, 50)
    assert mgr.reset(G, T, 0, 20) == 50
    assert mgr.reset_generation(G, T, 0) > gen1
    assert mgr.query(G, T, 0) == 20
    assert mgr.reset_generation(G, T, 1) == 0  # per queue


def test_commit_from_before_a_reset_is_rejected_and_changes_nothing(mgr):
    mgr.commit(G, T, 0, 100, Fence("c1", reset_generation=0))
    mgr.reset(G, T, 0, 10)
    gen = mgr.reset_generation(G, T, 0)
    mgr.persist_now()
    with pytest.raises(StaleResetGenerationError) as exc:
        mgr.commit(G, T, 0, 120, Fence("c1", reset_generation=0))
    message = str(exc.value)
    assert "reset" in message and str(gen) in message and "generation 0" in message
    assert mgr.query(G, T, 0) == 10
    assert not mgr.dirty


def test_commit_with_current_or_newer_generation_is_accepted(mgr):
    mgr.reset(G, T, 0, 10)
    gen = mgr.reset_generation(G, T, 0)
    assert mgr.commit(G, T, 0, 15, Fence("c1", reset_generation=gen))
    # Newer than known (a generation issued before a broker restart wiped ours): accepted.
    assert mgr.commit(G, T, 0, 16, Fence("c1", reset_generation=gen + 10))
    assert mgr.query(G, T, 0) == 16


def test_stale_generation_is_rejected_even_with_a_current_epoch(mgr, locks):
    e1 = _epoch(locks, "c1")
    mgr.commit(G, T, 0, 100, Fence("c1", e1, 0))
    mgr.reset(G, T, 0, 10)
    with pytest.raises(StaleResetGenerationError):
        mgr.commit(G, T, 0, 101, Fence("c1", e1, 0))
    assert mgr.query(G, T, 0) == 10


# -- rule 3: owner epoch ------------------------------------------------------


def test_commit_with_stale_epoch_is_fenced_and_changes_nothing(mgr, locks, clock):
    e1 = _epoch(locks, "c1")
    mgr.commit(G, T, 0, 100, Fence("c1", e1))
    clock.now += 61  # c1's lock expires, c2 takes the queue over
    e2 = _epoch(locks, "c2")
    assert e2 > e1
    mgr.persist_now()
    with pytest.raises(FencedError) as exc:
        mgr.commit(G, T, 0, 150, Fence("c1", e1))
    assert str(e1) in str(exc.value) and str(e2) in str(exc.value) and "'c1'" in str(exc.value)
    assert mgr.query(G, T, 0) == 100
    assert not mgr.dirty


def test_newer_epoch_may_set_any_offset(mgr, locks, clock):
    e1 = _epoch(locks, "c1")
    mgr.commit(G, T, 0, 100, Fence("c1", e1))
    clock.now += 61
    e2 = _epoch(locks, "c2")
    assert mgr.commit(G, T, 0, 80, Fence("c2", e2))
    assert mgr.query(G, T, 0) == 80


def test_epoch_unknown_to_the_lock_manager_is_accepted(mgr):
    # Never locked in this broker process (e.g. right after a restart).
    assert mgr.commit(G, T, 0, 7, Fence("c1", owner_epoch=123))
    assert mgr.query(G, T, 0) == 7


def test_without_lock_manager_the_entrys_last_fenced_epoch_guards(tmp_path):
    mgr = ConsumerOffsetManager(tmp_path, epochs=EpochSequence(seed=0))
    mgr.commit(G, T, 0, 100, Fence("c2", owner_epoch=20))
    with pytest.raises(FencedError):
        mgr.commit(G, T, 0, 150, Fence("c1", owner_epoch=10))
    assert mgr.query(G, T, 0) == 100
    assert mgr.commit(G, T, 0, 90, Fence("c3", owner_epoch=30))


# -- rule 4: forward only within one epoch and generation ---------------------


def test_late_lower_offset_in_same_epoch_is_ignored(mgr, locks):
    e1 = _epoch(locks, "c1")
    assert mgr.commit(G, T, 0, 100, Fence("c1", e1))
    mgr.persist_now()
    assert mgr.commit(G, T, 0, 90, Fence("c1", e1)) is False  # a late oneway commit
    assert mgr.query(G, T, 0) == 100 and not mgr.dirty
    assert mgr.commit(G, T, 0, 110, Fence("c1", e1)) is True
    assert mgr.query(G, T, 0) == 110


def test_first_fenced_commit_may_move_back_from_an_unfenced_value(mgr, locks):
    mgr.commit(G, T, 0, 100)
    e1 = _epoch(locks, "c1")
    assert mgr.commit(G, T, 0, 60, Fence("c1", e1))
    assert mgr.query(G, T, 0) == 60


def test_after_a_reset_the_same_epoch_may_commit_below_the_old_offset(mgr, locks):
    e1 = _epoch(locks, "c1")
    mgr.commit(G, T, 0, 100, Fence("c1", e1, 0))
    mgr.reset(G, T, 0, 10)
    gen = mgr.reset_generation(G, T, 0)
    assert mgr.commit(G, T, 0, 12, Fence("c1", e1, gen))
    assert mgr.commit(G, T, 0, 11, Fence("c1", e1, gen)) is False
    assert mgr.query(G, T, 0) == 12


def test_renewal_keeps_epoch_so_forward_only_still_applies(mgr, locks, clock):
    e1 = _epoch(locks, "c1")
    mgr.commit(G, T, 0, 100, Fence("c1", e1))
    clock.now += 30
    assert _epoch(locks, "c1") == e1
    assert mgr.commit(G, T, 0, 99, Fence("c1", e1)) is False


def test_handover_old_owner_cannot_move_offset_after_new_owner_locks(mgr, locks):
    """Zero-duplicate handover: c1 drains, commits, releases; c2 locks and reads."""
    e1 = _epoch(locks, "c1")
    mgr.commit(G, T, 0, 100, Fence("c1", e1))
    locks.unlock(G, "c1", [(T, 0)])
    e2 = _epoch(locks, "c2")
    start = mgr.query(G, T, 0)
    assert start == 100
    with pytest.raises(FencedError):  # a stray oneway commit from c1 arriving late
        mgr.commit(G, T, 0, 130, Fence("c1", e1))
    mgr.commit(G, T, 0, 104, Fence("c2", e2))
    assert mgr.query(G, T, 0) == 104


# -- after a restart: an owner nothing vouches for --------------------------------


def test_after_a_restart_a_fenced_commit_nobody_vouches_for_moves_forward_only(tmp_path, clock):
    """Found by the fault checker (kill scenario): after a broker restart neither the locks nor the last
    fenced commit are known, and a consumer that had lost the queue before the restart rewound its offset
    with a stale fenced commit. Such a commit now moves the offset forward only."""
    locks = QueueLockManager(epochs=EpochSequence(seed=1000), clock=clock)
    before = ConsumerOffsetManager(tmp_path, epochs=EpochSequence(seed=5000), ownership=locks)
    before.load()
    stale = _epoch(locks, "c1")
    before.commit(G, T, 0, 9, Fence("c1", stale))
    locks.unlock(G, "c1", [(T, 0)])
    current = _epoch(locks, "c2")
    before.commit(G, T, 0, 12, Fence("c2", current))

    fresh_locks = QueueLockManager(epochs=EpochSequence(seed=2000), clock=clock)  # a restarted broker
    after = ConsumerOffsetManager(tmp_path, epochs=EpochSequence(seed=6000), ownership=fresh_locks)
    after.load()
    assert after.query(G, T, 0) == 12
    assert not after.commit(G, T, 0, 9, Fence("c1", stale)), "a stale owner rewound the offset"
    assert after.query(G, T, 0) == 12
    assert after.commit(G, T, 0, 15, Fence("c1", stale)), "forward is still taken"
    assert not after.commit(G, T, 0, 13, Fence("c2", current)), "an unverified commit vouched for nobody"
    assert after.query(G, T, 0) == 15
    # Once the queue is locked again, its owner's commits are checked against the lock, rewinds included.
    owner = _epoch(fresh_locks, "c2")
    with pytest.raises(FencedError):
        after.commit(G, T, 0, 20, Fence("c1", stale))
    assert after.commit(G, T, 0, 13, Fence("c2", owner), allow_rewind=True)
    assert after.query(G, T, 0) == 13
