"""Queue allocation strategies: which of a group's queues this consumer owns.

Rebalance in RocketMQ (and here) has no coordinator. Every consumer of a group
calls the same strategy with the same view of the world — all queues of a topic
and all client ids of the group — and keeps only its own share. That works only
if the strategy is a pure function of its inputs and every client feeds it the
same inputs, so each built-in strategy first de-duplicates and sorts both
lists: the order in which the broker happened to list clients or queues must
not change the answer.

Built-in strategies (names as users type them, case-insensitive):

========================  ==================================================
``AVG`` (default)         contiguous blocks, remainder to the first clients
``AVG_BY_CIRCLE``         queue ``i`` goes to client ``i % len(clients)``
``CONSISTENT_HASH``       MD5 hash ring with virtual nodes
``CONFIG``                a fixed list of queues given at construction
``MACHINE_ROOM``          only queues of brokers named ``idc@name`` in chosen rooms
``MACHINE_ROOM_NEARBY``   prefer queues in the client's own room
========================  ==================================================

Plugging in your own strategy: subclass :class:`AllocateMessageQueueStrategy`,
set ``name`` and implement ``allocate``; pass an instance wherever a strategy is
accepted. Start ``allocate`` with :func:`prepare_allocation` so your strategy
validates and orders its inputs like the built-in ones::

    class AllocateEverythingToFirst(AllocateMessageQueueStrategy):
        name = "FIRST"

        def allocate(self, consumer_group, current_cid, mq_all, cid_all):
            prepared = prepare_allocation(consumer_group, current_cid, mq_all, cid_all)
            if prepared is None:
                return []
            mqs, cids = prepared
            return list(mqs) if cids[0] == current_cid else []

The strategy must give every queue to exactly one client of the group, whatever
order each client received its inputs in; otherwise queues are consumed twice
or not at all.

This module is pure: no I/O, no grpc, no clock.
"""

from __future__ import annotations

import bisect
import enum
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Protocol

from tidemark.client.errors import InvalidArgumentError, InvalidTypeError
from tidemark.client.message import MessageQueue
from tidemark.common.logs import get_logger

__all__ = [
    "AllocateMachineRoomNearby",
    "AllocateMessageQueueAveragely",
    "AllocateMessageQueueAveragelyByCircle",
    "AllocateMessageQueueByConfig",
    "AllocateMessageQueueByMachineRoom",
    "AllocateMessageQueueConsistentHash",
    "AllocateMessageQueueStrategy",
    "AllocateStrategyName",
    "MachineRoomResolver",
    "PrefixMachineRoomResolver",
    "STRATEGIES",
    "md5_hash",
    "prepare_allocation",
    "strategy_by_name",
]

log = get_logger(__name__)

# Separates the machine room (IDC) from the rest of a broker name or client id.
ROOM_SEPARATOR = "@"


class AllocateStrategyName(enum.StrEnum):
    """Names of the built-in strategies, as users type them (RocketMQ's names)."""

    AVG = "AVG"
    AVG_BY_CIRCLE = "AVG_BY_CIRCLE"
    CONSISTENT_HASH = "CONSISTENT_HASH"
    CONFIG = "CONFIG"
    MACHINE_ROOM = "MACHINE_ROOM"
    MACHINE_ROOM_NEARBY = "MACHINE_ROOM_NEARBY"


class AllocateMessageQueueStrategy(ABC):
    """How a consumer group's queues are shared among its clients.

    Subclasses set ``name`` and implement :meth:`allocate`. See the module
    docstring for the contract every strategy must keep.
    """

    name: str

    @abstractmethod
    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        """Return the queues of ``mq_all`` that ``current_cid`` should consume.

        Raises ValueError when ``current_cid`` is empty or either list is empty;
        returns ``[]`` (and logs) when ``current_cid`` is not in ``cid_all``.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def prepare_allocation(
    consumer_group: str,
    current_cid: str,
    mq_all: Iterable[MessageQueue],
    cid_all: Iterable[str],
) -> tuple[list[MessageQueue], list[str]] | None:
    """Validate allocation inputs and return them de-duplicated and sorted.

    Returns None when ``current_cid`` is not among ``cid_all``: RocketMQ treats
    that as a stale view (the broker has not seen this client's heartbeat yet),
    logs a "[BUG]" line at INFO and allocates nothing rather than failing the
    rebalance.
    """
    if not current_cid:
        raise InvalidArgumentError("current_cid is empty")
    mqs = sorted(set(mq_all or ()))
    if not mqs:
        raise InvalidArgumentError("mq_all is empty: there are no queues to allocate")
    cids = sorted(set(cid_all or ()))
    if not cids:
        raise InvalidArgumentError("cid_all is empty: the consumer group has no clients")
    if current_cid not in cids:
        log.info(
            "[BUG] ConsumerGroup: %s The consumerId: %s not in cidAll: %s",
            consumer_group,
            current_cid,
            cids,
        )
        return None
    return mqs, cids


class AllocateMessageQueueAveragely(AllocateMessageQueueStrategy):
    """RocketMQ's default: each client takes one contiguous block of queues.

    With 8 queues and clients c1..c4, c1 gets q0,q1, c2 gets q2,q3, and so on.
    When the split is uneven the first ``len(mqs) % len(cids)`` clients take
    one extra queue; clients beyond the number of queues get nothing.
    """

    name = AllocateStrategyName.AVG

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        prepared = prepare_allocation(consumer_group, current_cid, mq_all, cid_all)
        if prepared is None:
            return []
        mqs, cids = prepared
        return _average_block(mqs, len(cids), cids.index(current_cid))


def _average_block(mqs: Sequence[MessageQueue], n_cids: int, index: int) -> list[MessageQueue]:
    # Seed 001's arithmetic, kept term for term so results match RocketMQ
    # clients' exactly (a mixed fleet must agree on who owns what).
    n_mqs = len(mqs)
    mod = n_mqs % n_cids
    if n_mqs <= n_cids:
        average_size = 1
    elif mod > 0 and index < mod:
        average_size = n_mqs // n_cids + 1
    else:
        average_size = n_mqs // n_cids
    start_index = index * average_size if (mod > 0 and index < mod) else index * average_size + mod
    size = min(average_size, n_mqs - start_index)
    return [mqs[(start_index + i) % n_mqs] for i in range(size)]


class AllocateMessageQueueAveragelyByCircle(AllocateMessageQueueStrategy):
    """Deal queues round-robin: queue ``i`` (sorted) goes to client ``i % len(cids)``."""

    name = AllocateStrategyName.AVG_BY_CIRCLE

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        prepared = prepare_allocation(consumer_group, current_cid, mq_all, cid_all)
        if prepared is None:
            return []
        mqs, cids = prepared
        return mqs[cids.index(current_cid) :: len(cids)]


def md5_hash(key: str) -> int:
    """Unsigned 64-bit hash: the first 8 bytes of the key's UTF-8 MD5, big-endian.

    RocketMQ's MD5Hash folds only 4 bytes; 8 make collisions between virtual
    nodes (which would silently merge two nodes) practically impossible.
    """
    return int.from_bytes(hashlib.md5(key.encode("utf-8"), usedforsecurity=False).digest()[:8])


class AllocateMessageQueueConsistentHash(AllocateMessageQueueStrategy):
    """A hash ring of clients, each present as ``virtual_node_count`` points.

    A queue belongs to the first point at or clockwise after ``hash(str(mq))``.
    When a client joins, only the queues whose first point is now one of the
    newcomer's move, so a scale-out disturbs as few queues as possible (AVG can
    move almost all of them). The price is a less even split.
    """

    name = AllocateStrategyName.CONSISTENT_HASH

    def __init__(
        self,
        virtual_node_count: int = 10,
        hash_function: Callable[[str], int] = md5_hash,
    ) -> None:
        if virtual_node_count < 1:
            raise InvalidArgumentError(f"virtual_node_count must be >= 1, got {virtual_node_count}")
        self.virtual_node_count = virtual_node_count
        self.hash_function = hash_function

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        prepared = prepare_allocation(consumer_group, current_cid, mq_all, cid_all)
        if prepared is None:
            return []
        mqs, cids = prepared
        # Sorted (hash, cid) points; if two points ever share a hash the tuple
        # order breaks the tie the same way on every client.
        ring = sorted(
            (self.hash_function(f"{cid}-{replica}"), cid)
            for cid in cids
            for replica in range(self.virtual_node_count)
        )
        hashes = [point_hash for point_hash, _ in ring]
        result = []
        for mq in mqs:
            # bisect_left: a point whose hash equals the key's owns the key,
            # like RocketMQ's TreeMap.tailMap (inclusive).
            i = bisect.bisect_left(hashes, self.hash_function(str(mq)))
            if ring[i % len(ring)][1] == current_cid:
                result.append(mq)
        return result

    def __repr__(self) -> str:
        return f"{type(self).__name__}(virtual_node_count={self.virtual_node_count})"


class AllocateMessageQueueByConfig(AllocateMessageQueueStrategy):
    """Always the configured queues, whatever the group looks like.

    Like RocketMQ's, this ignores every argument of :meth:`allocate`: it is for
    pinning a client to queues by hand, and the operator — not the strategy —
    is responsible for giving each queue to one client only.
    """

    name = AllocateStrategyName.CONFIG

    def __init__(self, message_queues: Iterable[MessageQueue]) -> None:
        self.message_queues: tuple[MessageQueue, ...] = tuple(message_queues)
        for mq in self.message_queues:
            if not isinstance(mq, MessageQueue):
                raise InvalidTypeError(f"CONFIG strategy expects MessageQueue items, got {mq!r}")

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        return list(self.message_queues)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.message_queues)} queues)"


def _split_room(name: str) -> str | None:
    """The room of an ``idc@rest`` name, or None when the name carries no room."""
    room, sep, rest = name.partition(ROOM_SEPARATOR)
    if not sep or not room or not rest or ROOM_SEPARATOR in rest:
        return None
    return room


class AllocateMessageQueueByMachineRoom(AllocateMessageQueueStrategy):
    """Consume only brokers deployed in some machine rooms.

    Brokers are named ``idc@brokerName``; queues of brokers in a room outside
    ``consume_idcs`` (or without a room) are left to other groups. The eligible
    queues are split like RocketMQ does: each client takes
    ``len(eligible) // len(cids)`` contiguous queues, and the remainder — the
    tail of the sorted list — goes one each to the first clients.
    """

    name = AllocateStrategyName.MACHINE_ROOM

    def __init__(self, consume_idcs: Iterable[str]) -> None:
        if isinstance(consume_idcs, str):
            # A bare string would be read as a set of one-letter rooms.
            raise InvalidTypeError("consume_idcs must be a collection of room names, not a string")
        self.consume_idcs: frozenset[str] = frozenset(consume_idcs)
        if not self.consume_idcs:
            raise InvalidArgumentError(
                "consume_idcs is empty: the MACHINE_ROOM strategy would consume nothing"
            )

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        prepared = prepare_allocation(consumer_group, current_cid, mq_all, cid_all)
        if prepared is None:
            return []
        mqs, cids = prepared
        eligible = [mq for mq in mqs if _split_room(mq.broker_name) in self.consume_idcs]
        index = cids.index(current_cid)
        per_client, remainder = divmod(len(eligible), len(cids))
        result = eligible[index * per_client : (index + 1) * per_client]
        if index < remainder:
            result.append(eligible[per_client * len(cids) + index])
        return result

    def __repr__(self) -> str:
        return f"{type(self).__name__}(consume_idcs={sorted(self.consume_idcs)})"


class MachineRoomResolver(Protocol):
    """Tells which machine room a broker and a client are deployed in."""

    def broker_room(self, mq: MessageQueue) -> str: ...

    def consumer_room(self, cid: str) -> str: ...


class PrefixMachineRoomResolver:
    """Reads the room from the ``idc@`` prefix of broker names and client ids.

    ``"hz@broker-a"`` is in room ``hz``; so is client ``"hz@10.0.0.7@4242"``.
    A name without a room is a ValueError: placing it silently in some room
    would route traffic across rooms without anyone noticing.
    """

    def broker_room(self, mq: MessageQueue) -> str:
        room = _split_room(mq.broker_name)
        if room is None:
            raise InvalidArgumentError(f"machine room unknown for {mq}: broker name is not 'idc@brokerName'")
        return room

    def consumer_room(self, cid: str) -> str:
        room, sep, rest = cid.partition(ROOM_SEPARATOR)
        if not sep or not room or not rest:
            raise InvalidArgumentError(f"machine room unknown for consumer id {cid!r}: expected 'idc@...'")
        return room


class AllocateMachineRoomNearby(AllocateMessageQueueStrategy):
    """Prefer queues in the client's own machine room, to keep traffic local.

    Queues of a room that has clients are shared among that room's clients with
    ``inner``. Queues of a room with no client are shared among all clients
    with ``inner``, one room at a time as RocketMQ does, so losing or gaining
    an orphan room only reshuffles that room's queues.
    """

    name = AllocateStrategyName.MACHINE_ROOM_NEARBY

    def __init__(
        self,
        inner: AllocateMessageQueueStrategy | None = None,
        resolver: MachineRoomResolver | None = None,
    ) -> None:
        self.inner = inner if inner is not None else AllocateMessageQueueAveragely()
        self.resolver = resolver if resolver is not None else PrefixMachineRoomResolver()

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        prepared = prepare_allocation(consumer_group, current_cid, mq_all, cid_all)
        if prepared is None:
            return []
        mqs, cids = prepared
        mqs_by_room: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            mqs_by_room.setdefault(self._room_of_broker(mq), []).append(mq)
        cids_by_room: dict[str, list[str]] = {}
        for cid in cids:
            cids_by_room.setdefault(self._room_of_consumer(cid), []).append(cid)

        my_room = self._room_of_consumer(current_cid)
        result: list[MessageQueue] = []
        local = mqs_by_room.get(my_room)
        if local:
            result.extend(
                self.inner.allocate(consumer_group, current_cid, local, cids_by_room[my_room])
            )
        for room in sorted(mqs_by_room):
            if room not in cids_by_room:
                result.extend(
                    self.inner.allocate(consumer_group, current_cid, mqs_by_room[room], cids)
                )
        return result

    def _room_of_broker(self, mq: MessageQueue) -> str:
        room = self.resolver.broker_room(mq)
        if not room:
            raise InvalidArgumentError(f"machine room is empty for {mq}")
        return room

    def _room_of_consumer(self, cid: str) -> str:
        room = self.resolver.consumer_room(cid)
        if not room:
            raise InvalidArgumentError(f"machine room is empty for consumer id {cid!r}")
        return room

    def __repr__(self) -> str:
        return f"{type(self).__name__}(inner={self.inner!r})"


STRATEGIES: Mapping[str, Callable[..., AllocateMessageQueueStrategy]] = MappingProxyType(
    {
        AllocateStrategyName.AVG: AllocateMessageQueueAveragely,
        AllocateStrategyName.AVG_BY_CIRCLE: AllocateMessageQueueAveragelyByCircle,
        AllocateStrategyName.CONSISTENT_HASH: AllocateMessageQueueConsistentHash,
        AllocateStrategyName.CONFIG: AllocateMessageQueueByConfig,
        AllocateStrategyName.MACHINE_ROOM: AllocateMessageQueueByMachineRoom,
        AllocateStrategyName.MACHINE_ROOM_NEARBY: AllocateMachineRoomNearby,
    }
)
"""Built-in strategy factories by name; keyword arguments go to the constructor."""


def strategy_by_name(name: str, **kwargs: object) -> AllocateMessageQueueStrategy:
    """Build a built-in strategy from its name (case-insensitive), e.g. ``"avg"``.

    ``kwargs`` go to the strategy's constructor, e.g.
    ``strategy_by_name("MACHINE_ROOM", consume_idcs={"hz"})``.
    """
    factory = STRATEGIES.get(str(name).strip().upper())
    if factory is None:
        known = ", ".join(STRATEGIES)
        raise InvalidArgumentError(f"unknown allocation strategy {name!r}; known strategies: {known}")
    return factory(**kwargs)
