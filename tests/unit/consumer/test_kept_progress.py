"""A queue lost to a broker restart resumes from this client's own progress, not the broker's older offset
(unless an admin reset came in between); a queue handed to another consumer leaves nothing behind."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from tidemark.client.consumer.kept_progress import KeptProgress, resume_offset
from tidemark.client.consumer.offset_store import RemoteBrokerOffsetStore
from tidemark.client.consumer.ownership import QueueOwnership
from tidemark.client.consumer.queue_state import QueueState
from tidemark.client.message import MessageQueue
from tidemark.client.remoting.moves import MasterMoves
from tidemark.client.types import QueueLockGrant

MQ = MessageQueue("T", "broker-a", 0)

offsets = st.integers(-1, 10_000)
generations = st.integers(0, 3)
committed_offsets = st.just(-1) | st.integers(0, 10_000)  # "none" often enough to matter


@given(committed_offsets, offsets, generations, st.none() | st.builds(KeptProgress, offsets, generations))
def test_resume_offset(committed, kept_extra, generation, kept):
    start = max(committed, 0) + kept_extra % 7  # the committed offset, or past it (expired messages)
    resumed = resume_offset(start, committed, generation, kept)
    if kept is None or kept.offset < 0 or kept.reset_generation != generation:
        assert resumed == start  # nothing kept, or an admin reset since: the broker's answer stands
    elif committed < 0:
        assert resumed == start  # the broker knows nothing: the queue may not be the one we read
    elif kept.offset > committed:
        assert resumed == max(start, kept.offset)  # our own progress is further along: keep it
    else:
        assert resumed == start
    if committed >= 0:
        assert resumed >= start  # never behind what the group committed


def test_a_kept_position_is_not_used_when_the_broker_has_no_offset():
    # A deleted and re-created topic: clean_topic dropped the offsets and generations (back to 0, like
    # ours), the new queue starts at 0. Resuming at 120 would skip its first 120 messages.
    assert resume_offset(0, -1, 0, KeptProgress(120, 0)) == 0


class RestartingBroker:
    """Grants every lock at once with the epoch, committed offset and generation it is told; records
    acknowledged commits."""

    def __init__(self) -> None:
        self.epoch, self.committed, self.generation = 10, 100, 0
        self.commits = []
        self.moves = MasterMoves()  # BrokerCluster's: the broker restarts in place, it never moves

    async def connection(self, broker_name):
        return self

    async def lock_queues(self, group, client_id, mqs, *, wait_ms=0, renew=False):
        return [QueueLockGrant(mq, self.epoch, 0, self.committed, self.generation) for mq in mqs]

    async def unlock_queues(self, group, client_id, mqs, final_offsets=(), tokens=()):
        return []

    async def update_consumer_offset(self, commit):
        self.commits.append(commit)


class Hooks:
    commit_start_offset = True

    def __init__(self) -> None:
        self.started = []

    async def start_offset(self, mq, committed):
        return max(committed, 0)

    async def lease_started(self, lease):
        self.started.append(lease)

    async def lease_draining(self, lease):
        pass

    def lease_ended(self, lease):
        pass

    def queue_lost(self, mq):
        pass


def setup() -> tuple[RestartingBroker, Hooks, RemoteBrokerOffsetStore, QueueOwnership]:
    broker, hooks = RestartingBroker(), Hooks()
    store = RemoteBrokerOffsetStore(cluster=broker, group="g", client_id="c1", require_fence=True)
    own = QueueOwnership(cluster=broker, group="g", client_id="c1", offset_store=store, locking=True, hooks=hooks)
    update = own.update

    async def update_and_settle(topic, target):  # (queues taken are locked in the background: wait for it)
        changed = await update(topic, target)
        await own.settle()
        return changed
    own.update = update_and_settle
    return broker, hooks, store, own


def test_after_a_broker_restart_the_queue_resumes_from_its_own_progress_and_commits_it():
    async def scenario():
        broker, hooks, store, own = setup()
        await own.update("T", {MQ})
        assert hooks.started[-1].start_offset == 100
        store.update_offset(MQ, 340, increase_only=True)  # consumed up to 340; the broker knows 100
        broker.epoch = 20  # the broker restarted: its locks are gone, its offset is the stale one
        await own.lose(MQ, "fetch fenced: no owner epoch on this broker")
        assert own.get(MQ) is None
        await own.update("T", {MQ})  # the rebalance that follows
        lease = hooks.started[-1]
        assert own.get(MQ).state is QueueState.PULLING
        assert lease.start_offset == 340 and lease.owner_epoch == 20
        assert store.read_memory(MQ) == 340
        (commit,) = broker.commits  # re-committed at once, fenced by the new lock
        assert (commit.offset, commit.owner_epoch, commit.reset_generation) == (340, 20, 0)
    asyncio.run(scenario())


def test_an_admin_reset_while_the_queue_was_lost_wins():
    async def scenario():
        broker, hooks, store, own = setup()
        await own.update("T", {MQ})
        store.update_offset(MQ, 340, increase_only=True)
        await own.lose(MQ, "lock not renewed")
        broker.epoch, broker.committed, broker.generation = 20, 5, 7  # reset to 5, generation 7
        await own.update("T", {MQ})
        assert hooks.started[-1].start_offset == 5 and hooks.started[-1].reset_generation == 7
        assert broker.commits == []
    asyncio.run(scenario())


def test_a_broker_further_along_than_the_kept_progress_wins():
    async def scenario():
        broker, hooks, store, own = setup()
        await own.update("T", {MQ})
        store.update_offset(MQ, 150, increase_only=True)
        await own.lose(MQ, "lock not renewed")
        broker.epoch, broker.committed = 20, 400  # another member consumed meanwhile
        await own.update("T", {MQ})
        assert hooks.started[-1].start_offset == 400 and broker.commits == []
    asyncio.run(scenario())


def test_a_queue_that_went_to_another_member_forgets_its_kept_progress():
    async def scenario():
        broker, hooks, store, own = setup()
        await own.update("T", {MQ})
        store.update_offset(MQ, 340, increase_only=True)
        await own.lose(MQ, "lock not renewed")
        await own.update("T", set())  # the rebalance gave it to someone else
        broker.epoch = 30
        await own.update("T", {MQ})  # ...and later back: the group's committed offset is the truth
        assert hooks.started[-1].start_offset == 100
    asyncio.run(scenario())


def test_a_normal_handover_leaves_nothing_behind():
    async def scenario():
        broker, hooks, store, own = setup()
        await own.update("T", {MQ})
        store.update_offset(MQ, 340, increase_only=True)
        await own.update("T", set())  # released: drained, committed with the unlock
        await own.update("T", {MQ})
        assert hooks.started[-1].start_offset == 100  # what the broker says (here it never got the commit)
    asyncio.run(scenario())


def test_a_queue_of_a_deleted_and_recreated_topic_starts_where_the_group_would():
    async def scenario():
        broker, hooks, store, own = setup()
        await own.update("T", {MQ})
        store.update_offset(MQ, 340, increase_only=True)
        await own.lose(MQ, "fetch fenced: no owner epoch on this broker")  # the topic was deleted
        broker.epoch, broker.committed = 20, -1  # re-created: no offset, generation 0 again
        await own.update("T", {MQ})
        assert hooks.started[-1].start_offset == 0
        # ...and that start is committed at once, so a broker restart right after finds an offset.
        assert [(c.offset, c.owner_epoch) for c in broker.commits] == [(0, 20)]
    asyncio.run(scenario())


def test_kept_progress_counts_as_a_topic_until_the_topic_is_updated_without_the_queue():
    async def scenario():
        broker, hooks, store, own = setup()
        await own.update("T", {MQ})
        store.update_offset(MQ, 340, increase_only=True)
        await own.lose(MQ, "lock not renewed")
        assert own.assigned() == set() and own.topics() == {"T"}  # a fixed assign() still visits "T"
        await own.update("T", set())  # e.g. assign() without any queue of T
        assert own.topics() == set()
        broker.epoch = 30
        await own.update("T", {MQ})
        assert hooks.started[-1].start_offset == 100
    asyncio.run(scenario())
