"""PullService: reads a queue for a consumer (RocketMQ's PullMessageProcessor).

Order of checks: names and ranges, read permission, owner fence (a client that
lost the queue's lock may not pull it), reset generation (a consumer that has
not seen an admin reset is told OFFSET_RESET), piggybacked commit, then the
read itself with tag filtering and long polling at the end of the queue.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass

from broker.errors import InvalidArgumentError, PermissionDeniedError
from broker.groups import check_group
from broker.locks import QueueLockManager
from broker.long_polling import PullRequestHoldService
from broker.offset_commits import OffsetCommitService
from broker.offsets import ConsumerOffsetManager, Fence
from broker.permission import BrokerPermission
from broker.store import GetStatus, MessageStore, StoredMessage
from broker.topics import TopicConfig, TopicConfigManager
from tidemark.protocol import TagExpression, parse_tag_expression

log = logging.getLogger("tidemark.broker.pull")

MAX_PULL_BATCH = 1024
DEFAULT_PULL_BATCH = 32
# Consume-queue entries examined per read when filtering by tag.
_MAX_SCAN = 4000
# A pull answer stops growing past this many body bytes (always at least one message).
MAX_PULL_BYTES = 8 * 1024 * 1024


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"
    OFFSET_RESET = "OFFSET_RESET"


@dataclass(frozen=True, slots=True)
class PullRequest:
    group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int = DEFAULT_PULL_BATCH
    suspend_timeout_ms: int = 0
    subscription: str = "*"
    commit_offset: int | None = None
    fence: Fence | None = None


@dataclass(frozen=True, slots=True)
class PullOutcome:
    status: PullStatus
    messages: list[StoredMessage]
    next_begin_offset: int
    min_offset: int
    max_offset: int
    reset_generation: int = 0


def check_queue(topic: TopicConfig, queue_id: int) -> None:
    if not 0 <= queue_id < topic.queue_nums:
        raise InvalidArgumentError(
            f"queue id {queue_id} is out of range for topic {topic.name!r} (queues 0..{topic.queue_nums - 1})")


class PullService:
    def __init__(self, *, store: MessageStore, topics: TopicConfigManager, offsets: ConsumerOffsetManager,
                 commits: OffsetCommitService, locks: QueueLockManager, hold: PullRequestHoldService,
                 permission: BrokerPermission, max_long_polling_ms: int) -> None:
        self._store = store
        self._topics = topics
        self._offsets = offsets
        self._commits = commits
        self._locks = locks
        self._hold = hold
        self._permission = permission
        self._max_long_polling_ms = max_long_polling_ms

    async def pull(self, req: PullRequest) -> PullOutcome:
        topic = self._topics.require(req.topic)
        check_queue(topic, req.queue_id)
        if req.queue_offset < 0:
            raise InvalidArgumentError(f"queue offset must be >= 0, got {req.queue_offset}")
        max_nums = req.max_msg_nums or DEFAULT_PULL_BATCH
        if not 1 <= max_nums <= MAX_PULL_BATCH:
            raise InvalidArgumentError(f"max_msg_nums must be between 1 and {MAX_PULL_BATCH}, got {req.max_msg_nums}")
        if req.suspend_timeout_ms < 0:
            raise InvalidArgumentError(f"suspend_timeout_ms must be >= 0, got {req.suspend_timeout_ms}")
        try:
            expression = parse_tag_expression(req.subscription)
        except ValueError as e:
            raise InvalidArgumentError(str(e)) from None
        self._permission.check_readable()
        if not topic.readable:
            raise PermissionDeniedError(f"topic {topic.name!r} is not readable")

        generation = 0
        if req.group:
            check_group(req.group)
            fence = req.fence
            if fence is not None and fence.owner_epoch is not None:
                self._locks.check_owner(req.group, fence.client_id, req.topic, req.queue_id, fence.owner_epoch)
            generation = self._offsets.reset_generation(req.group, req.topic, req.queue_id)
            if fence is not None and fence.reset_generation is not None and fence.reset_generation < generation:
                return self._offset_reset(req, generation)
            if req.commit_offset is not None:
                try:
                    self._commits.commit(req.group, req.topic, req.queue_id, req.commit_offset, fence)
                except InvalidArgumentError as e:
                    # As RocketMQ: a bad piggybacked commit (e.g. above a re-created queue's max) is
                    # dropped; the pull itself is still answered, so OFFSET_ILLEGAL can correct the client.
                    log.info("piggybacked commit ignored event=piggyback_commit_ignored group=%s topic=%s "
                             "queue_id=%d offset=%d error=%s", req.group, req.topic, req.queue_id,
                             req.commit_offset, e)
        elif req.commit_offset is not None:
            raise InvalidArgumentError("a piggybacked commit_offset needs a group")

        outcome = await self._read(req, expression, max_nums)
        return outcome if not generation else _with_generation(outcome, generation)

    def _offset_reset(self, req: PullRequest, generation: int) -> PullOutcome:
        offset = self._offsets.query(req.group, req.topic, req.queue_id)
        return PullOutcome(
            status=PullStatus.OFFSET_RESET,
            messages=[],
            next_begin_offset=max(offset, 0),
            min_offset=self._store.min_offset(req.topic, req.queue_id),
            max_offset=self._store.max_offset(req.topic, req.queue_id),
            reset_generation=generation,
        )

    async def _read(self, req: PullRequest, expression: TagExpression, max_nums: int) -> PullOutcome:
        store = self._store
        matcher = None if expression.matches_all else expression.matches_code
        exact = None if expression.matches_all else (lambda m: expression.matches_tag(m.tags))
        suspend_ms = min(req.suspend_timeout_ms, self._max_long_polling_ms)
        deadline = time.monotonic() + suspend_ms / 1000
        offset = req.queue_offset
        skipped = False
        while True:
            result = store.get_messages(req.topic, req.queue_id, offset, max_nums,
                                        matcher=matcher, exact_matcher=exact, max_scan=_MAX_SCAN)
            status = result.status
            if status is GetStatus.FOUND:
                messages, next_offset = _cap_bytes(result.messages, result.next_begin_offset)
                return PullOutcome(PullStatus.FOUND, messages, next_offset, result.min_offset, result.max_offset)
            if status is GetStatus.NO_MATCHED_MESSAGE:
                skipped = True
                offset = result.next_begin_offset
                if offset < result.max_offset:
                    continue
            elif status is GetStatus.OFFSET_TOO_SMALL:
                return PullOutcome(PullStatus.OFFSET_ILLEGAL, [], result.min_offset,
                                   result.min_offset, result.max_offset)
            elif status is GetStatus.OFFSET_OVERFLOW_BADLY:
                # The store follows RocketMQ: back to 0 when the queue starts at 0 (it was re-created),
                # else to its max offset.
                return PullOutcome(PullStatus.OFFSET_ILLEGAL, [], result.next_begin_offset,
                                   result.min_offset, result.max_offset)
            elif status is GetStatus.NO_MESSAGE_IN_QUEUE and offset != result.max_offset:
                return PullOutcome(PullStatus.OFFSET_ILLEGAL, [], result.max_offset,
                                   result.min_offset, result.max_offset)
            # At the end of the queue: hold the pull until a message arrives or the timeout ends.
            remaining = deadline - time.monotonic()
            arrived = remaining > 0 and await self._hold.wait(
                req.topic, req.queue_id, offset, remaining,
                lambda: store.max_offset(req.topic, req.queue_id))
            if not arrived:
                status_out = PullStatus.NO_MATCHED_MSG if skipped else PullStatus.NO_NEW_MSG
                return PullOutcome(status_out, [], offset, store.min_offset(req.topic, req.queue_id),
                                   store.max_offset(req.topic, req.queue_id))


def _cap_bytes(messages: list[StoredMessage], next_offset: int) -> tuple[list[StoredMessage], int]:
    """Keep a response under MAX_PULL_BYTES; the client continues right after the last message kept."""
    total = 0
    for i, m in enumerate(messages):
        total += len(m.body)
        if total > MAX_PULL_BYTES and i > 0:
            return messages[:i], m.queue_offset
    return messages, next_offset


def _with_generation(outcome: PullOutcome, generation: int) -> PullOutcome:
    return PullOutcome(outcome.status, outcome.messages, outcome.next_begin_offset, outcome.min_offset,
                       outcome.max_offset, generation)
