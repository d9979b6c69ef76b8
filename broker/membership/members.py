"""ConsumerManager: who is in each consumer group (RocketMQ's ConsumerManager).

Clients register and refresh themselves with heartbeats. A member leaves when
it unregisters, when it has been silent for the expiry (120 s by default), or
when its watch stream broke and it did not come back within the grace. Every
change of a group's member list is pushed to each watcher of the group, which
is what triggers an immediate rebalance on the clients (RocketMQ's "consumer
ids changed" notification, beside the periodic rebalance).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tidemark.common.logs import get_logger

log = get_logger("tidemark.broker.consumers")


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    client_id: str
    group: str
    subscriptions: tuple[tuple[str, str], ...] = ()  # (topic, expression)
    message_model: str = "CLUSTERING"
    consume_type: str = "CONSUME_PASSIVELY"
    orderly: bool = False
    owned_queues: tuple[tuple[str, str, int], ...] = ()
    allocate_strategy: str = ""
    host: str = ""
    last_heartbeat_ms: int = 0
    # The subscribed topics whose expression is SQL92 (the others' are tag expressions).
    sql92_topics: frozenset[str] = frozenset()


@dataclass(eq=False)
class _Watch:
    client_id: str
    queue: asyncio.Queue[list[str]] = field(default_factory=lambda: asyncio.Queue(maxsize=64))


class ConsumerManager:
    def __init__(self, *, expiry_ms: int, watch_grace_ms: int, clock_ms: Callable[[], int],
                 on_leave: Callable[[str, str], None] | None = None,
                 on_change: Callable[[str], None] | None = None) -> None:
        self._expiry_ms = expiry_ms
        self._grace_ms = watch_grace_ms
        self._clock_ms = clock_ms
        self._on_leave = on_leave or (lambda group, client_id: None)
        self._on_change = on_change or (lambda group: None)
        self._members: defaultdict[str, dict[str, ConsumerInfo]] = defaultdict(dict)
        self._watches: defaultdict[str, list[_Watch]] = defaultdict(list)
        # (group, client id) -> when its last watch stream broke
        self._broken: dict[tuple[str, str], int] = {}

    def heartbeat(self, info: ConsumerInfo) -> bool:
        """Register or refresh a client; True when it is new to the group."""
        now = self._clock_ms()
        members = self._members[info.group]
        is_new = info.client_id not in members
        members[info.client_id] = replace(info, last_heartbeat_ms=now)
        if is_new:
            log.info("consumer joined",
                     event="consumer_join", group=info.group, client_id=info.client_id, members=len(members))
            self._publish(info.group)
        return is_new

    def unregister(self, group: str, client_id: str, *, reason: str = "unregister") -> bool:
        members = self._members.get(group)
        if not members or members.pop(client_id, None) is None:
            return False
        if not members:
            del self._members[group]
        self._broken.pop((group, client_id), None)
        log.info("consumer left",
                 event="consumer_leave", group=group, client_id=client_id, reason=reason, members=len(members))
        self._on_leave(group, client_id)
        self._publish(group)
        return True

    def consumer_ids(self, group: str) -> list[str]:
        return sorted(self._members.get(group, {}))

    def members(self, group: str) -> list[ConsumerInfo]:
        return [m for _, m in sorted(self._members.get(group, {}).items())]

    def groups(self) -> list[str]:
        return sorted(self._members)

    def subscribers(self, group: str, topic: str) -> list[str]:
        """Client ids of the group's members subscribed to `topic`."""
        return [m.client_id for m in self.members(group) if any(t == topic for t, _ in m.subscriptions)]

    def message_model(self, group: str) -> str | None:
        """How the group's live members consume: BROADCASTING if any of them does, CLUSTERING if they all
        do, None without members."""
        models = {m.message_model for m in self._members.get(group, {}).values()}
        return None if not models else "BROADCASTING" if "BROADCASTING" in models else "CLUSTERING"

    def client_count(self) -> int:
        """Distinct clients with a member in any group."""
        return len({client for members in self._members.values() for client in members})

    def scan(self) -> list[tuple[str, str]]:
        """Remove expired members and members whose broken watch outlived the grace."""
        now = self._clock_ms()
        gone = []
        for group, members in list(self._members.items()):
            for client_id, info in list(members.items()):
                if now - info.last_heartbeat_ms > self._expiry_ms:
                    gone.append((group, client_id, "expired"))
        for (group, client_id), broken_at in list(self._broken.items()):
            if now - broken_at > self._grace_ms and not self._watching(group, client_id):
                gone.append((group, client_id, "watch_broken"))
        for group, client_id, reason in gone:
            self.unregister(group, client_id, reason=reason)
        return [(g, c) for g, c, _ in gone]

    def watch(self, group: str, client_id: str) -> asyncio.Queue[list[str]]:
        """Open a watch: the queue receives the group's client ids now and on every change."""
        w = _Watch(client_id)
        self._watches[group].append(w)
        self._broken.pop((group, client_id), None)
        w.queue.put_nowait(self.consumer_ids(group))
        return w.queue

    def unwatch(self, group: str, client_id: str, queue: asyncio.Queue[list[str]], *, broken: bool) -> None:
        """Close a watch; a broken one starts the grace after which the client counts as gone."""
        watches = self._watches.get(group, [])
        self._watches[group] = [w for w in watches if w.queue is not queue]
        if not self._watches[group]:
            del self._watches[group]
        if broken and client_id in self._members.get(group, {}):
            self._broken[(group, client_id)] = self._clock_ms()

    def _watching(self, group: str, client_id: str) -> bool:
        return any(w.client_id == client_id for w in self._watches.get(group, []))

    def _publish(self, group: str) -> None:
        self._on_change(group)
        ids = self.consumer_ids(group)
        for w in self._watches.get(group, []):
            if w.queue.full():
                # A slow watcher only needs the latest list.
                try:
                    w.queue.get_nowait()
                except asyncio.QueueEmpty:
                    pass
            w.queue.put_nowait(ids)
