"""Prometheus metrics of a broker, served over HTTP when metrics_port is set.

Event counters (messages in/out, commits, retries, flushes) are updated on the
event loop as things happen. State gauges (lag per group/topic/queue, store
size, clients per group, schedule backlog) are computed at scrape time by
BrokerStateCollector, which runs its snapshot on the event loop thread so it
never reads structures while they change.
"""

from __future__ import annotations

import asyncio
import platform
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tidemark.broker.version import VERSION
from tidemark.common.logs import get_logger

log = get_logger("tidemark.broker.observe.metrics")

PREFIX = "tidemark"

# No `_created` series beside every counter and histogram: rate() and increase() handle a counter that
# restarts from zero without them, and the 30-odd extra series were noise on every scrape. A
# process-wide switch of prometheus_client; a broker process exposes only its own metrics.
disable_created_metrics()


class BrokerMetrics:
    """The broker's event metrics, in their own registry (several brokers may share a process in tests)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.build = Info(f"{PREFIX}_build", "The broker's version (1 per broker; join on instance)", registry=r)
        self.build.info({"version": VERSION, "python": platform.python_version()})
        self.messages_in = Counter(f"{PREFIX}_messages_in", "Messages stored, by topic", ["topic"], registry=r)
        self.duplicate_batches = Counter(f"{PREFIX}_duplicate_batches",
                                         "Idempotent producers' retried batches answered without storing them again",
                                         registry=r)
        self.messages_out = Counter(f"{PREFIX}_messages_out", "Messages served (fetch streams and pulls), by topic",
                                    ["topic"], registry=r)
        # Bytes as stored (commit-log records: body, properties and header), the unit of disk and network use.
        self.bytes_in = Counter(f"{PREFIX}_bytes_in", "Bytes of the messages producers sent, as stored, by topic",
                                ["topic"], registry=r)
        self.bytes_out = Counter(f"{PREFIX}_bytes_out", "Bytes of the messages delivered to consumers (fetch "
                                 "streams, pulls, pops), as stored, by topic and group", ["topic", "group"],
                                 registry=r)
        self.fetch_frames = Counter(f"{PREFIX}_fetch_frames", "Frames sent on fetch streams", registry=r)
        self.fetch_streams = Gauge(f"{PREFIX}_fetch_streams", "Open fetch streams (about one per consumer)",
                                   registry=r)
        self.pull_latency = Histogram(f"{PREFIX}_pull_latency_seconds",
                                      "PullMessage duration, long-polling wait included, by status", ["status"],
                                      registry=r, buckets=(.001, .005, .01, .05, .1, .5, 1, 5, 15, 30))
        self.send_latency = Histogram(f"{PREFIX}_send_latency_seconds", "SendMessage duration", registry=r,
                                      buckets=(.0005, .001, .005, .01, .05, .1, .5, 1))
        self.offset_commits = Counter(f"{PREFIX}_offset_commits", "Offset commits applied (rate = commits/s)",
                                      ["kind"], registry=r)
        self.offset_commits_rejected = Counter(f"{PREFIX}_offset_commits_rejected", "Offset commits refused",
                                               ["reason"], registry=r)
        self.offset_flush_seconds = Histogram(f"{PREFIX}_consumer_offset_flush_seconds",
                                              "Time to write consumerOffset.json", registry=r,
                                              buckets=(.001, .005, .01, .05, .1, .25, .5, 1, 2.5))
        self.offset_file_bytes = Gauge(f"{PREFIX}_consumer_offset_file_bytes", "Size of the last consumerOffset.json",
                                       registry=r)
        self.ownership_changes = Counter(f"{PREFIX}_queue_ownership_changes",
                                         "Queue locks granted to a new owner (rebalance handovers), by group",
                                         ["group"], registry=r)
        self.membership_changes = Counter(f"{PREFIX}_rebalances",
                                          "Group membership changes pushed to consumers (each triggers a rebalance)",
                                          ["group"], registry=r)
        self.retries = Counter(f"{PREFIX}_retries", "Messages sent back for retry, by group", ["group"], registry=r)
        self.dlq = Counter(f"{PREFIX}_dlq_messages", "Messages moved to a dead-letter queue, by group", ["group"],
                           registry=r)
        self.persistence_failing = Gauge(f"{PREFIX}_persistence_failing",
                                         "1 while a part of the broker cannot write to disk (store: sends refused; "
                                         "config_files; consumer_offsets), else 0", ["part"], registry=r)
        self.persistence_failures = Counter(f"{PREFIX}_persistence_failures",
                                            "Times a part of the broker started failing to write to disk", ["part"],
                                            registry=r)
        # The children of the per-topic counters a round updates (labels() validates, converts and looks
        # them up under a lock on every call: about 1 us each, four a round).
        self._stored: dict[str, tuple[Counter, Counter]] = {}
        self._served: dict[tuple[str, str], tuple[Counter, Counter]] = {}

    def stored(self, topic: str, messages: int, nbytes: int) -> None:
        """Count messages stored in a topic (messages_in, bytes_in)."""
        children = self._stored.get(topic)
        if children is None:
            children = self._stored[topic] = (self.messages_in.labels(topic), self.bytes_in.labels(topic))
        children[0].inc(messages)
        children[1].inc(nbytes)

    def served(self, topic: str, group: str, messages: int, nbytes: int) -> None:
        """Count messages delivered from a topic to a group (messages_out, bytes_out)."""
        children = self._served.get((topic, group))
        if children is None:
            children = self._served[topic, group] = (self.messages_out.labels(topic),
                                                     self.bytes_out.labels(topic, group))
        children[0].inc(messages)
        children[1].inc(nbytes)


@dataclass
class StateSnapshot:
    lag: list[tuple[str, str, int, int]] = field(default_factory=list)
    clients: dict[str, int] = field(default_factory=dict)
    store_bytes: int = 0
    schedule_pending: int = 0
    offset_entries: int = 0
    long_polls_waiting: int = 0
    fetch_queues: int = 0
    job_runs: dict[str, int] = field(default_factory=dict)
    # (group, topic, queue id, committed offset, seconds since the oldest unconsumed message was stored)
    progress: list[tuple[str, str, int, int, float]] = field(default_factory=list)
    # (topic, queue id, min offset, max offset) of the queues groups consume
    queue_offsets: list[tuple[str, int, int, int]] = field(default_factory=list)
    disk_free_bytes: int | None = None
    # A replica: how far behind its master (commit-log bytes, and since when in ms); None on a master.
    replica_lag: tuple[int, int] | None = None
    # A master: each connected replica's acknowledged distance behind this log, in bytes.
    replicas_behind: dict[str, int] = field(default_factory=dict)
    # Per group, dead letters in %DLQ%GROUP not yet requeued.
    dlq_depth: dict[str, int] = field(default_factory=dict)
    # Pop groups, per queue popped from: (group, topic, queue id, in flight, seconds since the oldest of them
    # was handed out, how many of them are on a second or later delivery, how many are past their invisible time)
    pop_inflight: list[tuple[str, str, int, int, float, int, int]] = field(default_factory=list)


class BrokerStateCollector(Collector):
    def __init__(self, loop: asyncio.AbstractEventLoop, snapshot: Callable[[], StateSnapshot]) -> None:
        self._loop = loop
        self._snapshot = snapshot

    def describe(self) -> list:
        """Nothing up front: registering must not take a snapshot (it would wait on the event loop that
        is registering, for 5 s, and fail)."""
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        async def take() -> StateSnapshot:
            return self._snapshot()

        try:
            state = asyncio.run_coroutine_threadsafe(take(), self._loop).result(timeout=5)
        except Exception as e:  # the broker is stopping or busy: expose the event metrics only
            log.warning("metrics snapshot failed", event="metrics_snapshot_failed", error=e)
            return
        lag = GaugeMetricFamily(f"{PREFIX}_consumer_lag", "Messages not yet consumed by a group",
                                labels=["group", "topic", "queue"])
        for group, topic, queue_id, value in state.lag:
            lag.add_metric([group, topic, str(queue_id)], value)
        yield lag
        labels = ["group", "topic", "queue"]
        committed = GaugeMetricFamily(f"{PREFIX}_consumer_offset", "A group's committed offset", labels=labels)
        lag_s = GaugeMetricFamily(f"{PREFIX}_consumer_lag_seconds",
                                  "Age of the oldest message a group has not consumed (0 when caught up)", labels=labels)
        for group, topic, queue_id, offset, age in state.progress:
            committed.add_metric([group, topic, str(queue_id)], offset)
            lag_s.add_metric([group, topic, str(queue_id)], age)
        yield committed
        yield lag_s
        low = GaugeMetricFamily(f"{PREFIX}_queue_min_offset", "A queue's first offset", labels=["topic", "queue"])
        high = GaugeMetricFamily(f"{PREFIX}_queue_max_offset", "A queue's next offset", labels=["topic", "queue"])
        for topic, queue_id, lo, hi in state.queue_offsets:
            low.add_metric([topic, str(queue_id)], lo)
            high.add_metric([topic, str(queue_id)], hi)
        yield low
        yield high
        if state.disk_free_bytes is not None:
            yield GaugeMetricFamily(f"{PREFIX}_disk_free_bytes", "Free bytes on the data directory's file system",
                                    value=state.disk_free_bytes)
        clients = GaugeMetricFamily(f"{PREFIX}_group_clients", "Live clients per consumer group", labels=["group"])
        for group, n in state.clients.items():
            clients.add_metric([group], n)
        yield clients
        yield GaugeMetricFamily(f"{PREFIX}_store_size_bytes", "Bytes in commitlog and consume queues",
                                value=state.store_bytes)
        yield GaugeMetricFamily(f"{PREFIX}_schedule_pending", "Delayed messages not yet due", value=state.schedule_pending)
        yield GaugeMetricFamily(f"{PREFIX}_consumer_offset_entries", "Queue entries in the offset table",
                                value=state.offset_entries)
        yield GaugeMetricFamily(f"{PREFIX}_long_polls_waiting", "Unary pulls parked at the end of their queue",
                                value=state.long_polls_waiting)
        yield GaugeMetricFamily(f"{PREFIX}_fetch_queues", "Queues open on fetch streams (handles the broker serves "
                                "or keeps waiting for a lock)", value=state.fetch_queues)
        if state.replica_lag is not None:
            yield GaugeMetricFamily(f"{PREFIX}_replica_lag_bytes", "Commit-log bytes this replica is behind its master",
                                    value=state.replica_lag[0])
            yield GaugeMetricFamily(f"{PREFIX}_replica_lag_seconds", "How long this replica has been behind its master",
                                    value=state.replica_lag[1] / 1000)
        behind = GaugeMetricFamily(f"{PREFIX}_replica_behind_bytes",
                                   "Commit-log bytes each connected replica has not acknowledged", labels=["replica"])
        for replica, value in sorted(state.replicas_behind.items()):
            behind.add_metric([replica], value)
        yield behind
        dlq = GaugeMetricFamily(f"{PREFIX}_dlq_depth", "Dead letters of a group not yet requeued (messages in "
                                "%DLQ%GROUP past the group's requeue offset; masters only), by group",
                                labels=["group"])
        for group, n in sorted(state.dlq_depth.items()):
            dlq.add_metric([group], n)
        yield dlq
        yield from _pop_families(state.pop_inflight)
        runs = CounterMetricFamily(f"{PREFIX}_scheduler_job_runs", "Completed runs of each periodic broker task",
                                   labels=["job"])
        for job, n in sorted(state.job_runs.items()):
            runs.add_metric([job], n)
        yield runs


def _pop_families(rows: list[tuple[str, str, int, int, float, int, int]]) -> Iterator[GaugeMetricFamily]:
    """What pop groups (RocketMQ 5 consumers) hold in flight: a stuck consumer shows redelivered and overdue
    messages again and again, a slow one an old but first delivery."""
    labels = ["group", "topic", "queue"]
    families = (
        GaugeMetricFamily(f"{PREFIX}_pop_inflight_messages", "Messages a pop group received and has not acked",
                          labels=labels),
        GaugeMetricFamily(f"{PREFIX}_pop_inflight_oldest_age_seconds",
                          "How long ago the oldest in-flight message of a pop group was handed out", labels=labels),
        GaugeMetricFamily(f"{PREFIX}_pop_redelivered_messages",
                          "In-flight messages of a pop group on their second or later delivery", labels=labels),
        GaugeMetricFamily(f"{PREFIX}_pop_overdue_messages",
                          "In-flight messages of a pop group past their invisible time", labels=labels),
    )
    for group, topic, queue_id, *values in rows:
        for family, value in zip(families, values, strict=True):
            family.add_metric([group, topic, str(queue_id)], value)
    yield from families


def serve(metrics: BrokerMetrics, collector: BrokerStateCollector, host: str, port: int,
          health: Callable[[], tuple[bool, str]] = lambda: (True, "")):
    """Start the HTTP endpoint on a daemon thread; returns the server (call .shutdown() to stop).

    GET /metrics is the Prometheus text format; GET /healthz answers 200 "ok" while `health` says so (the
    broker serves, can write and its event loop answers), else 503 with the reason; any other path is 404."""
    metrics.registry.register(collector)
    registry = metrics.registry

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._answer(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                ok, why = health()
                self._answer(200 if ok else 503, b"ok\n" if ok else f"not serving: {why}\n".encode(),
                             "text/plain; charset=utf-8")
            else:
                self._answer(404, b"not found: /metrics and /healthz are served here\n", "text/plain; charset=utf-8")

        def _answer(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # scrapes are not log lines
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
