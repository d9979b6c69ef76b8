"""The broker's state gauges for a metrics scrape: what the offset table, the store, the replicas and the
consumer groups hold right now, read on the event loop thread (BrokerStateCollector asks for it there).

Event counters live in BrokerMetrics and move as things happen; everything here is recomputed per
scrape, so a restart never resets it (the DLQ depth, unlike tidemark_dlq_messages_total, survives one).
"""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from tidemark.broker.observe.metrics import StateSnapshot
from tidemark.common.protocol import DLQ_GROUP_TOPIC_PREFIX

if TYPE_CHECKING:
    from tidemark.broker.controller import BrokerController


def take_snapshot(b: BrokerController) -> StateSnapshot:
    state = StateSnapshot(store_bytes=b.store.store_size_bytes(), schedule_pending=b.schedule.pending(),
                          offset_entries=b.offsets.entry_count(), long_polls_waiting=b.hold.waiting(),
                          fetch_queues=b.hold.watching(),
                          job_runs={name: runs for name, _interval, runs in b.scheduler.jobs()})
    if b.replica is not None:
        state.replica_lag = (b.replica.lag_bytes, b.replica.lag_ms)
    if b.replication is not None:
        end = b.store.commit_log_max_offset
        state.replicas_behind = {key: max(0, end - acked) for key, acked in b.replication.replicas().items()}
    _group_progress(b, state)
    if b.replica is None:  # a replica mirrors its master's DLQ and offsets: counted once, on the master
        state.dlq_depth = dlq_depth(b)
    try:
        state.disk_free_bytes = shutil.disk_usage(b.config.data_dir).free
    except OSError:
        pass
    for group in b.consumers.groups():
        state.clients[group] = len(b.consumers.consumer_ids(group))
    _pop_inflight(b, state)
    return state


def _pop_inflight(b: BrokerController, state: StateSnapshot) -> None:
    now = b.clock_ms()
    for group, rows in b.pop.inflight_by_group().items():
        for row in rows:
            age = max(0.0, (now - row.oldest_received_ms) / 1000) if row.oldest_received_ms else 0.0
            state.pop_inflight.append((group, row.topic, row.queue_id, row.inflight, age, row.redelivered,
                                       row.overdue))


def _group_progress(b: BrokerController, state: StateSnapshot) -> None:
    """Lag in messages and seconds, and the committed offset, of every (group, topic, queue) in the table."""
    now, seen = b.clock_ms(), set()
    for group in b.offsets.groups():
        for topic in b.offsets.topics_of_group(group):
            config = b.topics.get(topic)
            if config is None:
                continue
            max_offsets = {q: b.store.max_offset(topic, q) for q in range(config.queue_nums)}
            for queue_id, lag in sorted(b.offsets.lag(group, topic, max_offsets).items()):
                state.lag.append((group, topic, queue_id, lag))
                committed = b.offsets.query(group, topic, queue_id)
                stored = b.store.store_timestamp_at(topic, queue_id, max(committed, 0)) if lag else None
                state.progress.append((group, topic, queue_id, committed,
                                       max(0.0, (now - stored) / 1000) if stored else 0.0))
                if (topic, queue_id) not in seen:
                    seen.add((topic, queue_id))
                    state.queue_offsets.append((topic, queue_id, b.store.min_offset(topic, queue_id),
                                                max_offsets[queue_id]))


def dlq_depth(b: BrokerController) -> dict[str, int]:
    """Per group, the dead letters on this broker past its requeue mark: the messages of %DLQ%GROUP after
    the group's own offset on that topic (`tidemark dlq requeue --all` moves it over what it sent; a
    letter requeued alone past the mark stays counted), from the queue's first retained message."""
    depth: dict[str, int] = {}
    for config in b.topics.list(include_system=True):
        topic = config.name
        if not topic.startswith(DLQ_GROUP_TOPIC_PREFIX):
            continue
        group = topic[len(DLQ_GROUP_TOPIC_PREFIX):]
        total = 0
        for queue_id in range(config.queue_nums):
            start = max(b.store.min_offset(topic, queue_id), b.offsets.query(group, topic, queue_id))
            total += max(0, b.store.max_offset(topic, queue_id) - start)
        depth[group] = total
    return depth
