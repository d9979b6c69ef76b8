"""Queue ownership locks with owner epochs (RocketMQ's RebalanceLockManager, plus fencing).

Orderly consumers and the zero-duplicate handover lock the queues they consume.
A lock lives `expiry_ms` (60 s, RocketMQ's REBALANCE_LOCK_MAX_LIVE_TIME) unless
renewed. Each grant carries an owner epoch; commits and pulls quote it so the
broker can reject a client that lost the queue (see ConsumerOffsetManager).

Epoch rule: the epoch changes only when the queue passes to a different client.
A renewal, or a re-grant to the last holder after its lock expired or was
released with nobody else in between, keeps the epoch: that client's earlier
commits cannot conflict with anybody's, so fencing them would only cost it a
needless re-read. Epoch history outlives expiry and release for the same
reason: `current_epoch` must keep answering after the holder is gone, so that a
late commit from an owner that was replaced is still recognised as stale.

Lock tokens name grants, not owners. The epoch rule lets one client hold a
queue, let go of it and take it again under the same epoch; an unlock of the
first grant that arrives late (a retry after a partition) must not release the
second. So every acquisition draws a new token, a renewal (`renew=True`, the
holder extending its own live lock) keeps it, and an unlock quoting a token
releases only that grant.

The table outlives a restart (lock_file.py keeps it in queueLocks.json):
`snapshot` gives every queue's last grant, `restore` takes them back at start,
each lock that was held held again for half the expiry (see `restore`), and
`changes` counts what a saved table must follow (grants and releases, not
renewals of a live grant).

Pure domain module: no grpc, no I/O. Called from the broker's event-loop thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from tidemark.broker.errors import FencedError
from tidemark.broker.membership.epoch import EpochSequence

DEFAULT_LOCK_EXPIRY_MS = 60_000


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class LockGrant:
    """A queue now held by the requesting client, with the epoch it must quote."""

    topic: str
    queue_id: int
    owner_epoch: int
    expire_timestamp: int  # wall clock, ms since the epoch; for the client and for logs
    lock_token: int  # this grant's name, for its unlock
    expiry_ms: int = DEFAULT_LOCK_EXPIRY_MS  # how long the lock lives without a renewal


@dataclass(frozen=True, slots=True)
class LockInfo:
    """One lock as seen by admin tools and logs."""

    group: str
    topic: str
    queue_id: int
    client_id: str
    owner_epoch: int
    expire_timestamp: int
    live: bool


@dataclass(frozen=True, slots=True)
class SavedLock:
    """One queue's last grant as a lock file keeps it (no clock: a restored lock's time starts anew)."""

    group: str
    topic: str
    queue_id: int
    client_id: str
    owner_epoch: int
    token: int
    held: bool
    start_offset: int | None = None


@dataclass(frozen=True, slots=True)
class _QueueLock:
    """The last grant of one queue. Replaced on every change, never mutated."""

    client_id: str  # the last holder, kept after expiry/release for the epoch rule
    owner_epoch: int
    token: int  # the grant's lock token: new on every acquisition, kept by renewals
    held: bool  # False once released or reaped by expire(); the record stays as history
    expires_at: float  # on the injected monotonic clock, seconds
    expire_timestamp: int  # wall clock ms, reported only
    # Where the group stood on the queue when this grant was made (its committed offset, -1: none), as the
    # grant's answer told its holder; None when the caller did not say (`lock`'s start_offset).
    start_offset: int | None = None

    def is_live(self, now: float) -> bool:
        return self.held and now < self.expires_at


QueueKey = tuple[str, int]  # (topic, queue_id)


class QueueLockManager:
    """Per-group queue locks and owner epochs for one broker process."""

    def __init__(
        self,
        *,
        epochs: EpochSequence,
        tokens: EpochSequence | None = None,
        expiry_ms: int = DEFAULT_LOCK_EXPIRY_MS,
        clock: Callable[[], float] = time.monotonic,
        wall_clock_ms: Callable[[], int] = _wall_clock_ms,
    ) -> None:
        if expiry_ms <= 0:
            raise ValueError(f"lock expiry must be positive, got {expiry_ms} ms")
        self._epochs = epochs
        # Seeded with the wall clock like epochs, so a token of an earlier broker process never names
        # a grant of this one.
        self._tokens = tokens if tokens is not None else EpochSequence()
        self._expiry_ms = int(expiry_ms)
        # Expiry is judged on a monotonic clock so a wall-clock step cannot
        # free (or pin) every lock at once; the wall clock is only reported.
        self._clock = clock
        self._wall_clock_ms = wall_clock_ms
        self._groups: dict[str, dict[QueueKey, _QueueLock]] = {}
        self.changes = 0  # grants and releases so far (a renewal of a live grant is none): what a saved table follows

    # -- grant and release -------------------------------------------------

    def lock(
        self, group: str, client_id: str, queues: Iterable[tuple[str, int]], *, renew: bool = False,
        start_offset: Callable[[str, int], int] | None = None,
    ) -> list[LockGrant]:
        """Grant or renew locks; return only the queues now held by `client_id`.

        A queue is granted when it is unlocked, its lock expired, or `client_id`
        already holds it (then the expiry is extended). A queue held live by
        another client is left out of the answer, as RocketMQ's lockBatchMQ does.
        A grant keeps its lock token only when `renew` and `client_id` still
        holds the lock; otherwise it is a new grant with a new token.
        `start_offset(topic, queue_id)`, read once per new grant (a renewal keeps
        its grant's), is kept with the grant (`start_offset` below).
        """
        now = self._clock()
        expires_at = now + self._expiry_ms / 1000.0
        expire_timestamp = self._wall_clock_ms() + self._expiry_ms
        table = self._groups.get(group)
        grants: list[LockGrant] = []
        seen: set[QueueKey] = set()
        for topic, queue_id in queues:
            key = (topic, queue_id)
            if key in seen:
                continue
            seen.add(key)
            current = table.get(key) if table is not None else None
            if current is not None and current.client_id != client_id and current.is_live(now):
                continue
            if current is not None and current.client_id == client_id:
                epoch = current.owner_epoch
            else:
                epoch = self._epochs.next()
            if renew and current is not None and current.client_id == client_id and current.held:
                token, start = current.token, current.start_offset
            else:
                token = self._tokens.next()
                start = start_offset(topic, queue_id) if start_offset is not None else None
                self.changes += 1
            if table is None:
                table = self._groups.setdefault(group, {})
            table[key] = _QueueLock(client_id, epoch, token, True, expires_at, expire_timestamp, start)
            grants.append(LockGrant(topic, queue_id, epoch, expire_timestamp, token, self._expiry_ms))
        return grants

    def unlock(
        self, group: str, client_id: str, queues: Iterable[tuple[str, int]],
        tokens: Mapping[tuple[str, int], int] | None = None,
    ) -> list[tuple[str, int]]:
        """Release the given queues that `client_id` holds; return those released.

        Queues held by someone else are left alone, and so is a queue whose token
        in `tokens` (0 or absent: any) names an earlier grant than the current one.
        The epoch history is kept.
        """
        table = self._groups.get(group)
        released: list[QueueKey] = []
        if table is None:
            return released
        for topic, queue_id in queues:
            key = (topic, queue_id)
            current = table.get(key)
            if current is not None and current.held and current.client_id == client_id \
                    and not _superseded(current, tokens.get(key, 0) if tokens else 0):
                table[key] = replace(current, held=False)
                released.append(key)
        self.changes += len(released)
        return released

    def superseded(self, group: str, client_id: str, topic: str, queue_id: int, token: int) -> bool:
        """Whether `token` (0: none) names an earlier grant to `client_id` than the queue's latest, which
        went to `client_id` too (a grant to another client since is fenced by its epoch instead)."""
        current = self._get(group, topic, queue_id)
        return current is not None and current.client_id == client_id \
            and _superseded(current, token)

    def release_client(self, group: str, client_id: str) -> list[tuple[str, int]]:
        """Release every queue of `group` that `client_id` holds (client unregistered)."""
        table = self._groups.get(group)
        if table is None:
            return []
        mine = sorted(key for key, lk in table.items() if lk.held and lk.client_id == client_id)
        return self.unlock(group, client_id, mine)

    def release_all(self) -> list[LockInfo]:
        """Release every held lock, of every group, and return them (for the waiters and the log): a replica
        whose master is back gives up the grants it made while standing in (QueueHandover.master_reached).
        The epoch history is kept, so each holder stays the owner until the queue is granted to another."""
        return self._release(lambda lk, now: True)

    def expire(self) -> list[LockInfo]:
        """Drop locks whose time ran out and return them (for logging).

        Only the "held" mark goes: the last holder and epoch stay as history.
        """
        return self._release(lambda lk, now: not lk.is_live(now))

    def _release(self, which: Callable[[_QueueLock, float], bool]) -> list[LockInfo]:
        """Release the held locks `which` picks (given the clock's now); return them, sorted."""
        now = self._clock()
        released: list[LockInfo] = []
        for group, table in self._groups.items():
            for key, current in table.items():
                if current.held and which(current, now):
                    table[key] = replace(current, held=False)
                    released.append(self._info(group, key, current, now))
        self.changes += len(released)
        released.sort(key=lambda i: (i.group, i.topic, i.queue_id))
        return released

    # -- kept across restarts (lock_file.py) ---------------------------------

    @property
    def size(self) -> int:
        """Queues with a grant on record (held or history): the length of a snapshot."""
        return sum(len(table) for table in self._groups.values())

    def snapshot(self) -> list[SavedLock]:
        """Every queue's last grant, held or not (the epoch history goes with it), sorted."""
        return [SavedLock(group, topic, queue_id, lk.client_id, lk.owner_epoch, lk.token, lk.held, lk.start_offset)
                for group in sorted(self._groups) for (topic, queue_id), lk in sorted(self._groups[group].items())]

    @property
    def expiry_ms(self) -> int:
        return self._expiry_ms

    def restore(self, saved: Iterable[SavedLock], *, earlier_expiry_ms: int = 0, keep_live: bool = False) -> int:
        """Take back the table another broker process saved: this broker's earlier process (at start, before
        any request), or the master a promoted replica copied (`keep_live`: a queue this broker holds a
        live grant of keeps it). A lock that was held is held again for half the expiry from now (the
        other process's, if it was longer): a client counts on a lock for at most half the expiry it was
        told after it asked for the last renewal that process answered (client/consumer/lock_hold.py), so no
        queue goes to another client while a grant of that process may still be counted on; a holder still
        alive renews it meanwhile and goes on under the same epoch and token. Released grants come back as
        history, for the epoch rule. Epochs and tokens issued from now on are larger than those taken back.
        Returns how many entries were taken (each a change)."""
        now = self._clock()
        half_ms = max(self._expiry_ms, earlier_expiry_ms) // 2
        half_s, wall_ms = half_ms / 1000.0, self._wall_clock_ms() + half_ms
        taken = 0
        for lk in saved:
            self._epochs.advance_past(lk.owner_epoch)
            self._tokens.advance_past(lk.token)
            table = self._groups.setdefault(lk.group, {})
            own = table.get((lk.topic, lk.queue_id))
            if keep_live and own is not None and own.is_live(now):
                continue
            table[(lk.topic, lk.queue_id)] = _QueueLock(
                lk.client_id, lk.owner_epoch, lk.token, lk.held, now + half_s, wall_ms, lk.start_offset)
            taken += 1
        self.changes += taken
        return taken

    # -- queries -----------------------------------------------------------

    def current_epoch(self, group: str, topic: str, queue_id: int) -> int | None:
        """The last epoch issued for the queue, even if its lock expired or was released.

        None when the queue was never locked by this broker process.
        """
        current = self._get(group, topic, queue_id)
        return current.owner_epoch if current is not None else None

    def holder(self, group: str, topic: str, queue_id: int) -> str | None:
        """The client holding a live lock on the queue, or None."""
        current = self._get(group, topic, queue_id)
        if current is not None and current.is_live(self._clock()):
            return current.client_id
        return None

    def start_offset(self, group: str, topic: str, queue_id: int, token: int | None = None) -> int | None:
        """The committed offset kept with the queue's live grant (the one named by `token`, when given);
        None when there is no such grant or nothing was kept with it."""
        current = self._get(group, topic, queue_id)
        if current is None or not current.is_live(self._clock()) or (token is not None and current.token != token):
            return None
        return current.start_offset

    def check_owner(
        self, group: str, client_id: str, topic: str, queue_id: int, owner_epoch: int
    ) -> None:
        """Raise FencedError unless `client_id` with `owner_epoch` is the queue's owner.

        The owner is the last holder with the current epoch, whether its lock is
        live, expired or released, as long as nobody else was granted the queue
        since (then its epoch is still current and nothing it does can conflict).
        """
        current = self._get(group, topic, queue_id)
        where = f"queue {topic}:{queue_id} of group {group!r}"
        if current is None:
            raise FencedError(
                f"{where}: client {client_id!r} quotes owner epoch {owner_epoch}, but the queue "
                f"has no owner epoch on this broker (current epoch none: never locked since the "
                f"broker started); lock the queue again"
            )
        if current.owner_epoch != owner_epoch or current.client_id != client_id:
            raise FencedError(
                f"{where}: client {client_id!r} quotes owner epoch {owner_epoch}, but the current "
                f"epoch is {current.owner_epoch}, granted to {current.client_id!r}; "
                f"the queue was taken over, re-read the committed offset after locking again"
            )

    def locks(self, group: str | None = None) -> list[LockInfo]:
        """Every held lock (live, or expired but not yet dropped by expire()), sorted."""
        now = self._clock()
        groups = [group] if group is not None else sorted(self._groups)
        infos: list[LockInfo] = []
        for g in groups:
            table = self._groups.get(g, {})
            for key in sorted(table):
                current = table[key]
                if current.held:
                    infos.append(self._info(g, key, current, now))
        return infos

    # -- cleanup -----------------------------------------------------------

    def forget_topic(self, topic: str) -> None:
        """Drop locks and epoch history of a deleted topic in every group.

        Safe because a re-created topic's first grant takes a fresh, larger epoch.
        """
        for group in list(self._groups):
            table = self._groups[group]
            for key in [k for k in table if k[0] == topic]:
                del table[key]
                self.changes += 1
            if not table:
                del self._groups[group]

    def forget_group(self, group: str) -> None:
        """Drop locks and epoch history of a deleted group."""
        if self._groups.pop(group, None) is not None:
            self.changes += 1

    # -- helpers -----------------------------------------------------------

    def _get(self, group: str, topic: str, queue_id: int) -> _QueueLock | None:
        table = self._groups.get(group)
        return table.get((topic, queue_id)) if table is not None else None

    @staticmethod
    def _info(group: str, key: QueueKey, lk: _QueueLock, now: float) -> LockInfo:
        return LockInfo(
            group,
            key[0],
            key[1],
            lk.client_id,
            lk.owner_epoch,
            lk.expire_timestamp,
            lk.is_live(now),
        )


def _superseded(current: _QueueLock, token: int) -> bool:
    """Whether a quoted lock token (0: none quoted) names a grant other than the current one."""
    return token != 0 and token != current.token
