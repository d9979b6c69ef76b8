"""Results of offset, membership and admin calls, as the client library returns them."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from tidemark.client.message import MessageQueue


@dataclass(frozen=True, slots=True)
class Fence:
    """What a consumer quotes to prove it still owns a queue: its client id, the owner epoch of its lock
    and the reset generation it has seen (None: not fenced on that account)."""

    client_id: str
    owner_epoch: int | None = None
    reset_generation: int | None = None


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    """One queue offset to commit for a group; owner_epoch/reset_generation fence it (None: unfenced)."""

    group: str
    queue: MessageQueue
    offset: int
    client_id: str = ""
    owner_epoch: int | None = None
    reset_generation: int | None = None


class CommitRejectReason(enum.Enum):
    FENCED = "FENCED"
    STALE_RESET_GENERATION = "STALE_RESET_GENERATION"
    INVALID = "INVALID"


@dataclass(frozen=True, slots=True)
class RejectedCommit:
    group: str
    queue: MessageQueue
    offset: int
    reason: CommitRejectReason
    message: str


@dataclass(frozen=True, slots=True)
class CommitOffsetsResult:
    applied: int
    rejected: int
    rejections: list[RejectedCommit]


@dataclass(frozen=True, slots=True)
class QueueLockGrant:
    queue: MessageQueue
    owner_epoch: int
    expire_timestamp: int
    # Where the group stood on the queue when the lock was granted (-1: no committed offset).
    consumer_offset: int = -1
    reset_generation: int = 0
    # Names this grant: the unlock quoting it cannot release a later grant of the queue (0: unknown).
    lock_token: int = 0
    # How long the broker keeps the lock without a renewal (0: the broker did not say).
    lock_expiry_ms: int = 0


@dataclass(frozen=True, slots=True)
class TopicConfig:
    name: str
    read_queue_nums: int
    write_queue_nums: int
    readable: bool
    writable: bool
    system: bool = False

    @property
    def perm(self) -> str:
        return ("R" if self.readable else "-") + ("W" if self.writable else "-")


@dataclass(frozen=True, slots=True)
class QueueData:
    """The queues one broker holds for a topic."""

    broker_name: str
    broker_addr: str
    read_queue_nums: int
    write_queue_nums: int
    readable: bool
    writable: bool


@dataclass(frozen=True, slots=True)
class TopicRoute:
    topic: str
    queue_datas: tuple[QueueData, ...]

    def read_queues(self) -> list[MessageQueue]:
        return sorted(MessageQueue(self.topic, d.broker_name, q)
                      for d in self.queue_datas if d.readable for q in range(d.read_queue_nums))

    def write_queues(self) -> list[MessageQueue]:
        return sorted(MessageQueue(self.topic, d.broker_name, q)
                      for d in self.queue_datas if d.writable for q in range(d.write_queue_nums))


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    broker_name: str
    broker_addr: str
    readable: bool
    writable: bool
    version: str
    flush_mode: str
    delay_levels: tuple[str, ...]
    broker_id: int = 0  # above 0: a replica of broker_name
    epoch: int = 0  # a master's epoch, raised by every promotion
    fenced: str = ""  # why a name server refused this master: it takes no writes


@dataclass(frozen=True, slots=True)
class BrokerStatus:
    """One broker's runtime state (`tidemark broker status`, RocketMQ's brokerStatus)."""

    broker_name: str
    broker_addr: str
    version: str
    uptime_ms: int
    store_size_bytes: int
    commit_log_min_offset: int
    commit_log_max_offset: int
    flush_mode: str
    role: str  # MASTER or REPLICA
    broker_id: int
    master_addr: str  # a replica's master
    replication_mode: str  # async or sync
    replica_lag_bytes: int
    replicas: int  # replicas streaming from this master
    in_sync_replicas: tuple[int, ...]  # of those, the ones it counts in sync (broker ids)
    consumer_clients: int  # distinct clients with a live consumer heartbeat
    fetch_streams: int
    topics: int
    system_topics: int
    groups: int
    readable: bool
    writable: bool


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A group's progress on one queue (GetConsumeStats)."""

    queue: MessageQueue
    min_offset: int
    max_offset: int
    consumer_offset: int
    lag: int
    last_timestamp: int


@dataclass(frozen=True, slots=True)
class TopicQueueStats:
    queue: MessageQueue
    min_offset: int
    max_offset: int
    last_update_timestamp: int


@dataclass(frozen=True, slots=True)
class OffsetChange:
    queue: MessageQueue
    old_offset: int
    new_offset: int


class ResetTarget(enum.Enum):
    EARLIEST = "to_earliest"
    LATEST = "to_latest"
    TIMESTAMP = "timestamp"
    OFFSET = "offset"
    SHIFT_BY = "shift_by"


@dataclass(frozen=True, slots=True)
class HalfMessage:
    """A transaction's half message waiting for its end on a broker."""

    broker_name: str
    msg_id: str
    half_offset: int
    producer_group: str
    topic: str
    stored_ms: int
    checks: int
    next_check_ms: int
    max_checks: int


@dataclass(frozen=True, slots=True)
class ProducerQueueState:
    """Where an idempotent producer stands on one queue: epoch, last sequence stored, its queue offset."""

    topic: str
    queue_id: int
    epoch: int
    last_sequence: int
    last_offset: int  # -1: no batch remembered


@dataclass(frozen=True, slots=True)
class ProducerInfo:
    """An idempotent producer a broker remembers."""

    broker_name: str
    producer_id: int
    key: str
    created_ms: int
    last_active_ms: int
    queues: tuple[ProducerQueueState, ...]


@dataclass(frozen=True, slots=True)
class GroupSummary:
    group: str
    topics: tuple[str, ...]
    member_count: int
    message_model: str


@dataclass(frozen=True, slots=True)
class GroupMember:
    client_id: str
    host: str
    subscriptions: tuple[tuple[str, str], ...]
    owned_queues: tuple[MessageQueue, ...]
    message_model: str
    consume_type: str
    orderly: bool
    last_heartbeat_timestamp: int
    allocate_strategy: str

    def merged(self, other: GroupMember | None) -> GroupMember:
        """This member as one broker reports it, with the queues it owns on another broker's report too (each
        broker knows only its own queues' owners)."""
        if other is None:
            return self
        return replace(self, owned_queues=tuple(sorted({*self.owned_queues, *other.owned_queues})))


@dataclass(frozen=True, slots=True)
class QueueLockInfo:
    queue: MessageQueue
    client_id: str
    owner_epoch: int
    expire_timestamp: int


@dataclass(frozen=True, slots=True)
class PopQueueInflight:
    """What a pop group (RocketMQ 5 clients) has received on one queue and not yet acked; epoch ms of the
    broker's clock, 0 where there is nothing to tell."""

    queue: MessageQueue
    inflight: int
    oldest_received_ms: int
    earliest_invisible_until_ms: int
    latest_invisible_until_ms: int
    redelivered: int  # of the in-flight ones, on their second or later delivery
    max_attempt: int
    overdue: int  # past their invisible time when the broker answered
    pending_redelivery: int  # FIFO: waiting to be delivered again in place
    waiting: int = 0  # stored after the last message handed out: not yet received by the group


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group: str
    members: tuple[GroupMember, ...]
    locks: tuple[QueueLockInfo, ...]
    pop_queues: tuple[PopQueueInflight, ...] = ()  # empty unless the group consumes by pop


@dataclass(frozen=True, slots=True)
class Delivery:
    """A broker's record of a read that handed a queue's offsets [first_offset, next_offset) to a group's
    client at delivered_ms (epoch ms of the broker's clock)."""

    group: str
    client_id: str
    delivered_ms: int
    first_offset: int
    next_offset: int


@dataclass(frozen=True, slots=True)
class GroupConfig:
    group: str
    consume_enable: bool
    consume_broadcast_enable: bool
    retry_queue_nums: int
    retry_max_times: int
    consume_orderly: bool = False


@dataclass(frozen=True, slots=True)
class SendBackResult:
    topic: str
    queue_id: int
    queue_offset: int
    delay_level: int
    reconsume_times: int


@dataclass(frozen=True, slots=True)
class UserInfo:
    """A user as the brokers list it (never its secret key), and the brokers that hold it."""

    name: str
    super_user: bool
    brokers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AclRuleInfo:
    """An ACL rule as the brokers list it, and the brokers that hold it."""

    user: str
    resource: str
    actions: tuple[str, ...]
    decision: str
    source_ips: tuple[str, ...] = ()
    brokers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterBroker:
    """A broker as the name servers (or, without them, the broker itself) describe it."""

    cluster_name: str
    broker_name: str
    broker_id: int
    address: str
    version: str
    readable: bool
    writable: bool
    topic_count: int | None  # None when the broker was asked directly (no name servers)
    last_update_ms: int  # 0 when the broker was asked directly
    uptime_ms: int | None
    replica_lag_bytes: int = 0  # a replica's distance behind its master
    replica_lag_ms: int = 0
    in_sync_replicas: tuple[int, ...] = ()  # a master's replicas in sync (broker ids), as it last registered

    @property
    def role(self) -> str:
        return "master" if self.broker_id == 0 else "replica"


class GroupState(enum.StrEnum):
    """A consumer group's state as kafka-consumer-groups names them."""

    STABLE = "Stable"  # members, and every subscribed queue that needs an owner has one
    REBALANCING = "Rebalancing"  # members, and some such queue has no owner (queues are moving)
    EMPTY = "Empty"  # no live member, committed offsets kept
    DEAD = "Dead"  # no live member and nothing committed (only its config is left)


def group_state(members: Sequence[GroupMember], committed_queues: Iterable[MessageQueue]) -> GroupState:
    """The state of a group from its live members (what they subscribe and own) and the queues it has
    committed offsets on. Only clustering push consumers own queues (locks); broadcasting, pull and pop
    members consume without owners, so a group of those is Stable while it has members."""
    committed = list(committed_queues)
    if not members:
        return GroupState.EMPTY if committed else GroupState.DEAD
    owners = [m for m in members if m.message_model == "CLUSTERING" and m.consume_type == "CONSUME_PASSIVELY"]
    if not owners:
        return GroupState.STABLE
    subscribed = {topic for m in owners for topic, _ in m.subscriptions}
    owned = {q for m in owners for q in m.owned_queues}
    waiting = [q for q in committed if q.topic in subscribed and q not in owned]
    return GroupState.REBALANCING if waiting else GroupState.STABLE
