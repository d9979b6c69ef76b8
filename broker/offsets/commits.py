"""OffsetCommitService: offset operations that need topics and the store around the offset table.

ConsumerOffsetManager keeps the table and the fencing rules; this module checks
names and ranges against the topics and the store (RocketMQ stores a negative
offset; Tidemark refuses it), batches oneway commits, resets offsets for
admins and computes consume stats (lag).

Every check comes before any change: a refused request leaves nothing behind.
A group's config, created on first use as in RocketMQ (an acknowledged commit,
a reset), is written before any offset of the group moves: when
subscriptionGroup.json cannot take it, the caller gets StoreError (UNAVAILABLE)
and neither the group nor the offset exists. Other commits (riding on pulls
and fetch credit, a lock's final commit, RocketMQ 5's UpdateOffset) create no
config: their consumers' heartbeats did.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from tidemark.broker.errors import (
    BrokerError,
    FailedPreconditionError,
    FencedError,
    InvalidArgumentError,
    NotFoundError,
    StaleResetGenerationError,
)
from tidemark.broker.membership.groups import SubscriptionGroupManager, check_group
from tidemark.broker.offsets import ConsumerOffsetManager, Fence
from tidemark.broker.offsets.persistence import TableKey, invalid_names, table_key
from tidemark.broker.store import MessageStore
from tidemark.broker.topics import TopicConfig, TopicConfigManager, check_topic
from tidemark.common.logs import get_logger

log = get_logger("tidemark.broker.offsets")

MAX_REPORTED_REJECTIONS = 1000


class RejectReason(enum.Enum):
    FENCED = "FENCED"
    STALE_RESET_GENERATION = "STALE_RESET_GENERATION"
    INVALID = "INVALID"


@dataclass(slots=True)  # not frozen: a frozen dataclass takes 4x as long to build, and a stream builds one per commit
class Commit:
    group: str
    topic: str
    queue_id: int
    offset: int
    fence: Fence | None = None
    # Why the commit cannot apply, found before it got here (a fence that did not decode): it is then
    # rejected as INVALID like any other bad commit of its batch.
    invalid: str = ""


@dataclass(frozen=True, slots=True)
class Rejection:
    commit: Commit
    reason: RejectReason
    message: str


@dataclass(frozen=True, slots=True)
class BatchResult:
    applied: int
    rejected: int
    rejections: list[Rejection]


class CommitTally:
    """What one CommitOffsets stream applied and refused, over all its batches.

    Every refusal is counted; the first MAX_REPORTED_REJECTIONS are kept to tell
    the client which commits they were (a stream of bad commits must not grow
    the answer without bound)."""

    def __init__(self) -> None:
        self.applied = 0
        self.rejected = 0
        self.rejections: list[Rejection] = []

    def add(self, result: BatchResult) -> None:
        self.applied += result.applied
        self.rejected += result.rejected
        room = MAX_REPORTED_REJECTIONS - len(self.rejections)
        self.rejections.extend(result.rejections[:room])


class ResetKind(enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    TIMESTAMP = "timestamp"
    OFFSET = "offset"
    SHIFT_BY = "shift_by"


@dataclass(frozen=True, slots=True)
class ResetTarget:
    kind: ResetKind
    value: int = 0


@dataclass(frozen=True, slots=True)
class OffsetChange:
    topic: str
    queue_id: int
    old_offset: int
    new_offset: int


@dataclass(frozen=True, slots=True)
class QueueProgress:
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    consumer_offset: int
    lag: int
    last_timestamp: int


class OffsetCommitService:
    def __init__(self, *, store: MessageStore, topics: TopicConfigManager, offsets: ConsumerOffsetManager,
                 groups: SubscriptionGroupManager, on_reset: Callable[[str, int], None] = lambda t, q: None,
                 guard: Callable[[], None] = lambda: None, read_guard: Callable[[], None] = lambda: None) -> None:
        self._store = store
        # Raises (StoreError) while this broker may not change offsets: a master that may have been
        # replaced. Asked before every change, so a commit it refuses is applied nowhere but the master.
        self._guard = guard
        # Raises (StoreError) while the offsets here may be older than some already read elsewhere (a
        # replica that has not copied its master's yet): queries wait, so no reader sees one step back.
        self._read_guard = read_guard
        # Called per reset queue, so streams serving it tell their consumer at once.
        self._on_reset = on_reset
        self._topics = topics
        self._offsets = offsets
        self._groups = groups
        self.commits_applied = 0

    def _queue_topic(self, group: str, topic_name: str, queue_id: int) -> TopicConfig:
        check_group(group)
        topic = self._topics.require(topic_name)
        if not 0 <= queue_id < topic.queue_nums:
            raise InvalidArgumentError(
                f"queue id {queue_id} is out of range for topic {topic_name!r} (queues 0..{topic.queue_nums - 1})")
        return topic

    def validate(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self._queue_topic(group, topic, queue_id)
        if offset < 0:
            raise InvalidArgumentError(f"offset must be >= 0, got {offset}")
        max_offset = self._store.max_offset(topic, queue_id)
        if offset > max_offset:
            raise InvalidArgumentError(
                f"offset {offset} is above the max offset {max_offset} of {topic}:{queue_id}")

    def commit(self, group: str, topic: str, queue_id: int, offset: int, fence: Fence | None, *,
               acknowledged: bool = False) -> bool:
        """Validate and apply one commit (piggybacked on a pull or fetch credit, a lock's final commit);
        FencedError / StaleResetGenerationError when rejected, StoreError (nothing applied) when the
        offset journal cannot take it. Creates no group config.

        An acknowledged (unary) commit may move the offset back within the committer's epoch; oneway
        ones (stream, piggyback) only forward, so a late one cannot rewind a newer commit."""
        self._guard()
        self.validate(group, topic, queue_id, offset)
        changed = self._offsets.commit(group, topic, queue_id, offset, fence, allow_rewind=acknowledged)
        self.commits_applied += 1
        return changed

    async def commit_acknowledged(self, c: Commit) -> bool:
        """UpdateConsumerOffset: `commit(acknowledged=True)`, checked in full first, and creating the
        group's config (written first) when it has none."""
        self._guard()
        self._check(c, {})
        await self._register([c.group])
        return self.commit(c.group, c.topic, c.queue_id, c.offset, c.fence, acknowledged=True)

    def _check(self, c: Commit, names: dict[tuple[str, str], int]) -> None:
        """Everything that would refuse the commit now, changing nothing. `names`: the (group, topic) pairs
        of the batch already checked, with the topic's queue count (a CommitOffsets message holds one
        commit per queue of a few topics, and nothing runs between the checks of one batch)."""
        if c.invalid:
            raise InvalidArgumentError(c.invalid)
        queue_nums = names.get((c.group, c.topic))
        if queue_nums is None:
            queue_nums = self._queue_topic(c.group, c.topic, c.queue_id).queue_nums
            self._offsets.check_fence(c.group, c.topic, 0, None)  # the table's own name rules, once a pair
            names[(c.group, c.topic)] = queue_nums
        elif not 0 <= c.queue_id < queue_nums:
            self._queue_topic(c.group, c.topic, c.queue_id)  # raises, with the message
        if c.offset < 0 or c.offset > self._store.max_offset(c.topic, c.queue_id):
            self.validate(c.group, c.topic, c.queue_id, c.offset)  # raises, with the message
        if c.fence is not None:
            self._offsets.check_fence(c.group, c.topic, c.queue_id, c.fence)

    async def _register(self, groups: Iterable[str]) -> bool:
        """Create the configs the groups lack and wait until subscriptionGroup.json holds them; StoreError
        (and none created) when it cannot. True when that wait let other requests run."""
        new = [g for g in dict.fromkeys(groups) if self._groups.get(g) is None]
        for group in new:
            self._groups.ensure(group)
        if new:
            await self._groups.file.flush()
        return bool(new)

    async def commit_batch(self, commits: Iterable[Commit]) -> BatchResult:
        """Apply one CommitOffsets message's commits in order; a rejected one is reported, the rest still
        apply. Each is checked first, the groups of those that passed get their configs, then they apply in
        one offset-journal write. StoreError, with nothing of the batch applied, when the config file or
        the journal cannot take it."""
        self._guard()
        checked: list[tuple[Commit, BrokerError | None]] = []
        names: dict[tuple[str, str], int] = {}
        for c in commits:
            try:
                self._check(c, names)
                checked.append((c, None))
            except BrokerError as e:
                checked.append((c, e))
        yielded = await self._register(c.group for c, error in checked if error is None)
        applied = rejected = 0
        rejections: list[Rejection] = []
        apply = self._offsets.commit_checked
        with self._offsets.batch():  # the batch's changes reach the offset journal in one write
            for c, error in checked:
                if error is None:
                    try:  # an earlier commit of the batch may have fenced this one (the manager checks);
                        # the rest is checked again only when the configs' write let other requests run
                        if yielded:
                            self.commit(c.group, c.topic, c.queue_id, c.offset, c.fence)
                        else:  # (the guard at the top still holds: nothing ran in between)
                            apply(c.group, c.topic, c.queue_id, c.offset, c.fence)
                        applied += 1
                        continue
                    except BrokerError as e:
                        error = e
                rejected += 1
                if len(rejections) < MAX_REPORTED_REJECTIONS:
                    rejections.append(Rejection(c, _reason(error), str(error)))
        if not yielded:
            self.commits_applied += applied
        return BatchResult(applied, rejected, rejections)

    def take_back(self, table: Mapping[TableKey, Mapping[int, int]],
                  generations: Mapping[TableKey, Mapping[int, int]]) -> int:
        """HandBackOffsets: a replica's commits, taken as ConsumerOffsetManager.take_back says, once every
        name is checked: a topic or group name no other RPC accepts refuses the whole call
        (InvalidArgumentError naming the key), so nothing of it applies."""
        bad = invalid_names(table)
        if bad:
            key, why = next(iter(bad.items()))
            more = f" (and {len(bad) - 1} more bad keys)" if len(bad) > 1 else ""
            raise InvalidArgumentError(f"offsets_json key {table_key(*key)!r}: {why}{more}; nothing was applied")
        self._guard()
        return self._offsets.take_back(table, generations)

    def query(self, group: str, topic: str, queue_id: int) -> tuple[int, int]:
        """(committed offset or -1, reset generation)."""
        self._read_guard()
        self._queue_topic(group, topic, queue_id)
        return (self._offsets.query(group, topic, queue_id),
                self._offsets.reset_generation(group, topic, queue_id))

    async def reset(self, group: str, topic_name: str, queue_id: int | None, target: ResetTarget,
                    *, dry_run: bool) -> list[OffsetChange]:
        check_group(group)
        topic = self._topics.require(topic_name)
        if queue_id is None:
            queue_ids = list(range(topic.queue_nums))
        else:
            self._queue_topic(group, topic_name, queue_id)
            queue_ids = [queue_id]
        changes = [self._reset_one(group, topic_name, q, target) for q in queue_ids]
        if not dry_run:
            self._guard()
            await self._register([group])
            with self._offsets.batch():
                for change in changes:
                    self._offsets.reset(group, topic_name, change.queue_id, change.new_offset)
            for change in changes:
                self._on_reset(topic_name, change.queue_id)
            log.info("offsets reset",
                     event="offset_reset", group=group, topic=topic_name, target=target.kind.value,
                     value=target.value, queues=len(changes))
        return changes

    def _reset_one(self, group: str, topic: str, queue_id: int, target: ResetTarget) -> OffsetChange:
        low = self._store.min_offset(topic, queue_id)
        high = self._store.readable_max_offset(topic, queue_id)  # "latest" is the end readers see
        old = self._offsets.query(group, topic, queue_id)
        kind = target.kind
        if kind is ResetKind.EARLIEST:
            new = low
        elif kind is ResetKind.LATEST:
            new = high
        elif kind is ResetKind.TIMESTAMP:
            if target.value < 0:
                raise InvalidArgumentError(f"timestamp must be >= 0, got {target.value}")
            new = self._store.search_offset_by_timestamp(topic, queue_id, target.value)
        elif kind is ResetKind.OFFSET:
            if not low <= target.value <= high:
                raise InvalidArgumentError(
                    f"offset {target.value} is outside [{low}, {high}] for {topic}:{queue_id}")
            new = target.value
        else:
            base = old if old >= 0 else low
            new = min(max(base + target.value, low), high)
        return OffsetChange(topic, queue_id, old, new)

    def delete_offsets(self, group: str, topic_name: str, *, subscribers: Sequence[str],
                       dry_run: bool) -> list[OffsetChange]:
        """Remove the group's committed offsets of one topic (Kafka's --delete-offsets); each change has
        new_offset -1. Refused while `subscribers` (live members of the group subscribed to the topic) is
        not empty, as Kafka refuses a group subscribed to the topic: their next commit would bring the
        offsets back."""
        check_group(group)
        check_topic(topic_name)
        offsets = self._offsets.offsets(group, topic_name)
        if not offsets:
            raise NotFoundError(f"group {group!r} has no offsets for topic {topic_name!r} on this broker")
        if subscribers:
            raise FailedPreconditionError(
                f"group {group!r} has {len(subscribers)} live member(s) subscribed to topic {topic_name!r} "
                f"({', '.join(sorted(subscribers)[:3])}); stop them first")
        changes = [OffsetChange(topic_name, q, offset, -1) for q, offset in offsets.items()]
        if not dry_run:
            self._guard()
            self._offsets.remove_group_topic(group, topic_name)
            log.info("group offsets deleted", event="offset_delete", group=group, topic=topic_name,
                     queues=len(changes))
        return changes

    async def clone_offsets(self, src_group: str, dest_group: str, topic_name: str, *,
                            dry_run: bool) -> list[OffsetChange]:
        """The destination group's offsets of a topic become the source group's (RocketMQ's
        cloneGroupOffset): queues the source has no offset for lose the destination's. Applied as admin
        resets (new generations), so live consumers of the destination continue from the cloned offsets."""
        topic = self._topics.require(topic_name)
        check_group(src_group)
        check_group(dest_group)
        if src_group == dest_group:
            raise InvalidArgumentError(f"source and destination are the same group {src_group!r}")
        source = self._offsets.offsets(src_group, topic.name)
        if not source:
            raise NotFoundError(f"group {src_group!r} has no offsets for topic {topic.name!r} on this broker")
        dest = self._offsets.offsets(dest_group, topic.name)
        changes = [OffsetChange(topic.name, q, dest.get(q, -1), source.get(q, -1))
                   for q in sorted(set(source) | set(dest))]
        if not dry_run:
            self._guard()
            await self._register([dest_group])
            with self._offsets.batch():
                self._offsets.remove_group_topic(dest_group, topic.name)
                for change in changes:
                    if change.new_offset >= 0:
                        self._offsets.reset(dest_group, topic.name, change.queue_id, change.new_offset)
            for change in changes:
                self._on_reset(topic.name, change.queue_id)
            log.info("group offsets cloned", event="offset_clone", src_group=src_group, dest_group=dest_group,
                     topic=topic.name, queues=len(changes))
        return changes

    def progress(self, group: str, topic_name: str | None) -> list[QueueProgress]:
        """Per-queue consume progress of a group (GetConsumeStats)."""
        self._read_guard()
        check_group(group)
        if topic_name:
            topics = [self._topics.require(topic_name)]
        else:
            names = self._offsets.topics_of_group(group)
            if not names and self._groups.get(group) is None:
                raise NotFoundError(f"group {group!r} has no offsets on this broker")
            topics = [t for t in (self._topics.get(n) for n in names) if t is not None]
        rows = []
        for topic in sorted(topics, key=lambda t: t.name):
            for q in range(topic.queue_nums):
                low = self._store.min_offset(topic.name, q)
                high = self._store.max_offset(topic.name, q)
                committed = self._offsets.query(group, topic.name, q)
                # Without a commit, everything still stored counts as not consumed.
                lag = max(0, high - (committed if committed >= 0 else low))
                last = self._store.store_timestamp_at(topic.name, q, committed - 1) if committed > 0 else None
                rows.append(QueueProgress(topic.name, q, low, high, committed, lag, last or 0))
        return rows


def _reason(error: BrokerError) -> RejectReason:
    if isinstance(error, FencedError):
        return RejectReason.FENCED
    if isinstance(error, StaleResetGenerationError):
        return RejectReason.STALE_RESET_GENERATION
    return RejectReason.INVALID
