"""QueueOwnership: which queues this consumer works on, and how they change hands.

Zero-duplicate handover (CLUSTERING with queue_locking, the default):
- a queue that arrives is read only after this client holds its broker lock,
  starting from the committed offset read *after* the lock was granted (the
  previous owner committed before releasing, so that offset is fresh);
- a queue that leaves stops fetching, lets running batches finish (bounded by
  drain_timeout_s; an orderly queue stays locked until its listener call
  returns, as in RocketMQ, without holding up the rebalance), commits
  synchronously with its owner epoch, then unlocks;
  an unlock that failed (the broker unreachable) is asked again until the
  broker answers, or its next owner would wait for the lock to expire. Each
  unlock names the grant it releases (its lock token): one that arrives late,
  after the queue came back to this client, leaves the new lock and offset be.
These remove both causes of duplicates in RocketMQ's rebalance: two owners reading at once,
and a new owner reading an offset the old one had not committed yet.

A held lock is renewed every lock_renew_interval_s and counted on for half
the broker's lock expiry after each answered request (lock_renewal.py,
lock_hold.py): an orderly queue starts no batch past that.

A broker restart or a failover keeps the locks (the lock file, a replica's
copy); a broker without them (the file lost) makes the queues LOST, locked again, and each resumes
from its own progress when that is further along than the broker's committed
offset (the broker must have one) and no admin reset came in between
(kept_progress.py).

RocketMQ-style (queue_locking=False): no locks; a leaving queue is dropped at
once and its offset persisted without waiting for running batches.

What differs between a push and a lite pull consumer is left to its
OwnershipHooks (ownership_hooks.py), as RocketMQ's RebalanceImpl leaves computePullFromWhere,
dispatchPullRequest and removeUnnecessaryMessageQueue to its subclasses.

Queue set changes go through one asyncio.Lock, so rebalances, lock grants
and renewals never interleave; per-queue state changes go through
OwnedQueue.transition, and each generation of a queue is a QueueLease.
Lock requests are made outside that lock (one task per broker and batch of
queues, which alone asks for them until they are granted or go away), and
what they grant is started under it: a request waiting on its broker holds
up neither the consumer's other changes nor other topics' and brokers' grants.
Retried unlocks run outside that lock (a broker cut off must not hold up the
others' handovers): lock tokens, not the lock, keep them from undoing a grant.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from tidemark.client.consumer.final_unlocks import FinalUnlocks
from tidemark.client.consumer.kept_progress import KeptProgress, resume_offset
from tidemark.client.consumer.lease import QueueLease
from tidemark.client.consumer.lock_renewal import LockRenewal
from tidemark.client.consumer.offset_store import OffsetStore
from tidemark.client.consumer.ownership_hooks import OwnershipHooks
from tidemark.client.consumer.pending_unlocks import LOCK_RETRY_DELAY_S, PendingUnlocks
from tidemark.client.consumer.queue_state import OwnedQueue, QueueState, by_broker
from tidemark.client.errors import FencedError, TidemarkError
from tidemark.client.message import MessageQueue
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.common.logs import get_logger
from tidemark.common.scheduler import TaskSet

log = get_logger("tidemark.client.ownership")

# How long one LockQueues call waits on the broker for a previous owner to let go.
LOCK_WAIT_MS = 5_000
# How long the first LockQueues of queues that arrive waits for a release (a handover under way): the
# rebalance pass that took them waits for these answers (all its topics' and brokers' at once, `settle`);
# past it a waiting request asks on (LOCK_WAIT_MS).
FIRST_LOCK_WAIT_MS = 100
# (LOCK_RETRY_DELAY_S, from pending_unlocks.py: the pause before asking again after a broker could not be
# asked at all, or a granted queue could not start.)


class QueueOwnership:
    def __init__(self, *, cluster: BrokerCluster, group: str, client_id: str, offset_store: OffsetStore,
                 locking: bool, hooks: OwnershipHooks, on_acquired: Callable[[], None] = lambda: None) -> None:
        self._cluster = cluster
        self._group = group
        self._client_id = client_id
        self._store = offset_store
        self.locking = locking
        self._hooks = hooks
        # Called when queues start outside update() (a lock granted after a wait): the consumer heartbeats
        # them at once, as it does after a rebalance changed its queues, instead of at its next tick.
        self._on_acquired = on_acquired
        self._queues: dict[MessageQueue, OwnedQueue] = {}
        self._lock = asyncio.Lock()
        # Lock requests (made outside the ownership lock): one task per broker and batch of queues asked
        # for together, which alone asks for them (or pauses before it asks again) until they are granted
        # or go away; and the first requests of queues that update() took, which settle() waits for.
        self._lock_waiters = TaskSet("lock_waiter_failed", "lock waiter failed", log, group=group)
        self._first: set[asyncio.Task] = set()
        # Progress of queues lost (not handed over), for their next lease: see kept_progress.py.
        self._kept: dict[MessageQueue, KeptProgress] = {}
        self._stopping = False  # stop() ran: failed unlocks are not asked again in the background
        # Final commits and unlocks of queues leaving together go in one call per broker.
        self._finals = FinalUnlocks(cluster, group, client_id)
        # Releases of orderly queues kept past the drain while their listener calls run (_release_when_idle).
        self._keepers = TaskSet("release_failed", "release of a kept queue failed", log, group=group)
        # Queues handed back whose unlock failed (a partition, a timeout): until the broker hears of it,
        # the next owner waits for the lock to expire (60 s) though we let go. Asked again, per broker.
        self._unlocks = PendingUnlocks(self._finals, group, lock=self._lock, ours=self._queues.__contains__,
                                       stopping=lambda: self._stopping)
        # The newest grant to this client seen per queue, (owner epoch, lock token): two lock calls for one
        # queue can both be granted (a waiter asking for a queue that went away and came back, beside the
        # new OwnedQueue's own call), and the broker keeps only the later grant's token (_quote).
        self._grants: dict[MessageQueue, tuple[int, int]] = {}
        self._renewal = LockRenewal(cluster=cluster, group=group, client_id=client_id, lock=self._lock,
                                    queues=self._queues, lose=self._lose, quote=self._quote,
                                    release_stale=self._release_stale, stopping=lambda: self._stopping)
        self.handovers = 0

    # -- views -----------------------------------------------------------------

    @property
    def pending_unlocks(self) -> int:
        """Queues handed back whose unlock failed and is being asked again."""
        return len(self._unlocks)

    @property
    def unlock_retries(self) -> int:
        """UnlockQueues calls asked again."""
        return self._unlocks.retries

    def get(self, mq: MessageQueue) -> OwnedQueue | None:
        return self._queues.get(mq)

    def queues(self, topic: str | None = None) -> list[OwnedQueue]:
        return [oq for mq, oq in self._queues.items() if topic is None or mq.topic == topic]

    def assigned(self, topic: str | None = None) -> set[MessageQueue]:
        """Queues this client has taken on (in any state but released/lost)."""
        return {oq.mq for oq in self.queues(topic)}

    def topics(self) -> set[str]:
        """Topics this client holds queues or kept progress of: the ones update() must still visit
        (update(topic, set()) drops both)."""
        return {mq.topic for mq in self._queues} | {mq.topic for mq in self._kept}

    def pulling(self) -> list[MessageQueue]:
        return sorted(oq.mq for oq in self._queues.values() if oq.state is QueueState.PULLING)

    def leases(self) -> list[QueueLease]:
        return [oq.lease for oq in self._queues.values() if oq.pulling and oq.lease is not None]

    def current(self, lease: QueueLease) -> bool:
        """Whether a lease is its queue's current one (PULLING or DRAINING)."""
        oq = self._queues.get(lease.mq)
        return oq is not None and oq.current(lease)

    # -- changes ---------------------------------------------------------------

    async def update(self, topic: str, target: set[MessageQueue]) -> bool:
        """Make the queues of a topic equal to target; True if anything changed. With locking, queues that
        arrive are asked for in the background: settle() waits for those first answers."""
        async with self._lock:
            current = {mq for mq in self._queues if mq.topic == topic}
            removed, added = current - target, target - current
            for mq in [mq for mq in self._kept if mq.topic == topic and mq not in target]:
                del self._kept[mq]  # another consumer's now: its commits are the group's progress
            if removed:
                await asyncio.gather(*(self._release(self._queues[mq]) for mq in sorted(removed)))
            for mq in sorted(added):
                pending = self._unlocks.take(mq)  # ours again: an old unlock must not release the new lock
                if pending is not None and pending.commit is not None:
                    # ...but its final commit, which the broker may never have had, is this client's
                    # progress: the new lease resumes from it as from a lost queue's (kept_progress.py).
                    commit = pending.commit
                    kept = self._kept.get(mq)
                    if kept is None or kept.offset < commit.offset:
                        self._kept[mq] = KeptProgress(commit.offset, commit.reset_generation)
                self._queues[mq] = OwnedQueue(mq)
            if added:
                await self._acquire([self._queues[mq] for mq in sorted(added)])
            return bool(removed or added)

    async def restart(self, lease: QueueLease, offset: int, reset_generation: int | None, *,
                      record: bool) -> QueueLease | None:
        """Continue a queue from `offset` under a new lease (seek, admin reset, illegal offset).

        Whatever the old lease had fetched or was consuming no longer counts; `record` makes
        `offset` the queue's progress in the offset store (the broker said where to continue; a
        lite pull seek leaves commits to the application). Returns the new lease, or None when
        `lease` is not the queue's current PULLING lease any more."""
        oq = self._queues.get(lease.mq)
        if oq is None or oq.lease is not lease or not oq.pulling:
            return None
        new = lease.successor(offset, reset_generation)
        oq.replace_lease(new)
        self._lease_ended(lease)
        try:
            self._store.bind(new, offset if record else None)
            await self._hooks.lease_started(new)
        except Exception as e:
            await self._not_started(oq, e)
            return None
        return new

    async def settle(self) -> None:
        """Until the first lock requests of the queues update() took are answered and what they granted
        has started (each waits up to FIRST_LOCK_WAIT_MS on its broker for a release, all at once)."""
        while self._first:
            await asyncio.wait(set(self._first))

    def _ask(self, oqs: Iterable[OwnedQueue], *, wait_ms: int, pause_s: float = 0.0, first: bool = False) -> None:
        """Ask for LOCKING queues (after `pause_s`): one task per broker, which owns them until granted."""
        for broker, group in by_broker(list(oqs)).items():
            task = self._lock_waiters.spawn(self._ask_on(broker, group, wait_ms, pause_s, first=first),
                                            name=f"lock:{broker}")
            if task is not None and first:  # (None: stopped, nothing is asked for any more)
                self._first.add(task)
                task.add_done_callback(self._first.discard)

    def _locking(self, oq: OwnedQueue) -> bool:
        return self._queues.get(oq.mq) is oq and oq.state is QueueState.LOCKING

    async def _ask_on(self, broker: str, oqs: list[OwnedQueue], wait_ms: int, pause_s: float, *,
                      first: bool) -> None:
        """One LockQueues (waiting up to wait_ms on the broker for a release) outside the ownership lock, the
        grants started under it, then the next request for what is still LOCKING: at once for queues not
        granted (a grant of a queue we no longer want still ended a wait), after a pause for a queue whose
        start offset could not be read, and for all when the broker granted nothing (a wait that ran out,
        a broker that could not be asked)."""
        if pause_s:
            await asyncio.sleep(pause_s)
        asked = [oq for oq in oqs if self._locking(oq)]
        if not asked:
            return
        asked_on = False
        try:
            granted, answered = await self._lock_on(broker, asked, wait_ms=wait_ms)
            async with self._lock:
                granted = [oq for oq in granted if self._locking(oq)]
                # Each start reads the queue's committed offset: do them concurrently. (All of them end before
                # the lock is let go, whatever one raises: a start that raised is asked again after a pause.)
                started = await asyncio.gather(*(self._start(oq) for oq in granted), return_exceptions=True)
            for oq, outcome in zip(granted, started, strict=True):
                if isinstance(outcome, BaseException):
                    log.error("queue start failed", event="queue_start_failed", group=self._group, queue=oq.mq,
                              exc_info=outcome)
            failed = {oq for oq, ok in zip(granted, started, strict=True) if ok is not True}
            rest = [oq for oq in asked if self._locking(oq) and oq not in failed]
            # After a first request (its short wait ran out, or its broker could not be asked) the waiting
            # request goes at once.
            self._ask(rest, wait_ms=LOCK_WAIT_MS, pause_s=0.0 if answered or first else LOCK_RETRY_DELAY_S)
            self._ask([oq for oq in failed if self._locking(oq)], wait_ms=LOCK_WAIT_MS, pause_s=LOCK_RETRY_DELAY_S)
            asked_on = True
        finally:
            if not asked_on:
                # Ended early, whatever by (a defect): this task alone asks for its queues, so those still
                # LOCKING are asked again after the pause, or nobody would ever ask for them. (Cancelled by
                # stop(): nothing is asked for any more, _ask spawns nothing.)
                self._ask([oq for oq in asked if self._locking(oq)], wait_ms=LOCK_WAIT_MS, pause_s=LOCK_RETRY_DELAY_S)
        if not first and any(oq.state is QueueState.PULLING for oq in granted):
            self._on_acquired()  # (a first request's grants are told by the rebalance pass that settles them)

    async def stop(self) -> None:
        """Stop waiting for locks and asking again for failed unlocks (before release_all at shutdown;
        leaving the group then releases every lock this client holds). Unlocks that failed are asked once
        more by release_all, beside the final calls: their final commits would be lost otherwise."""
        self._stopping = True
        await self._renewal.close()
        await self._lock_waiters.close()
        await self._unlocks.close()

    async def renew_locks(self) -> None:
        """Renew every held lock; a queue whose lock was not renewed is lost (lock_renewal.py)."""
        if self.locking:
            await self._renewal.renew()

    def lock_lapsed(self, lease: QueueLease, then: Callable[[], None]) -> None:
        """An orderly batch found its queue's lock lapsed on this client's clock: have it confirmed in the
        background, then call `then` (LockRenewal.lapsed)."""
        self._renewal.lapsed(lease, then)

    async def lose(self, mq: MessageQueue, reason: str) -> None:
        async with self._lock:
            oq = self._queues.get(mq)
            if oq is not None:
                self._lose(oq, reason)

    def lose_lease(self, lease: QueueLease, reason: str) -> None:
        """The broker refused a lease (fenced): its queue is lost, unless the lease is stale already."""
        oq = self._queues.get(lease.mq)
        if oq is not None and oq.lease is lease:
            self._lose(oq, reason)

    async def release_all(self) -> None:
        """Hand every queue back; also completes releases a cancelled rebalance had started. After stop()
        (shutdown) nothing asks again in the background: the unlocks that failed before are asked beside
        the final calls, all with the full request time and at once, and what fails then is asked once more
        (pending_unlocks.py, `last_sweep`), whatever one release raised."""
        try:
            async with self._lock:
                earlier = [self._unlocks.sweep()] if self._stopping else []
                outcomes = await asyncio.gather(*earlier, *(self._release(oq) for oq in list(self._queues.values())),
                                                return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    log.error("release failed", event="release_failed", group=self._group, exc_info=outcome)
        finally:
            if self._stopping:
                await self._keepers.close()  # (waited for above: cancels only what a failure left)
                await self._unlocks.last_sweep()
                await self._finals.close()

    # -- internals -------------------------------------------------------------

    async def _acquire(self, oqs: list[OwnedQueue]) -> None:
        if self.locking:
            for oq in oqs:
                oq.transition(QueueState.LOCKING)
            self._lock_and_start(oqs)
        else:
            for oq in oqs:
                await self._start(oq)

    def _lock_and_start(self, oqs: Iterable[OwnedQueue]) -> None:
        # A queue that arrives is mostly being handed over at this moment: its previous owner heard of the
        # same change and its unlock is on the way. Asked without a wait, the request often reached the
        # broker just before the release, was refused, and the waiting request went only after that
        # answer (a round trip lost in a join). A short wait is answered at the release instead. It runs
        # outside the ownership lock, each broker's beside the others' (settle() waits for them).
        self._ask(oqs, wait_ms=FIRST_LOCK_WAIT_MS, first=True)

    async def _lock_on(self, broker: str, oqs: list[OwnedQueue], *,
                       wait_ms: int) -> tuple[list[OwnedQueue], bool]:
        """Lock queues of one broker: the granted ones still wanted (owner epoch set), and whether the
        broker granted anything at all."""
        sent_at = time.monotonic()
        try:
            conn = await self._cluster.connection(broker)
            # Given up when the master moves meanwhile: the queues are locked where it is now instead.
            grants = await self._cluster.moves.until(broker, conn.lock_queues(
                self._group, self._client_id, [oq.mq for oq in oqs], wait_ms=wait_ms))
        except Exception as e:  # (not only TidemarkError: whatever it was, the queues are asked again)
            _log_failure("queue lock failed", "lock_failed", e, group=self._group, broker=broker)
            return [], False
        by_mq = {g.queue: g for g in grants}
        granted: list[OwnedQueue] = []
        stale: dict[MessageQueue, int] = {}
        for oq in oqs:
            grant = by_mq.get(oq.mq)
            if grant is None:
                continue
            token = self._quote(oq.mq, grant.owner_epoch, grant.lock_token)
            if oq.state is not QueueState.LOCKING or self._queues.get(oq.mq) is not oq:
                # Released while we waited: let the next owner have it, unless the queue came back to
                # us meanwhile (a newer OwnedQueue holds or asks for this very lock: leave it be, and
                # quote the newest grant when it lets go, or the broker keeps the lock till it expires).
                current = self._queues.get(oq.mq)
                if current is None or current.state is QueueState.RELEASED:
                    stale[oq.mq] = token
                elif current.owner_epoch == grant.owner_epoch:
                    current.lock_token = token
                    current.hold.confirm(sent_at, grant.lock_expiry_ms)
                continue
            oq.owner_epoch = grant.owner_epoch
            oq.lock_token = token
            oq.hold.confirm(sent_at, grant.lock_expiry_ms)
            oq.granted_at = (grant.consumer_offset, grant.reset_generation)
            log.info("queue lock granted",
                     event="lock_grant", group=self._group, queue=oq.mq, owner_epoch=grant.owner_epoch)
            granted.append(oq)
        await self._release_stale(broker, stale)
        return granted, bool(grants)

    async def _release_stale(self, broker: str, stale: dict[MessageQueue, int]) -> None:
        """Unlock grants made to this client that it does not want (queue -> lock token), so that the
        queues' next owner need not wait for them to expire; asked again when that fails."""
        if not stale:
            return
        try:
            conn = await self._cluster.connection(broker)
            await conn.unlock_queues(self._group, self._client_id, list(stale), tokens=list(stale.values()))
        except Exception as e:  # (whatever it was: asked again, and the queues granted beside start)
            _log_failure("unlock failed", "unlock_failed", e, group=self._group, broker=broker)
            for mq, token in stale.items():
                self._unlocks.add(mq, None, token, e)

    async def _start(self, oq: OwnedQueue) -> bool:
        """Start reading a queue from its start offset; False when that offset could not be read."""
        mq = oq.mq
        self._store.remove_offset(mq)  # RocketMQ's removeDirtyOffset: never trust a stale local value
        committed = None
        if oq.granted_at is not None:
            committed, generation = oq.granted_at
            self._store.preload(mq, committed, generation)
        try:
            offset = await self._hooks.start_offset(mq, committed)
        except Exception as e:  # (a defect as much as a broker's refusal: the queue must not stay stuck)
            _log_failure("cannot read start offset", "start_offset_failed", e, group=self._group, queue=mq)
            if oq.state is QueueState.ASSIGNED:
                # Without locks there is nothing to wait for: try again at the next rebalance.
                oq.transition(QueueState.RELEASED)
                del self._queues[mq]
            return False
        if self._queues.get(mq) is not oq or oq.state not in (QueueState.ASSIGNED, QueueState.LOCKING):
            return True  # released or lost while the offset was read
        generation = self._store.generation(mq)
        kept = self._kept.pop(mq, None)
        resumed = resume_offset(offset, committed, generation, kept)
        lease = QueueLease(mq, client_id=self._client_id, owner_epoch=oq.owner_epoch,
                           reset_generation=generation, start_offset=resumed, lock=oq.hold if self.locking else None)
        try:
            oq.transition(QueueState.PULLING)
            oq.replace_lease(lease)
            self._store.bind(lease)
            if resumed != offset:
                log.info("queue resumed from this client's own progress", event="queue_resumed",
                         group=self._group, queue=mq, offset=resumed, broker_offset=offset,
                         owner_epoch=oq.owner_epoch)
                self._store.update_offset(mq, resumed, increase_only=False)
            elif self._hooks.commit_start_offset and self._store.read_memory(mq) < 0:
                self._store.update_offset(mq, offset, increase_only=False)
            await self._hooks.lease_started(lease)
        except Exception as e:
            await self._not_started(oq, e)
            return True
        # A resumed queue, and a queue the broker had no offset for: tell the broker at once. Without
        # the latter, a broker restart before our first timed commit would find no committed offset,
        # and kept progress is never trusted then (kept_progress.py): everything read so far again.
        if resumed != offset or (self._hooks.commit_start_offset and committed is not None and committed < 0):
            await self._recommit(mq)
        return True

    async def _recommit(self, mq: MessageQueue) -> None:
        """Tell the broker where a resumed queue stands, under the new lease's fence (a broker that just
        restarted has only its older offset; the next restart would send us back there)."""
        try:
            await self._store.persist(mq)
        except TidemarkError as e:
            log.warning("re-commit of resumed progress failed",
                        event="resume_commit_failed", group=self._group, queue=mq, error=e)

    async def _release(self, oq: OwnedQueue) -> None:
        if oq.state in (QueueState.ASSIGNED, QueueState.LOCKING):
            had_lock = oq.owner_epoch is not None
            oq.transition(QueueState.RELEASED)
            self._forget(oq)
            if had_lock:  # granted, but starting failed: do not leave the next owner waiting for expiry
                await self._release_stale(oq.mq.broker_name, {oq.mq: oq.lock_token})
            return
        if oq.state is QueueState.PULLING:
            oq.transition(QueueState.DRAINING)
            oq.release_task = asyncio.get_running_loop().create_task(self._finish_release(oq),
                                                                     name=f"release:{oq.mq}")
        while (task := oq.release_task) is not None:
            if oq.kept and not self._stopping:
                return  # handed back when its orderly listener call returns (_release_when_idle)
            await asyncio.wait((task,))  # (shielded: a cancelled caller leaves the release running)
            if not task.cancelled():  # (cancelled by someone else: not this caller's cancellation)
                task.result()
            if oq.release_task is task:  # (else kept past the drain: at shutdown, waited for too)
                return

    async def _finish_release(self, oq: OwnedQueue) -> None:
        """DRAINING -> RELEASED: stop fetching, drain, commit, unlock."""
        lease = oq.lease
        if not self.locking:
            # RocketMQ-style: persist what is known now; running batches are not waited for.
            self._lease_ended(lease)
            await self._persist_quietly(oq)
            if oq.state is QueueState.DRAINING:
                oq.transition(QueueState.RELEASED)
                self._forget(oq)
            return
        drained = await self._drain(oq, lease)
        if drained and lease.running and self._hooks.orderly and oq.state is QueueState.DRAINING and not self._stopping:
            # RocketMQ's rule for orderly queues: kept while a listener call runs, or the next owner would
            # call its listener with the queue's messages beside it. The wait goes on outside this task, so
            # that the rebalance waiting for it goes on too (and renewals, which keep the lock, with it).
            oq.kept = True
            oq.release_task = self._keepers.spawn(self._release_when_idle(oq, lease), name=f"kept:{oq.mq}")
            return
        await self._hand_back(oq, lease)

    async def _release_when_idle(self, oq: OwnedQueue, lease: QueueLease) -> None:
        """An orderly queue whose listener call outlived drain_timeout_s: drained again and again (each
        round up to drain_timeout_s; at shutdown one more round at most), then handed back under the
        ownership lock, as a rebalance does, and the consumer rebalances (the queue may have come back)."""
        log.warning("an orderly listener call outlived the drain: its queue stays locked until it returns",
                    event="drain_kept", group=self._group, queue=oq.mq, owner_epoch=oq.owner_epoch)
        while lease.running and oq.state is QueueState.DRAINING and not self._stopping:
            if not await self._drain(oq, lease):
                break
        if self._stopping:  # (nothing changes queues after stop() but release_all, which waits for this)
            await self._hand_back(oq, lease)
            return
        async with self._lock:
            await self._hand_back(oq, lease)
        self._hooks.queue_lost(oq.mq)

    async def _drain(self, oq: OwnedQueue, lease: QueueLease) -> bool:
        """One drain (up to drain_timeout_s); False when the hook raised (a defect), taken as a drain that timed
        out: raising out of the release left the queue DRAINING, its lock renewed for good, nothing committed."""
        try:
            await self._hooks.lease_draining(lease)
            return True
        except Exception as e:
            _log_failure("drain failed", "drain_failed", e, group=self._group, queue=oq.mq)
            return False

    async def _hand_back(self, oq: OwnedQueue, lease: QueueLease) -> None:
        """A drained queue's final commit and unlock: RELEASED, or LOST when the commit was fenced."""
        if oq.state is not QueueState.DRAINING:
            return  # lost meanwhile (lock renewal failed): nothing of ours to commit
        # The final commit and the unlock in one call: the next owner may start the moment it returns.
        refused = await self._unlocks.hand_back(oq.mq, self._store.commit_for(oq.mq), oq.lock_token)
        for error in refused:
            if isinstance(error, FencedError):
                self._lose(oq, f"final commit fenced: {error}")
                return
            log.warning("final commit refused",
                        event="final_commit_failed", group=self._group, queue=oq.mq, error=error)
        if oq.state is QueueState.DRAINING:
            oq.transition(QueueState.RELEASED)
            self._lease_ended(lease)
            self.handovers += 1
            self._forget(oq)

    def _lease_ended(self, lease: QueueLease) -> None:
        """A release's lease_ended: a hook that raises (a defect) is logged, and the release goes on. Raising
        out of it left the queue RELEASED (or DRAINING) among the owned ones: no rebalance took it again, and
        each one that let it go raised once more."""
        try:
            self._hooks.lease_ended(lease)
        except Exception:
            log.exception("lease_ended failed", event="lease_ended_failed", group=self._group, queue=lease.mq)

    async def _not_started(self, oq: OwnedQueue, error: Exception) -> None:
        """Nothing fetches for the queue's new lease (starting it raised): let the queue go rather than hold
        it PULLING unread, unlock it by its token at once (its next owner need not wait for the lock to
        expire), and tell the consumer after LOCK_RETRY_DELAY_S, not at once: the same fault again would
        make a loop of rebalance, lock, start and loss with no pause."""
        log.error("queue could not start", event="queue_start_failed", group=self._group, queue=oq.mq,
                  exc_info=error)
        held = self.locking and oq.state is QueueState.PULLING and oq.owner_epoch is not None
        self._lose(oq, f"start failed: {error!r}", tell=False)  # (LOCKING: its unlock is asked by _lose)
        if held:
            await self._release_stale(oq.mq.broker_name, {oq.mq: oq.lock_token})
        self._lock_waiters.spawn(self._lost_later(oq.mq), name=f"lost:{oq.mq}")

    async def _lost_later(self, mq: MessageQueue) -> None:
        await asyncio.sleep(LOCK_RETRY_DELAY_S)
        self._hooks.queue_lost(mq)

    async def _persist_quietly(self, oq: OwnedQueue) -> None:
        try:
            await self._store.persist(oq.mq)
        except TidemarkError as e:
            log.warning("offset persist on drop failed",
                        event="drop_persist_failed", group=self._group, queue=oq.mq, error=e)

    def _lose(self, oq: OwnedQueue, reason: str, *, tell: bool = True) -> None:
        if oq.state in (QueueState.RELEASED, QueueState.LOST):
            return
        log.warning("queue ownership lost",
                    event="queue_lost", group=self._group, queue=oq.mq, owner_epoch=oq.owner_epoch, reason=reason)
        lease = oq.lease
        progress = self._store.read_memory(oq.mq)
        if self.locking and lease is not None and progress >= 0:
            self._kept[oq.mq] = KeptProgress(progress, lease.reset_generation)
        if oq.state is QueueState.LOCKING and oq.owner_epoch is not None and self.locking:
            # Granted but not started (its lock request's task has yet to take the ownership lock): the
            # broker holds the lock for us, and the queue's next owner would wait for it to expire.
            self._unlocks.add(oq.mq, None, oq.lock_token)
        oq.transition(QueueState.LOST)
        if lease is not None:
            self._lease_ended(lease)
        self._forget(oq)
        if tell:
            self._hooks.queue_lost(oq.mq)

    def _quote(self, mq: MessageQueue, owner_epoch: int, token: int) -> int:
        """The lock token to quote for `mq` after a grant of `token`: the newest grant of the same ownership
        (owner epoch) seen so far. The broker draws tokens in order and keeps the last grant's, so when
        two calls of ours were granted, the one answered last is not always the one it holds."""
        seen = self._grants.get(mq)
        if seen is not None and seen[0] == owner_epoch and seen[1] > token:
            return seen[1]
        self._grants[mq] = (owner_epoch, token)
        return token

    def _forget(self, oq: OwnedQueue) -> None:
        self._store.remove_offset(oq.mq)
        if self._queues.get(oq.mq) is oq:
            del self._queues[oq.mq]


def _log_failure(message: str, event: str, error: Exception, **fields: object) -> None:
    """A broker's refusal or an outage (TidemarkError) as a warning; anything else, a defect, with its
    traceback."""
    if isinstance(error, TidemarkError):
        log.warning(message, event=event, error=error, **fields)
    else:
        log.error(message, event=event, exc_info=error, **fields)
