"""bench.scaling's cluster on paper and its name-server case: the layout of brokers, topics and clients,
what each broker registers, and what the name server's handlers cost over a table of such registrations
(sampled when the table would be too big to build, then scaled). Measuring helpers shared with
bench/scaling.py's other cases sit here too."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import statistics
import time
import tracemalloc
from collections.abc import Callable

from tidemark.broker.namesrv.routes import DEFAULT_EXPIRY_MS, RouteTable
from tidemark.broker.namesrv.server import MAX_REQUEST_BYTES
from tidemark.broker.namesrv.service import NameServerServicer, registration
from tidemark.client.types import QueueData, TopicRoute
from tidemark.common.protocol import DEFAULT_DELAY_LEVELS, SCHEDULE_TOPIC, retry_topic
from tidemark.v1 import admin_pb2, namesrv_pb2

GROUP = "scaling-group"
UPTIME_MS = 7 * 24 * 3600 * 1000  # a registration from a broker up for a week (varint width)


def split(total: int, parts: int) -> list[int]:
    """`total` spread over `parts` as evenly as possible, the first ones taking the remainder."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def timed(fn: Callable[[], object], reps: int) -> float:
    """Median wall time of fn() in seconds."""
    samples = []
    for _ in range(max(1, reps)):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def retained_bytes(build: Callable[[], object]) -> tuple[int, object]:
    """Bytes still allocated (tracemalloc) once build() returned, with what it built kept alive."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        built = build()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before, built
    finally:
        tracemalloc.stop()


# -- the cluster ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Layout:
    brokers: int
    queues: int
    topics: int
    consumers: int
    producers: int

    def broker_name(self, b: int) -> str:
        return f"broker-{b:0{max(3, len(str(self.brokers - 1)))}d}"

    @staticmethod
    def address(b: int) -> str:
        return f"10.0.{b // 256 % 256}.{b % 256}:10911"

    def topic_name(self, t: int) -> str:
        return f"topic-{t:0{max(3, len(str(self.topics - 1)))}d}"

    @staticmethod
    def client_id(i: int) -> str:
        return f"10.{1 + i // 65536}.{i // 256 % 256}.{i % 256}@{20000 + i}"  # ip@pid, as clients make it

    def topic_queues(self) -> list[tuple[str, list[int]]]:
        """(topic, queues on each broker) for every user topic."""
        return [(self.topic_name(t), split(total, self.brokers))
                for t, total in enumerate(split(self.queues, self.topics))]

    def client_ids(self) -> list[str]:
        return sorted(self.client_id(i) for i in range(self.consumers))


def registration_request(layout: Layout, b: int, topics: list[tuple[str, int]]) -> namesrv_pb2.RegisterBrokerRequest:
    """What broker b sends every register interval (BrokerController.registration): every topic config."""
    delay_levels = len(DEFAULT_DELAY_LEVELS.split())
    configs = [(name, n, False) for name, n in topics if n > 0]
    configs += [(SCHEDULE_TOPIC, delay_levels, True), (retry_topic(GROUP), 1, True)]
    return namesrv_pb2.RegisterBrokerRequest(broker=namesrv_pb2.BrokerRegistration(
        cluster_name="DefaultCluster", broker_name=layout.broker_name(b), broker_id=0, address=layout.address(b),
        version="0.1.0", readable=True, writable=True, uptime_ms=UPTIME_MS,
        topics=[admin_pb2.TopicConfig(name=name, read_queue_nums=n, write_queue_nums=n, readable=True,
                                      writable=True, system=system) for name, n, system in sorted(configs)]))


def route_of(layout: Layout, topic: str, per_broker: list[int]) -> TopicRoute:
    return TopicRoute(topic, tuple(QueueData(layout.broker_name(b), layout.address(b), n, n, True, True)
                                   for b, n in enumerate(per_broker) if n > 0))


# -- name server ---------------------------------------------------------------------------------


class _NameServer:
    """A NameServerServicer over a RouteTable, filled with `brokers` registrations (sampled when big)."""

    def __init__(self, layout: Layout, user_topics: Callable[[int], list[tuple[str, int]]], brokers: int) -> None:
        self.loop = asyncio.new_event_loop()
        base = user_topics(0)
        template = registration_request(layout, 0, base)
        self.requests = [template.SerializeToString()]
        for b in range(1, brokers):
            topics = user_topics(b)
            if topics == base:  # the same topics: copy the template's (fast even for 10,000 topics)
                r = namesrv_pb2.RegisterBrokerRequest()
                r.CopyFrom(template)
                r.broker.broker_name, r.broker.address = layout.broker_name(b), layout.address(b)
            else:
                r = registration_request(layout, b, topics)
            self.requests.append(r.SerializeToString())
        self.now = 1_000_000
        self.servicer: NameServerServicer | None = None

    def fill(self) -> RouteTable:
        table = RouteTable(DEFAULT_EXPIRY_MS)
        for data in self.requests:
            table.register(registration(namesrv_pb2.RegisterBrokerRequest.FromString(data).broker), self.now)
        return table

    def serve(self, table: RouteTable) -> None:
        self.servicer = NameServerServicer(table, lambda: self.now)

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def register_pass(self) -> float:
        """Seconds to take one renewal from every broker: parse, convert, RouteTable.register."""
        async def go() -> float:
            started = time.perf_counter()
            for data in self.requests:
                request = namesrv_pb2.RegisterBrokerRequest.FromString(data)
                (await self.servicer.RegisterBroker(request, None)).SerializeToString()
            return time.perf_counter() - started
        return self.run(go())

    def answer(self, method: str, request, calls: int) -> tuple[int, float]:
        """(response bytes, seconds per call: parse the request, run the handler, serialize)."""
        data = request.SerializeToString()
        handler = getattr(self.servicer, method)

        async def go() -> tuple[int, float]:
            started = time.perf_counter()
            for _ in range(calls):
                answer = (await handler(type(request).FromString(data), None)).SerializeToString()
            return len(answer), (time.perf_counter() - started) / calls
        return self.run(go())

    def close(self) -> None:
        self.loop.close()


def namesrv_case(layout: Layout, user_topics: Callable[[int], list[tuple[str, int]]], route_topic: str,
                 reps: int, entry_cap: int) -> dict:
    """Registration, GetRoute, GetClusterInfo and table memory for one topic count per broker."""
    per_broker = len(registration_request(layout, 0, user_topics(0)).broker.topics)
    sampled = max(1, min(layout.brokers, entry_cap // per_broker))
    scale = layout.brokers / sampled
    ns = _NameServer(layout, user_topics, sampled)
    try:
        memory, table = retained_bytes(ns.fill)
        ns.serve(table)
        register_s = timed(ns.register_pass, reps) / sampled
        route_bytes, route_s = ns.answer("GetRoute", admin_pb2.GetRouteRequest(topic=route_topic), 200)
        _, probe_s = ns.answer("GetClusterInfo", namesrv_pb2.GetClusterInfoRequest(), 1)
        calls = max(1, min(50, int(0.1 / max(probe_s, 1e-6))))  # about 100 ms of calls
        cluster_bytes, cluster_s = ns.answer("GetClusterInfo", namesrv_pb2.GetClusterInfoRequest(), calls)
    finally:
        ns.close()
    reg_bytes = len(ns.requests[0])
    bare = namesrv_pb2.RegisterBrokerRequest.FromString(ns.requests[0])
    del bare.broker.topics[:]
    header = len(bare.SerializeToString())
    per_topic = (reg_bytes - header) / per_broker
    build_s = timed(lambda: registration_request(layout, 0, user_topics(0)).SerializeToString(), reps)
    return {"topics_per_broker": per_broker, "sampled_brokers": sampled, "registration_bytes": reg_bytes,
            "register_s": register_s, "route_bytes": route_bytes, "route_s": route_s,
            "cluster_bytes": round(cluster_bytes * scale), "cluster_s": cluster_s * scale,
            "memory": memory * scale, "memory_per_entry": memory / (sampled * per_broker),
            "per_topic_bytes": per_topic, "build_s": build_s, "max_topics": (MAX_REQUEST_BYTES - header) // per_topic}
