"""Past one machine, on paper: name-server, membership, rebalance and offset costs of a big cluster.

    python -m bench.scaling                       # 100 brokers, 10,000 queues, 1,000 consumers
    python -m bench.scaling --brokers 200 --queues 20000 --consumers 2000 --json out.json

Everything runs in this process, through the code the servers and clients run,
with no server and no network: the payloads are the real protobuf messages
(serialized sizes), the handlers the real ones (NameServerServicer,
MembershipServicer.Heartbeat over a ConsumerManager, the AVG allocation over
a TopicRoute, encode_offset_table + write_offset_file into --dir).

Scenario: --brokers masters; --queues queues in --topics topics (default 1),
each topic spread evenly over every broker; one consumer group of
--consumers push consumers subscribed to every topic (and, as a push consumer
does, to its %RETRY% topic, 1 queue per broker); --producers producers
sending to every topic. Each broker also registers SCHEDULE_TOPIC_XXXX.

Every figure is labelled:
  measured      timed or serialized here (timings: median of --reps runs)
  extrapolated  measured on part of the brokers, scaled linearly
  derived       arithmetic on measured figures and the timers below
  code          a default read from the code (BrokerConfig, ConsumerSettings, ...)
  cited         a figure from docs/benchmarks.md, not measured here
Sizes are deterministic; timings depend on the machine (gRPC framing, TLS and
the network are not included: they are lower bounds of the servers' CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

from bench.scaling_cluster import (
    GROUP,
    Layout,
    namesrv_case,
    retained_bytes,
    route_of,
    timed,
)
from tidemark.broker.config import BrokerConfig
from tidemark.broker.membership.members import ConsumerInfo, ConsumerManager
from tidemark.broker.namesrv.routes import DEFAULT_EXPIRY_MS
from tidemark.broker.offsets.persistence import encode_offset_table, write_offset_file
from tidemark.broker.services.membership import MembershipServicer
from tidemark.client.consumer.allocate import AllocateMessageQueueAveragely
from tidemark.client.consumer.membership import WATCH_RETRY_DELAY_S
from tidemark.client.settings import ConsumerSettings
from tidemark.common.protocol import retry_topic
from tidemark.v1 import common_pb2, membership_pb2

# broker/controller.py: s.every("scan-consumers", 1.0, ...) (not a setting).
CONSUMER_SCAN_INTERVAL_S = 1.0
# docs/benchmarks.md, "Many consume queues": 100,000 queues cost about 1.2 KB of broker RSS each.
CITED_BROKER_BYTES_PER_QUEUE = 1200


@dataclasses.dataclass
class Row:
    key: str
    label: str
    value: float
    unit: str
    kind: str


class Results:
    def __init__(self, scenario: dict) -> None:
        self.scenario = scenario
        self.rows: dict[str, Row] = {}
        self.sections: list[tuple[str, list[str]]] = []

    def section(self, title: str) -> None:
        self.sections.append((title, []))

    def add(self, key: str, label: str, value: float, unit: str, kind: str) -> float:
        self.rows[key] = Row(key, label, float(value), unit, kind)
        self.sections[-1][1].append(key)
        return float(value)

    def value(self, key: str) -> float:
        return self.rows[key].value

    def as_json(self) -> dict:
        return {"scenario": self.scenario, "machine": machine(),
                "rows": {k: dataclasses.asdict(r) for k, r in self.rows.items()}}


def machine() -> str:
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}, "
            f"{platform.system()}; load average {load}")


# -- membership ----------------------------------------------------------------------------------


class _Broker:
    """What MembershipServicer.Heartbeat touches of a BrokerController."""

    def __init__(self, consumers: ConsumerManager) -> None:
        self.consumers = consumers

    def heartbeat(self, info: ConsumerInfo) -> list[str]:
        self.consumers.heartbeat(info)
        return self.consumers.consumer_ids(info.group)

    async def flush_configs(self) -> None:
        pass


class _Context:
    @staticmethod
    def peer() -> str:
        return "ipv4:10.1.0.1:40000"


def heartbeat_request(client_id: str, topics: list[str], owned) -> membership_pb2.HeartbeatRequest:
    """A push consumer's heartbeat to one broker (GroupMembership.heartbeat -> BrokerConnection.heartbeat)."""
    return membership_pb2.HeartbeatRequest(
        client_id=client_id, group=GROUP,
        subscriptions=[common_pb2.Subscription(topic=t, expression="*") for t in sorted(topics)],
        message_model=common_pb2.CLUSTERING, consume_type=common_pb2.CONSUME_PASSIVELY, orderly=False,
        owned_queues=[common_pb2.MessageQueue(topic=q.topic, broker_name=q.broker_name, queue_id=q.queue_id)
                      for q in owned], allocate_strategy="AVG")


# -- the run -------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> Results:
    layout = Layout(args.brokers, args.queues, args.topics, args.consumers, args.producers)
    broker_defaults = {f.name: f.default for f in dataclasses.fields(BrokerConfig)}
    client_defaults = {f.name: f.default for f in dataclasses.fields(ConsumerSettings)}
    register_s = broker_defaults["register_interval_ms"] / 1000
    flush_s = broker_defaults["flush_consumer_offset_interval_ms"] / 1000
    heartbeat_s = client_defaults["heartbeat_interval_s"]
    rebalance_s = client_defaults["rebalance_interval_s"]
    route_ttl_s = client_defaults["route_refresh_interval_s"]
    grace_s = broker_defaults["watch_grace_ms"] / 1000
    expiry_s = broker_defaults["channel_expired_timeout_ms"] / 1000

    topic_queues = layout.topic_queues()
    user_topics = [t for t, _ in topic_queues]
    subscribed = user_topics + [retry_topic(GROUP)]
    routes = [route_of(layout, t, per) for t, per in topic_queues]
    routes.append(route_of(layout, retry_topic(GROUP), [1] * layout.brokers))
    cids = layout.client_ids()
    r = Results({"brokers": layout.brokers, "queues": layout.queues, "topics": layout.topics,
                 "consumers": layout.consumers, "producers": layout.producers,
                 "queues_per_broker": sum(per[0] for _, per in topic_queues),
                 "subscribed_topics": len(subscribed), "groups": args.groups, "dir": str(args.dir)})

    r.section("Timers read from the code")
    r.add("code.register_interval_s", "broker -> every name server: registration (BrokerConfig)", register_s, "s", "code")
    r.add("code.namesrv_expiry_s", "name server drops a silent broker after (routes.py)",
          DEFAULT_EXPIRY_MS / 1000, "s", "code")
    r.add("code.heartbeat_s", "client -> every broker: heartbeat (ConsumerSettings)", heartbeat_s, "s", "code")
    r.add("code.rebalance_s", "periodic rebalance, re-reads every route (ConsumerSettings)", rebalance_s, "s", "code")
    r.add("code.route_ttl_s", "route / cluster view cached for (ClientSettings)", route_ttl_s, "s", "code")
    r.add("code.watch_grace_s", "broken watch stream counts as a leave after (BrokerConfig)", grace_s, "s", "code")
    r.add("code.scan_s", "broker scans for expired members every (controller.py)",
          CONSUMER_SCAN_INTERVAL_S, "s", "code")
    r.add("code.channel_expiry_s", "silent member removed after (BrokerConfig)", expiry_s, "s", "code")
    r.add("code.watch_retry_s", "client re-opens a broken watch after (membership.py)", WATCH_RETRY_DELAY_S, "s", "code")
    r.add("code.offset_flush_s", "consumerOffset.json rewritten when changed every (BrokerConfig)",
          flush_s, "s", "code")

    # -- name server, scenario
    scenario_topics = [(t, per) for t, per in topic_queues]
    case = namesrv_case(layout, lambda b: [(t, per[b]) for t, per in scenario_topics], user_topics[0],
                        args.reps, args.entry_cap)
    kind = "measured" if case["sampled_brokers"] == layout.brokers else "extrapolated"
    r.section(f"Name server ({case['topics_per_broker']} topics per broker, system topics included)")
    reg_bytes = r.add("ns.registration_bytes", "RegisterBrokerRequest, one broker", case["registration_bytes"],
                      "B", "measured")
    reg_cpu = r.add("ns.registration_ms", "registration handling (parse + convert + register)",
                    case["register_s"] * 1000, "ms", "measured")
    reg_rate = r.add("ns.registrations_per_s", "registrations per name server (brokers / interval)",
                     layout.brokers / register_s, "/s", "derived")
    r.add("ns.registration_bytes_per_s", "registration bytes per name server", reg_rate * reg_bytes, "B/s", "derived")
    r.add("ns.registration_cpu", "name server CPU on registrations", reg_rate * reg_cpu / 10, "%core", "derived")
    route_bytes = r.add("ns.route_bytes", "GetRoute answer (TopicRoute of one topic)", case["route_bytes"], "B",
                        "measured")
    route_cpu = r.add("ns.route_ms", "GetRoute handling", case["route_s"] * 1000, "ms", "measured")
    route_rate = r.add("ns.route_per_s", "GetRoute requests (consumers x subscribed topics / rebalance interval "
                       "+ producers x topics / route TTL)", layout.consumers * len(subscribed) / rebalance_s
                       + layout.producers * len(user_topics) / route_ttl_s, "/s", "derived")
    r.add("ns.route_bytes_per_s", "GetRoute answer bytes", route_rate * route_bytes, "B/s", "derived")
    cluster_bytes = r.add("ns.cluster_bytes", "GetClusterInfo answer", case["cluster_bytes"], "B", kind)
    cluster_cpu = r.add("ns.cluster_ms", "GetClusterInfo handling", case["cluster_s"] * 1000, "ms", kind)
    cluster_rate = r.add("ns.cluster_per_s", "GetClusterInfo requests (consumers / route TTL: a heartbeat "
                         "re-reads a view 30 s old; producers read it at start)",
                         layout.consumers / route_ttl_s, "/s", "derived")
    r.add("ns.cluster_bytes_per_s", "GetClusterInfo answer bytes", cluster_rate * cluster_bytes, "B/s", "derived")
    r.add("ns.read_cpu", "CPU on client reads (all on the first name server each client lists)",
          (route_rate * route_cpu + cluster_rate * cluster_cpu) / 10, "%core", "derived")
    r.add("ns.memory", "route table memory (tracemalloc)", case["memory"], "B", kind)
    r.add("ns.memory_per_entry", "per (broker, topic) entry", case["memory_per_entry"], "B", "measured")
    r.add("ns.max_topics", "topics per broker that fit the name server's 32 MiB request limit",
          case["max_topics"], "count", "derived")

    # -- name server, topic sweep
    for k in args.sweep_topics:
        names = [f"sweep-{t:05d}" for t in range(k)]
        sweep = namesrv_case(layout, lambda b, names=names: [(n, 8) for n in names], names[0], args.reps,
                             args.entry_cap)
        kind = "measured" if sweep["sampled_brokers"] == layout.brokers else "extrapolated"
        r.section(f"Name server with {k:,} topics of 8 queues on every broker "
                  f"({sweep['sampled_brokers']} of {layout.brokers} brokers registered)")
        b = r.add(f"sweep.{k}.registration_bytes", "RegisterBrokerRequest, one broker "
                  f"({sweep['per_topic_bytes']:.0f} B per topic)", sweep["registration_bytes"], "B", "measured")
        r.add(f"sweep.{k}.build_ms", "broker: build and serialize it (every interval)", sweep["build_s"] * 1000,
              "ms", "measured")
        ms = r.add(f"sweep.{k}.registration_ms", "name server: registration handling", sweep["register_s"] * 1000,
                   "ms", "measured")
        r.add(f"sweep.{k}.registration_bytes_per_s", "registration bytes per name server", reg_rate * b, "B/s",
              "derived")
        r.add(f"sweep.{k}.registration_cpu", "name server CPU on registrations", reg_rate * ms / 10, "%core",
              "derived")
        cms = r.add(f"sweep.{k}.cluster_ms", "GetClusterInfo handling (counts every broker's topics)",
                    sweep["cluster_s"] * 1000, "ms", kind)
        r.add(f"sweep.{k}.cluster_cpu", "name server CPU on GetClusterInfo", cluster_rate * cms / 10, "%core",
              "derived")
        r.add(f"sweep.{k}.memory", "route table memory", sweep["memory"], "B", kind)

    # -- membership
    strategy = AllocateMessageQueueAveragely()
    first = cids[0]
    owned = [q for route in routes for q in strategy.allocate(GROUP, first, route.read_queues(), cids)]
    home = owned[0].broker_name
    mine = [q for q in owned if q.broker_name == home]
    hb_owning = heartbeat_request(first, subscribed, mine).SerializeToString()
    hb_other = heartbeat_request(first, subscribed, []).SerializeToString()
    per_owned = (len(hb_owning) - len(hb_other)) / max(1, len(mine))
    cm = ConsumerManager(expiry_ms=int(expiry_s * 1000), watch_grace_ms=int(grace_s * 1000), clock_ms=lambda: 0)
    servicer = MembershipServicer(_Broker(cm))  # type: ignore[arg-type]
    requests = [heartbeat_request(c, subscribed, []).SerializeToString() for c in cids]
    loop = asyncio.new_event_loop()

    async def heartbeats() -> int:
        size = 0
        for data in requests:
            request = membership_pb2.HeartbeatRequest.FromString(data)
            size = len((await servicer.Heartbeat(request, _Context())).SerializeToString())
        return size
    try:
        loop.run_until_complete(heartbeats())  # every member joins
        hb_s = timed(lambda: loop.run_until_complete(heartbeats()), args.reps) / len(cids)
        response_bytes = loop.run_until_complete(heartbeats())
    finally:
        loop.close()
    for c in cids:
        cm.watch(GROUP, c)
    joiner = layout.client_id(layout.consumers)

    def change() -> None:
        cm.heartbeat(ConsumerInfo(joiner, GROUP))
        cm.unregister(GROUP, joiner)
    publish_s = timed(change, args.reps) / 2
    ids = cm.consumer_ids(GROUP)
    push_bytes = len(membership_pb2.ConsumerIdsChanged(group=GROUP, client_ids=ids).SerializeToString())
    push_s = timed(lambda: [membership_pb2.ConsumerIdsChanged(group=GROUP, client_ids=ids).SerializeToString()
                            for _ in ids], args.reps)

    r.section("Membership (heartbeats and the consumer-ids watch)")
    r.add("hb.request_bytes_owning", f"HeartbeatRequest to the broker holding its {len(mine)} queues",
          len(hb_owning), "B", "measured")
    other = r.add("hb.request_bytes_other", "HeartbeatRequest to any other broker", len(hb_other), "B", "measured")
    resp = r.add("hb.response_bytes", f"HeartbeatResponse (all {layout.consumers:,} client ids)", response_bytes,
                 "B", "measured")
    hb_cpu = r.add("hb.broker_ms", "heartbeat handling at the broker (parse, checks, member list, answer)",
                   hb_s * 1000, "ms", "measured")
    hb_rate = r.add("hb.per_s_per_broker", "heartbeats per broker (consumers / heartbeat interval)",
                    layout.consumers / heartbeat_s, "/s", "derived")
    queues_on_broker = sum(route.queue_datas[0].read_queue_nums for route in routes)
    r.add("hb.bytes_in_per_s_per_broker", "heartbeat bytes in per broker",
          (layout.consumers * other + queues_on_broker * per_owned) / heartbeat_s, "B/s", "derived")
    r.add("hb.bytes_out_per_s_per_broker", "heartbeat answer bytes out per broker", hb_rate * resp, "B/s", "derived")
    r.add("hb.broker_cpu", "broker CPU on heartbeats", hb_rate * hb_cpu / 10, "%core", "derived")
    r.add("hb.per_s_per_client", "heartbeats sent per client (brokers / heartbeat interval)",
          layout.brokers / heartbeat_s, "/s", "derived")
    push = r.add("watch.push_bytes", "ConsumerIdsChanged push (every member's id)", push_bytes, "B", "measured")
    r.add("watch.broker_ms_per_change", f"broker CPU per join or leave (publish to {layout.consumers:,} watchers "
          "+ one push message each)", (publish_s + push_s) * 1000, "ms", "measured")
    r.add("watch.pushes_per_change", "push messages per join or leave, cluster-wide (brokers x consumers)",
          layout.brokers * layout.consumers, "count", "derived")
    r.add("watch.bytes_per_change", "push bytes per join or leave, cluster-wide",
          layout.brokers * layout.consumers * push, "B", "derived")
    r.add("watch.bytes_per_change_per_client", "push bytes each client receives per change (one per broker)",
          layout.brokers * push, "B", "derived")
    per_id = (push - len(membership_pb2.ConsumerIdsChanged(group=GROUP).SerializeToString())) / len(ids)
    r.add("watch.formation_bytes_per_broker", f"push bytes per broker while {layout.consumers:,} consumers join "
          "one by one (sum of k x list(k); less when a slow watcher's queue drops lists)",
          sum(k * (push - per_id * (layout.consumers - k)) for k in range(1, layout.consumers + 1)), "B", "derived")
    r.add("watch.list_per_s", "GetConsumerList on periodic rebalances, all at the route's first broker "
          "(consumers / rebalance interval)", layout.consumers / rebalance_s, "/s", "derived")

    # -- rebalance
    def allocation_pass() -> int:
        return sum(len(strategy.allocate(GROUP, first, route.read_queues(), cids)) for route in routes)
    pass_s = timed(allocation_pass, args.reps)
    shares = [len(strategy.allocate(GROUP, c, routes[0].read_queues(), cids)) for c in (cids[0], cids[-1])]
    r.section("Rebalance (every client allocates every subscribed topic itself)")
    r.add("rb.queues_per_consumer_max", f"queues of {user_topics[0]} for the first client (AVG)", max(shares),
          "count", "measured")
    r.add("rb.queues_per_consumer_min", f"queues of {user_topics[0]} for the last client (AVG)", min(shares),
          "count", "measured")
    cpu = r.add("rb.pass_ms", f"one client's allocation pass ({len(subscribed)} topics: sort "
                f"{sum(len(x.read_queues()) for x in routes):,} queues and {layout.consumers:,} ids, AVG)",
                pass_s * 1000, "ms", "measured")
    r.add("rb.group_cpu_s_per_change", "CPU across the group per change (consumers x one pass)",
          layout.consumers * cpu / 1000, "s", "derived")
    r.add("rb.client_cpu_s_per_change_worst", "per client, if every broker's push starts its own pass (x brokers)",
          layout.brokers * cpu / 1000, "s", "derived")
    r.add("rb.moved_on_join", f"queues of {user_topics[0]} changing owner when one client joins, its id sorting "
          "in the middle (AVG)", moved_on_join(len(routes[0].read_queues()), cids), "count", "measured")
    r.add("rb.propagation_s", "join or graceful leave, before handover: broker publish + "
                     f"{layout.consumers:,} pushes out of one broker at 1 Gbit/s + one pass",
                     r.value("watch.broker_ms_per_change") / 1000 + layout.consumers * push * 8 / 1e9 + cpu / 1000,
                     "s", "derived")
    r.add("rb.periodic_cpu", "CPU of the periodic pass, per client", cpu / rebalance_s / 10, "%core", "derived")
    r.add("rb.crash_detect_s", "a crashed client (stream reset) leaves after grace + scan",
          grace_s + CONSUMER_SCAN_INTERVAL_S, "s", "derived")
    r.add("rb.silent_detect_s", "a vanished host (no reset) leaves after expiry + scan, at most",
          expiry_s + CONSUMER_SCAN_INTERVAL_S, "s", "derived")

    # -- offsets
    r.section("consumerOffset.json (one file per broker, rewritten whole)")
    args.dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tidemark-scaling-", dir=args.dir))
    try:
        broker_share = [(t, per[0]) for t, per in topic_queues]
        whole = [(t, sum(per)) for t, per in topic_queues]
        for label, name, topics in (("per broker", "broker", broker_share), ("all queues on one broker", "all", whole)):
            for g in args.groups:
                table = offset_table(topics, g)
                entries = sum(len(q) for q in table.values())
                data = encode_offset_table(table)
                encode_s = timed(lambda table=table: encode_offset_table(table), args.reps)
                path = work / name / str(g) / "consumerOffset.json"
                write_s = timed(lambda path=path, data=data: write_offset_file(path, data), args.reps)
                key = f"off.{name}.{g}"
                r.add(f"{key}.bytes", f"{label}: {entries:,} entries ({g} group{'s' if g > 1 else ''}), size",
                      len(data), "B", "measured")
                r.add(f"{key}.encode_ms", "... encode", encode_s * 1000, "ms", "measured")
                r.add(f"{key}.write_ms", "... atomic write (temp, fsync, .bak link, rename, dir fsync)",
                      write_s * 1000, "ms", "measured")
                r.add(f"{key}.bytes_per_s", f"... bytes written per second (every {flush_s:g} s when changed)",
                      len(data) / flush_s, "B/s", "derived")
        g = min(10, max(args.groups))
        memory, _ = retained_bytes(lambda: offset_table(whole, g))
        entries = layout.queues * g + g
        r.add("off.memory_per_entry", f"broker memory per offset entry (tracemalloc, {entries:,} entries)",
              memory / entries, "B", "measured")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    r.section("Memory per queue")
    r.add("mem.broker_per_queue", "broker RSS per queue (docs/benchmarks.md, 100,000 queues)",
          CITED_BROKER_BYTES_PER_QUEUE, "B", "cited")
    r.add("mem.broker_scenario", f"broker RSS for its {r.scenario['queues_per_broker']:,} queues",
          CITED_BROKER_BYTES_PER_QUEUE * r.scenario["queues_per_broker"], "B", "derived")
    r.add("mem.offsets_per_queue_group", "plus per queue and consuming group (offset entry)",
          r.value("off.memory_per_entry"), "B", "derived")
    r.add("mem.namesrv_per_entry", "name server per (broker, topic), whatever its queue count",
          r.value("ns.memory_per_entry"), "B", "derived")
    return r


def moved_on_join(queues: int, cids: list[str]) -> int:
    """Queues whose AVG owner changes when a client whose id sorts in the middle joins.

    Allocates queue indexes (ints sort and slice exactly as MessageQueues do in AVG), which keeps
    2 x consumers allocations cheap."""
    strategy = AllocateMessageQueueAveragely()
    mid = cids[len(cids) // 2]
    joiner = mid + "0"  # sorts right after `mid`
    after = sorted([*cids, joiner])
    indexes = list(range(queues))

    def owners(members: list[str]) -> dict[int, str]:
        return {q: c for c in members for q in strategy.allocate(GROUP, c, indexes, members)}  # type: ignore[arg-type]
    before, now = owners(cids), owners(after)
    return sum(1 for q in indexes if before[q] != now[q])


def offset_table(topics: list[tuple[str, int]], groups: int) -> dict[tuple[str, str], dict[int, int]]:
    """Every group at an offset on every queue of `topics`, and on its own %RETRY% queue 0."""
    table: dict[tuple[str, str], dict[int, int]] = {}
    for g in range(groups):
        group = GROUP if g == 0 else f"{GROUP}-{g:03d}"
        for t, (topic, n) in enumerate(topics):
            table[(topic, group)] = {q: 10_000_000 + (q * 7919 + g * 104_729 + t * 31) % 90_000_000
                                     for q in range(n)}
        table[(retry_topic(group), group)] = {0: 1000 + g}
    return table


# -- output --------------------------------------------------------------------------------------


def fmt(value: float, unit: str) -> str:
    if unit in ("B", "B/s"):
        suffix = "" if unit == "B" else "/s"
        for limit, scale, name in ((1e9, 1e9, "GB"), (1e6, 1e6, "MB"), (1e4, 1e3, "kB")):
            if value >= limit:
                return f"{value / scale:,.1f} {name}{suffix}"
        return f"{value:,.0f} B{suffix}"
    if unit == "ms":
        return f"{value * 1000:,.1f} us" if value < 0.1 else f"{value:,.2f} ms"
    if unit == "%core":
        return f"{value:,.2f} % of a core" if value < 100 else f"{value / 100:,.1f} cores"
    if unit == "/s":
        return f"{value:,.1f} /s"
    if unit == "s":
        if value < 1:
            return f"{value * 1000:,.1f} ms"
        return f"{value:,.3g} s" if value < 100 else f"{value:,.0f} s"
    return f"{value:,.0f}"


def render(r: Results) -> str:
    s = r.scenario
    lines = [f"Scenario: {s['brokers']:,} brokers, {s['queues']:,} queues in {s['topics']:,} topic(s) "
             f"({s['queues_per_broker']:,} per broker), {s['consumers']:,} consumers in one group "
             f"(subscribed to {s['subscribed_topics']} topics with its %RETRY%), {s['producers']:,} producers",
             f"Machine: {machine()}", "", "| Figure | Value | How |", "|---|---|---|"]
    for title, keys in r.sections:
        lines.append(f"| **{title}** | | |")
        for key in keys:
            row = r.rows[key]
            lines.append(f"| {row.label} | {fmt(row.value, row.unit)} | {row.kind} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--brokers", type=int, default=100, help="master brokers (default 100)")
    ap.add_argument("--queues", type=int, default=10_000, help="queues in the cluster (default 10000)")
    ap.add_argument("--topics", type=int, default=1, help="topics the queues are split into (default 1)")
    ap.add_argument("--consumers", type=int, default=1_000, help="consumers in the group (default 1000)")
    ap.add_argument("--producers", type=int, default=100, help="producers, for the route rate (default 100)")
    ap.add_argument("--groups", default="1,10,100", help="group counts of the offset tables (default 1,10,100)")
    ap.add_argument("--sweep-topics", default="100,1000,10000",
                    help="topics per broker of the name-server sweep (default 100,1000,10000; '' for none)")
    ap.add_argument("--entry-cap", type=int, default=1_100_000,
                    help="register at most this many (broker, topic) entries, extrapolate past it "
                         "(default 1100000)")
    ap.add_argument("--reps", type=int, default=3, help="runs per timing, median (default 3)")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()),
                    help="where the offset files are written (a temp dir inside it, removed after)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    args.groups = [int(x) for x in args.groups.split(",") if x.strip()]
    args.sweep_topics = [int(x) for x in args.sweep_topics.split(",") if x.strip()]
    for name in ("brokers", "queues", "topics", "consumers", "reps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1")
    if args.queues < args.brokers * args.topics:
        ap.error("--queues must be at least --brokers x --topics (a queue of every topic on every broker)")
    if not args.groups or min(args.groups) < 1 or (args.sweep_topics and min(args.sweep_topics) < 1):
        ap.error("--groups and --sweep-topics take positive counts")
    return args


def main(argv: list[str] | None = None) -> Results:
    args = parse_args(argv)
    started = time.perf_counter()
    results = run(args)
    print(render(results))
    print(f"\nTook {time.perf_counter() - started:.1f} s.")
    if args.json:
        args.json.write_text(json.dumps(results.as_json(), indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
