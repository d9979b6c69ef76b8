"""BrokerStatus: what `tidemark broker status` shows (RocketMQ's brokerStatus), read off the controller.

One frozen snapshot taken on the event loop thread: nothing here changes state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidemark.broker.observe.metrics import PREFIX

if TYPE_CHECKING:
    from tidemark.broker.controller import BrokerController


@dataclass(frozen=True, slots=True)
class BrokerStatus:
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
    master_addr: str
    replication_mode: str
    replica_lag_bytes: int
    replicas: int  # connected
    # Of those, the broker ids in sync (ReplicationSource.in_sync_replicas, as the name servers get them):
    # connected says nothing of what a replica holds; in sync, that it acknowledged the master's state and
    # its log (an async master bounds its readers only while one is).
    in_sync_replicas: tuple[int, ...]
    consumer_clients: int
    fetch_streams: int
    topics: int
    system_topics: int
    groups: int
    readable: bool
    writable: bool


def broker_status(b: BrokerController, version: str) -> BrokerStatus:
    c = b.config
    topics = b.topics.list(include_system=True)
    system = sum(t.system for t in topics)
    streams = b.metrics.registry.get_sample_value(f"{PREFIX}_fetch_streams") or 0
    return BrokerStatus(
        broker_name=c.broker_name, broker_addr=c.address, version=version,
        uptime_ms=max(0, b.clock_ms() - b.started_ms), store_size_bytes=b.store.store_size_bytes(),
        commit_log_min_offset=b.store.commit_log_min_offset, commit_log_max_offset=b.store.commit_log_max_offset,
        flush_mode=c.flush.value, role="REPLICA" if c.broker_id else "MASTER", broker_id=c.broker_id,
        master_addr=c.master if c.broker_id else "", replication_mode=c.replication.value,
        replica_lag_bytes=b.replica.lag_bytes if b.replica is not None else 0,
        replicas=len(b.replication.replicas()) if b.replication is not None else 0,
        in_sync_replicas=tuple(b.replication.in_sync_replicas()) if b.replication is not None else (),
        consumer_clients=b.consumers.client_count(), fetch_streams=int(streams),
        topics=len(topics) - system, system_topics=system, groups=len(b.known_groups()),
        readable=b.permission.readable, writable=b.permission.writable)
