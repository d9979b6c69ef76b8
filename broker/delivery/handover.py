"""QueueHandover: queues changing hands between the members of a group, as the broker serves it.

QueueLockManager (membership/locks.py) decides who holds a queue and with
which owner epoch and lock token. Around its decisions a hand-over needs more:
a LockQueues call may wait for a queue another client still holds; the new
owner learns where the group stands on the queue (its committed offset and
reset generation); the old owner's final commits are applied before its locks
go, so that nothing it consumed is read again; and every change of holder
(grant, unlock, expiry, a client gone) wakes the queue's waiters, so a parked
lock request is answered at once and a fetch stream serving the queue
re-checks its owner and stops feeding one that lost it.

The lock table is kept on disk across restarts (membership/lock_file.py): a
LockQueues call that made a grant is answered once the table with it is
saved and, on a master, held by its replicas in sync (`replicated`); releases
are saved soon after and sent to the replicas at once, neither awaited.

Apart from the controller because these rules are about one thing, who may
read a queue and from where, and need only the locks, the commits, the
waiters and whether pop consumes the group; the controller builds it and
hands it the client-gone events and the expiry timer.
Runs on the broker's event-loop thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tidemark.broker.delivery.waiters import QueueWaiters
from tidemark.broker.errors import BrokerError, FailedPreconditionError, FencedError
from tidemark.broker.membership.lock_file import LockFile
from tidemark.broker.membership.locks import LockGrant, QueueLockManager
from tidemark.broker.offsets import ConsumerOffsetManager, Fence
from tidemark.broker.offsets.commits import OffsetCommitService
from tidemark.common.logs import get_logger

log = get_logger("tidemark.broker")

# The longest a LockQueues call may wait for queues held by another client.
MAX_LOCK_WAIT_MS = 30_000


@dataclass(frozen=True, slots=True)
class HeldQueue:
    """A lock grant as the new owner needs it: with where the group stands on the queue."""

    grant: LockGrant
    consumer_offset: int
    reset_generation: int


@dataclass(frozen=True, slots=True)
class RefusedOffset:
    topic: str
    queue_id: int
    offset: int
    error: BrokerError


class QueueHandover:
    def __init__(self, *, locks: QueueLockManager, offsets: ConsumerOffsetManager, commits: OffsetCommitService,
                 hold: QueueWaiters, popped: Callable[[str], bool],
                 on_owners_changed: Callable[[str, int], None], saved: LockFile | None = None,
                 replicated: Callable[[], Awaitable[None]] | None = None) -> None:
        self._locks = locks
        self._saved = saved  # the lock table on disk (None: kept in memory only)
        self._replicated = replicated  # until the replicas in sync hold the table as it is now
        self._offsets = offsets
        self._commits = commits
        self._hold = hold
        self._popped = popped  # (group) -> whether pop consumes it (RocketMQ 5 clients): it has no queue owners
        self._on_owners_changed = on_owners_changed  # (group, queues that changed hands): the metric

    async def lock_queues(self, group: str, client_id: str, queues: list[tuple[str, int]],
                          wait_ms: int = 0, *, renew: bool = False) -> list[LockGrant]:
        """Grant or renew queue locks; when none of the queues another client holds is free yet, wait up
        to wait_ms for the first to be released. A group consumed by pop (RocketMQ 5 clients) has no
        queue owners: FailedPreconditionError.

        The wait ends the moment one of them is released (unlock, client gone, lock expiry all
        notify), so a handover costs no polling interval; the caller asks again for the rest. `renew`
        keeps the lock tokens of locks the client still holds (QueueLockManager.lock)."""
        if self._popped(group):
            raise FailedPreconditionError(f"group {group!r} is consumed by pop (RocketMQ 5 clients); queue "
                                          f"owners need a group of their own")
        changes = self._locks.changes
        grants = self._lock(group, client_id, queues, renew)
        granted = {(g.topic, g.queue_id) for g in grants}
        missing = [q for q in queues if q not in granted]
        deadline = asyncio.get_running_loop().time() + min(wait_ms, MAX_LOCK_WAIT_MS) / 1000
        while missing and not grants:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0 or not await self._hold.wait_any(missing, remaining):
                break
            grants = self._lock(group, client_id, missing, renew)
        if self._locks.changes != changes:  # a grant the broker would forget on a restart or a failover is not answered
            if self._saved is not None:
                await self._saved.save()
            if self._replicated is not None:
                await self._replicated()
        return grants

    def held_queue(self, group: str, grant: LockGrant) -> HeldQueue:
        """A grant with the queue's committed offset as of the grant (kept with it: `_lock`), and its reset
        generation."""
        offset = self._locks.start_offset(group, grant.topic, grant.queue_id, grant.lock_token)
        return HeldQueue(grant, self._offsets.query(group, grant.topic, grant.queue_id) if offset is None else offset,
                         self._offsets.reset_generation(group, grant.topic, grant.queue_id))

    def unlock_queues(self, group: str, client_id: str, queues: list[tuple[str, int]],
                      final_offsets: list[tuple[str, int, int, Fence | None]] = (),
                      tokens: dict[tuple[str, int], int] | None = None) -> list[RefusedOffset]:
        """Apply the final commits of queues being handed back, then release their locks.

        A queue whose final commit is fenced stays as it is (it is somebody else's now); any other
        refusal (an invalid offset) is reported and the queue is still released. `tokens` name the
        grants being released: a queue locked again since (a late unlock) keeps its new lock, and
        its final commit is refused (FencedError) so that it cannot move the new lease's offset."""
        refused: list[RefusedOffset] = []
        keep: set[tuple[str, int]] = set()
        for topic, queue_id, offset, fence in final_offsets:
            token = (tokens or {}).get((topic, queue_id), 0)
            try:
                if self._locks.superseded(group, client_id, topic, queue_id, token):
                    raise FencedError(f"queue {topic}:{queue_id} of group {group!r} was locked again after "
                                      f"the grant this final commit belongs to (lock token {token})")
                self._commits.commit(group, topic, queue_id, offset, fence, acknowledged=True)
            except BrokerError as e:
                refused.append(RefusedOffset(topic, queue_id, offset, e))
                if isinstance(e, FailedPreconditionError):
                    keep.add((topic, queue_id))
        released = self._locks.unlock(group, client_id, [q for q in queues if q not in keep], tokens)
        self._released(released)
        if released:  # (the other end of a handover: the next owner's lock_grant follows)
            log.info("queue locks released", event="lock_release", group=group, client_id=client_id,
                     queues=len(released))
        return refused

    def expire(self) -> None:
        """The timer's job: drop the locks nobody renewed in time."""
        expired = self._locks.expire()
        self._released([(lock.topic, lock.queue_id) for lock in expired])
        for lock in expired:
            log.info("queue lock expired",
                     event="lock_expire", group=lock.group, topic=lock.topic, queue_id=lock.queue_id,
                     client_id=lock.client_id, owner_epoch=lock.owner_epoch)

    def master_reached(self) -> None:
        """This broker is a replica that (re)connected to its master: the locks it granted meanwhile go.

        A replica grants locks to the clients that read from it while their master is unreachable. Once
        the master is back they go back to it, and let go of their queues there (where those grants are
        unknown); kept here, the grants would hold the queues from their next owners until they expired,
        and a promotion would make them the master's (the fault checker's failover scenario, seed 21912:
        a push queue unread for the lock's minute). Released, not forgotten: a client still reading here
        stays the owner (the epoch rule) and renews, unless another client is granted the queue first."""
        released = self._locks.release_all()
        self._released([(lock.topic, lock.queue_id) for lock in released])
        if released:
            log.info("queue locks granted while the master was away released", event="lock_release_stand_in",
                     groups=len({lock.group for lock in released}), queues=len(released))

    def client_gone(self, group: str, client_id: str) -> None:
        """A member left the group (or stopped sending heartbeats): its queues are free at once."""
        released = self._locks.release_client(group, client_id)
        self._released(released)
        if released:
            log.info("queue locks released",
                     event="lock_release", group=group, client_id=client_id, queues=len(released))

    def _released(self, queues: list[tuple[str, int]]) -> None:
        """Locks let go: their waiters are woken, and the table is saved soon (nobody waits for that)."""
        for topic, queue_id in queues:
            self._hold.notify(topic, queue_id)
        if queues and self._saved is not None:
            self._saved.save_soon()

    def _lock(self, group: str, client_id: str, queues: list[tuple[str, int]], renew: bool) -> list[LockGrant]:
        """Grant or renew queue locks; a queue that changed hands is re-checked by the streams serving it,
        so its previous owner stops receiving its messages at once."""
        locks = self._locks
        before = {q: locks.current_epoch(group, *q) for q in queues}
        held = {q for q in queues if locks.holder(group, *q) == client_id}
        # Each new grant keeps where the group stood on its queue: the grant's LockQueues answer tells the new
        # owner this offset, and a fetch handle opened ahead of the lock starts there (fetch.py), however late
        # its open or its next frame reaches the broker: by then the new owner may have committed (its own
        # start, when the grant said none), and the lock may have been let go and granted again (same epoch,
        # another answer). Kept before the notifies below, which wake the handles waiting for the grant.
        grants = locks.lock(group, client_id, queues, renew=renew,
                            start_offset=lambda topic, queue_id: self._offsets.query(group, topic, queue_id))
        changed = [g for g in grants if before.get((g.topic, g.queue_id)) != g.owner_epoch]
        for g in changed:
            log.info("queue lock granted",
                     event="lock_grant", group=group, topic=g.topic, queue_id=g.queue_id, client_id=client_id,
                     owner_epoch=g.owner_epoch)
        for g in grants:
            if (g.topic, g.queue_id) not in held:  # (also a fetch stream waiting for this client's lock)
                self._hold.notify(g.topic, g.queue_id)
        if changed:
            self._on_owners_changed(group, len(changed))
        return grants
