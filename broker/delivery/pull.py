"""PullService: reads a queue for a consumer (RocketMQ's PullMessageProcessor), one call per read.

Order of checks (QueueReadAccess, shared with the fetch stream): names and
ranges, read permission, the group's consume_enable, owner fence (a client
that lost the queue's lock may not pull it), reset generation (a consumer that
has not seen an admin reset is told OFFSET_RESET); then the piggybacked
commit, then the read itself with filtering (tags, or SQL92 on the stored
properties) and long polling at the end of the queue. Consumers read through
the fetch stream (fetch.py); this unary path serves tools, with a byte cap per
answer.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass

from tidemark.broker.cluster.permission import BrokerPermission
from tidemark.broker.delivery.waiters import QueueWaiters
from tidemark.broker.errors import InvalidArgumentError, PermissionDeniedError
from tidemark.broker.membership.groups import SubscriptionGroupManager, check_group
from tidemark.broker.membership.locks import QueueLockManager
from tidemark.broker.offsets import ConsumerOffsetManager, Fence
from tidemark.broker.offsets.commits import OffsetCommitService
from tidemark.broker.store import GetStatus, MessageStore, StoredMessage
from tidemark.broker.topics import TopicConfig, TopicConfigManager
from tidemark.common.logs import get_logger
from tidemark.common.protocol import ExpressionType, MessageFilter, parse_filter

log = get_logger("tidemark.broker.delivery.pull")

MAX_PULL_BATCH = 1024
DEFAULT_PULL_BATCH = 32
# Consume-queue entries examined per read when filtering by tag, and by properties (SQL92: each one decoded).
_MAX_SCAN = 4000
# How long one pull may scan filtered-out entries beyond its suspend time before it answers with the offset
# it reached (the client pulls again from there): a long filtered backlog never outlasts the request.
_FILTERED_SCAN_S = 1.0
_MAX_SCAN_PROPERTIES = 1000
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
    expression_type: str = ExpressionType.TAG  # how `subscription` is read: tags, or SQL92 on the properties


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


@dataclass(frozen=True, slots=True)
class ReadGrant:
    """What a read of one queue may go ahead with: the topic, the parsed filter, the reset generation."""

    topic: TopicConfig
    expression: MessageFilter
    generation: int


class QueueReadAccess:
    """The rules a read of a queue obeys, shared by the unary pull and the fetch stream.

    Names and ranges, read permission (broker and topic), the group's
    consume_enable, its consume_broadcast_enable (see recheck), the owner
    fence (a client that lost the queue's lock may not read it) and the
    queue's reset generation.
    """

    def __init__(self, *, topics: TopicConfigManager, groups: SubscriptionGroupManager,
                 offsets: ConsumerOffsetManager, locks: QueueLockManager, permission: BrokerPermission,
                 message_model: Callable[[str], str | None] = lambda group: "CLUSTERING") -> None:
        self._message_model = message_model  # of a group's live members (ConsumerManager.message_model)
        self._topics = topics
        self._groups = groups
        self._offsets = offsets
        self._locks = locks
        self._permission = permission

    def check(self, group: str, topic_name: str, queue_id: int, offset: int, subscription: str,
              fence: Fence | None, expression_type: str = ExpressionType.TAG) -> ReadGrant:
        """Everything a read checks before it starts (BrokerError when refused: a bad SQL92 expression is
        INVALID_ARGUMENT naming the column)."""
        topic = self._topics.require(topic_name)
        check_queue(topic, queue_id)
        if offset < 0:
            raise InvalidArgumentError(f"queue offset must be >= 0, got {offset}")
        try:
            expression = parse_filter(subscription, expression_type)
        except ValueError as e:
            raise InvalidArgumentError(str(e)) from None
        if group:
            check_group(group)
        return ReadGrant(topic, expression, self.recheck(group, topic_name, queue_id, fence))

    def recheck(self, group: str, topic_name: str, queue_id: int, fence: Fence | None) -> int:
        """What may change while a stream serves a queue: permissions, the topic, the owner.

        Returns the queue's current reset generation for the group (0 without a group)."""
        self._permission.check_readable()
        topic = self._topics.require(topic_name)
        if not topic.readable:
            raise PermissionDeniedError(f"topic {topic.name!r} is not readable")
        if not group:
            return 0
        config = self._groups.get(group)
        if config is not None and not config.consume_enable:
            raise PermissionDeniedError(f"group {group!r} may not consume (its consume_enable is false)")
        if config is not None and not config.consume_broadcast_enable \
                and self._message_model(group) != "CLUSTERING":
            # RocketMQ answers a broadcasting group's pulls NO_PERMISSION. A broadcasting consumer's
            # heartbeat is refused here, so it is not a member: only known CLUSTERING members may read.
            raise PermissionDeniedError(f"group {group!r} may not consume in BROADCASTING mode (its "
                                        f"consume_broadcast_enable is false; only its live CLUSTERING members "
                                        f"may read)")
        if fence is not None and fence.owner_epoch is not None:
            self._locks.check_owner(group, fence.client_id, topic_name, queue_id, fence.owner_epoch)
        return self._offsets.reset_generation(group, topic_name, queue_id)

    def generation(self, group: str, topic: str, queue_id: int) -> int:
        return self._offsets.reset_generation(group, topic, queue_id)

    def lock_start(self, group: str, topic: str, queue_id: int, client_id: str) -> tuple[int, Fence] | None:
        """Where a queue's reading starts for `client_id` once it holds the queue's live lock: the group's
        committed offset (-1: none) as of the grant it holds, the offset that grant's LockQueues answer
        carried (the previous owner's final commit came before its release), and the grant's fence; None
        while another client (or nobody) holds it. As of the grant, not as of now: the new owner may have
        committed since (its own start, when the grant said none)."""
        if self._locks.holder(group, topic, queue_id) != client_id:
            return None
        fence = Fence(client_id, self._locks.current_epoch(group, topic, queue_id),
                      self._offsets.reset_generation(group, topic, queue_id))
        offset = self._locks.start_offset(group, topic, queue_id)  # kept with the grant (handover.py)
        return self._offsets.query(group, topic, queue_id) if offset is None else offset, fence

    def reset_offset(self, group: str, topic: str, queue_id: int) -> int:
        """Where a consumer continues after an admin reset: the group's committed offset."""
        return max(self._offsets.query(group, topic, queue_id), 0)


def is_stale(fence: Fence | None, generation: int) -> bool:
    """Whether the reader has not seen the queue's latest admin reset."""
    return fence is not None and fence.reset_generation is not None and fence.reset_generation < generation


class PullService:
    def __init__(self, *, store: MessageStore, access: QueueReadAccess, commits: OffsetCommitService,
                 hold: QueueWaiters, max_long_polling_ms: int) -> None:
        self._store = store
        self._access = access
        self._commits = commits
        self._hold = hold
        self._max_long_polling_ms = max_long_polling_ms

    async def pull(self, req: PullRequest) -> PullOutcome:
        max_nums = req.max_msg_nums or DEFAULT_PULL_BATCH
        if not 1 <= max_nums <= MAX_PULL_BATCH:
            raise InvalidArgumentError(f"max_msg_nums must be between 1 and {MAX_PULL_BATCH}, got {req.max_msg_nums}")
        if req.suspend_timeout_ms < 0:
            raise InvalidArgumentError(f"suspend_timeout_ms must be >= 0, got {req.suspend_timeout_ms}")
        if req.commit_offset is not None and not req.group:
            raise InvalidArgumentError("a piggybacked commit_offset needs a group")
        grant = self._access.check(req.group, req.topic, req.queue_id, req.queue_offset, req.subscription,
                                   req.fence, req.expression_type)
        generation = grant.generation
        if is_stale(req.fence, generation):
            return self._offset_reset(req, generation)
        if req.commit_offset is not None:
            try:
                self._commits.commit(req.group, req.topic, req.queue_id, req.commit_offset, req.fence)
            except InvalidArgumentError as e:
                # As RocketMQ: a bad piggybacked commit (e.g. above a re-created queue's max) is
                # dropped; the pull itself is still answered, so OFFSET_ILLEGAL can correct the client.
                log.info("piggybacked commit ignored",
                         event="piggyback_commit_ignored", group=req.group, topic=req.topic,
                         queue_id=req.queue_id, offset=req.commit_offset, error=e)
        outcome = await self._read(req, grant.expression, max_nums)
        return outcome if not generation else _with_generation(outcome, generation)

    def _offset_reset(self, req: PullRequest, generation: int) -> PullOutcome:
        return PullOutcome(
            status=PullStatus.OFFSET_RESET,
            messages=[],
            next_begin_offset=self._access.reset_offset(req.group, req.topic, req.queue_id),
            min_offset=self._store.min_offset(req.topic, req.queue_id),
            max_offset=self._store.readable_max_offset(req.topic, req.queue_id),
            reset_generation=generation,
        )

    async def _read(self, req: PullRequest, expression: MessageFilter, max_nums: int) -> PullOutcome:
        store = self._store
        codes = expression.code_filter  # tags: the consume queue's codes first, then the exact tag
        matcher = None if codes is None else expression.matches_code
        exact = None if codes is None else (lambda m: expression.matches_tag(m.tags))
        # SQL92: every record's properties are evaluated (smaller windows; the loop goes on between them).
        sql = expression.expression_type == ExpressionType.SQL92
        properties = expression.matches_properties if sql else None
        max_scan = _MAX_SCAN_PROPERTIES if sql else _MAX_SCAN
        suspend_ms = min(req.suspend_timeout_ms, self._max_long_polling_ms)
        deadline = time.monotonic() + suspend_ms / 1000
        offset = req.queue_offset
        skipped = False
        while True:
            result = store.get_messages(req.topic, req.queue_id, offset, max_nums,
                                        matcher=matcher, exact_matcher=exact, properties_filter=properties,
                                        max_scan=max_scan)
            status = result.status
            if status is GetStatus.FOUND:
                messages, next_offset = _cap_bytes(result.messages, result.next_begin_offset)
                return PullOutcome(PullStatus.FOUND, messages, next_offset, result.min_offset, result.max_offset)
            if status is GetStatus.NO_MATCHED_MESSAGE:
                skipped = True
                moved, offset = result.next_begin_offset > offset, result.next_begin_offset
                if moved and offset < result.max_offset and time.monotonic() < deadline + _FILTERED_SCAN_S:
                    await asyncio.sleep(0)  # a long filtered run: other work goes on between windows
                    continue
                if moved and offset < result.max_offset:  # scanned long enough: the reader comes back from here
                    return PullOutcome(PullStatus.NO_MATCHED_MSG, [], offset, result.min_offset, result.max_offset)
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
                lambda: store.readable_max_offset(req.topic, req.queue_id))
            if not arrived:
                status_out = PullStatus.NO_MATCHED_MSG if skipped else PullStatus.NO_NEW_MSG
                return PullOutcome(status_out, [], offset, store.min_offset(req.topic, req.queue_id),
                                   store.readable_max_offset(req.topic, req.queue_id))


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
