"""Controller mode under faults: two brokers of one name on an etcd, and nobody promoting anything.

`ControlledGroup` is the cluster both scenarios use: a name server, an etcd,
brokers of one name started with `--controller`, each reaching etcd through a
FaultProxy of its own (so one broker can be cut from etcd while clients
still reach it). Its faults hit whoever is master when they begin; the
brokers they stopped come back by a restart (a fenced master stays fenced
until then) and rejoin as replicas.

- `controller`: a random mix (master killed or paused, etcd paused, client
  connections reset), replication sync or async, a 2 s lease.
- `takeover`: three brokers, one kind of fault, again and again, each begun
  only once the group is healthy (a master, and every broker in sync in
  etcd), with the default lease and `--replication sync` (min_sync_replicas
  1: the new master and the other replica keep taking writes while the old
  master restarts). `takeovers` reads how long each takeover took.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aetcd
from etcdproc import EtcdCluster, EtcdProcess

from tidemark.broker.cluster.election import Election, parse_controller
from tidemark.broker.cluster.etcd_members import EtcdMembers
from tidemark.client import Admin, TidemarkError

from . import history
from .history import Event, Kind, Phase
from .nemesis import Fault
from .run import Node, Outcome, Run

# The random mix's master lease: a master cut off from etcd stops writing within it, a replica takes over after.
CONTROLLER_LEASE_S = 2
# A takeover fault holds this long: past the default 3 s lease, the election, and the clients' route refresh.
TAKEOVER_HOLD_S = 6.0


@dataclass(frozen=True)
class Kit:
    """What every scenario builds its run with (scenarios.py hands its own helpers over)."""

    broker_args: Callable[..., tuple[str, ...]]  # (run, *extra args) -> the broker's command-line arguments
    client_settings: dict[str, Any]
    wait_registered: Callable[[Any], None]  # (clients): until the replica registered with the name server
    workload: Callable[..., None]  # (run, clients): the producers and consumer groups
    execute: Callable[..., Outcome]  # (run, clients, durable=): faults, drain, read-back, verdict


def _status(node: Node):
    """The broker's status, asked directly (not through its proxy); None when it does not answer."""
    try:
        with Admin(brokers=node.process.address, request_timeout_s=1.0) as admin:
            return admin.broker_status_at(node.process.address)
    except TidemarkError:
        return None


class ControlledGroup:
    def __init__(self, run: Run, broker_args: Callable[..., tuple[str, ...]], *, replication: str,
                 lease_s: int | None, brokers: int = 2) -> None:
        self.ns, self.etcd = run.namesrv(), run.etcd()
        [(host, port)] = parse_controller(self.etcd.url)
        self.links = [run.proxy(f"{host}:{port}", name=f"etcd-link-{i}") for i in range(brokers)]
        self.nodes = []
        for link in self.links:
            lease = ("--controller-lease-s", str(lease_s)) if lease_s is not None else ()
            args = broker_args(run, "--namesrv", self.ns.address, "--replication", replication,
                               "--controller", f"etcd://{link.address}", *lease)
            self.nodes.append(run.broker(args=args))
        self.down: list[Node] = []

    def link_of(self, node: Node):
        return self.links[self.nodes.index(node)]

    def master(self) -> Node | None:
        for node in self.nodes:
            if node.process.proc is not None and node not in self.down:
                s = _status(node)
                if s is not None and s.role == "MASTER" and s.writable:
                    return node
        return None

    def healthy(self) -> bool:
        """A writable master, and etcd records every broker in sync (each replica may be elected)."""
        return self.master() is not None and len(in_sync(self.etcd)) == len(self.nodes)

    def hit(self, action: Callable[[Node], object], what: str, *, wait_healthy_s: float = 0.0) -> Callable[[], str]:
        def begin() -> str:
            deadline = time.monotonic() + wait_healthy_s
            while wait_healthy_s and not self.healthy() and time.monotonic() < deadline:
                time.sleep(0.1)
            node = self.master()
            if node is None:
                return f"{what}: no writable master right now"
            self.down.append(node)
            action(node)
            return f"{what} {node.process.address}"
        return begin

    def rejoin(self) -> str:
        """The stopped, cut or fenced brokers back as replicas: restarted (a fenced master stays fenced until
        then)."""
        back = []
        while self.down:
            node = self.down.pop()
            self.link_of(node).blackhole(False)
            if node.process.proc is not None:  # paused or fenced, not killed: stopped first
                node.process.resume()
                node.process.stop()
            node.process.start()
            back.append(node.process.address)
        return f"restarted {', '.join(back)}"

    def etcd_back(self) -> str:
        self.etcd.resume()
        fenced = [n for n in self.nodes if _fenced(n)]
        self.down.extend(fenced)
        return self.rejoin() if fenced else "etcd answers again"


def _fenced(node: Node) -> bool:
    s = _status(node)
    return s is not None and s.role == "MASTER" and not s.writable


def in_sync(etcd: EtcdProcess | EtcdCluster) -> frozenset[int]:
    """The in-sync set the master recorded in etcd (empty when no member answers)."""
    async def read() -> frozenset[int]:
        members = EtcdMembers(parse_controller(etcd.url), call_timeout_s=1)
        try:
            return (await Election(members, "DefaultCluster", "broker-a", 0, "").view()).in_sync
        finally:
            await members.close()
    try:
        return asyncio.run(read())
    except (aetcd.exceptions.ClientError, OSError, TimeoutError):
        return frozenset()


def controller(run: Run, kit: Kit) -> Outcome:
    """Controller mode: etcd elects the master of two brokers; every fault hits whoever is master when it
    begins, and nobody promotes anything."""
    replication = run.mode["replication"]
    group = ControlledGroup(run, kit.broker_args, replication=replication, lease_s=CONTROLLER_LEASE_S)
    clients = run.clients(namesrv=[group.ns], **kit.client_settings)
    kit.wait_registered(clients)
    run.faults += [
        Fault("kill-master", group.hit(lambda n: n.process.kill(), "killed"), group.rejoin, hold=(0.5, 3.0)),
        Fault("pause-master", group.hit(lambda n: n.process.pause(), "paused"), group.rejoin, hold=(0.5, 5.0)),
        Fault("pause-etcd", group.etcd.pause, group.etcd_back, hold=(0.5, 4.0)),
        Fault("reset", lambda: [n.proxy.reset() for n in group.nodes]),
    ]
    kit.workload(run, clients)
    return kit.execute(run, clients, durable=replication == "sync")


TAKEOVER_FAULTS = ("kill", "stop", "etcd-cut")


def takeover(run: Run, kit: Kit) -> Outcome:
    """One kind of fault on the master, again and again, with the default lease and sync replication:
    kill -9, SIGSTOP (longer than the lease), or its link to etcd cut while clients still reach it."""
    group = ControlledGroup(run, kit.broker_args, replication="sync", lease_s=None, brokers=3)
    clients = run.clients(namesrv=[group.ns], **kit.client_settings)
    kit.wait_registered(clients)
    action = {"kill": lambda n: n.process.kill(), "stop": lambda n: n.process.pause(),
              "etcd-cut": lambda n: group.link_of(n).blackhole(True)}[run.mode["fault"]]
    run.faults.append(Fault(run.mode["fault"], group.hit(action, run.mode["fault"], wait_healthy_s=30.0),
                            group.rejoin, hold=(TAKEOVER_HOLD_S, TAKEOVER_HOLD_S)))
    kit.workload(run, clients)
    return kit.execute(run, clients, durable=True)


@dataclass(frozen=True)
class Takeovers:
    """What a takeover run measured: per fault, from its begin to the first acknowledged send after the
    longest stretch without one that follows it (the new master's first, or the old one's for a fault
    that hit while nothing was acknowledged); the same for deliveries, per consumer group (`delivery`:
    group -> seconds per fault; `delivery_worst`: per fault, the last group to deliver again); and what
    consumers saw twice."""

    fault: str
    seconds: list[float]
    faults_missed: int  # begun without a master to hit (the group never became healthy)
    redelivered: dict[str, int]  # group -> deliveries of a value it had been delivered before
    delivery: dict[str, list[float]] = field(default_factory=dict)
    delivery_worst: list[float] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        s = sorted(self.seconds)
        return {"fault": self.fault, "takeovers": len(s), "missed": self.faults_missed,
                "p50_s": _p50(s), "max_s": round(s[-1], 2) if s else None,
                "delivery_p50_s": _p50(self.delivery_worst),
                "delivery_max_s": round(max(self.delivery_worst), 2) if self.delivery_worst else None,
                "delivery_by_group": {g: {"p50_s": _p50(v), "max_s": round(max(v), 2)}
                                      for g, v in sorted(self.delivery.items()) if v},
                "redelivered": self.redelivered}


def _p50(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def _resumed(t: float, following: float, times: list[float], window_s: float) -> float | None:
    """Seconds from a fault at `t` to the first event after the longest stretch without one that ends after
    it (within the window and before the next fault); None when nothing happened after it."""
    inside = [a for a in times if t - 0.5 <= a <= min(t + window_s, following)]
    gaps = [(b - a, b) for a, b in zip(inside, inside[1:], strict=False) if b > t]
    return max(gaps)[1] - t if gaps else None


def takeovers(fault: str, events: list[Event], nemesis_log: list[str], *, window_s: float = 20.0) -> Takeovers:
    """Read a takeover run: its history and the nemesis log lines ("12.34 kill begin kill 127.0.0.1:5")."""
    acks = sorted(e.time for e in events if e.kind is Kind.SEND and e.phase is Phase.OK)
    deliveries: dict[str, list[float]] = {}
    for e in events:
        if e.kind is Kind.DELIVER and e.group:
            deliveries.setdefault(e.group, []).append(e.time)
    for times in deliveries.values():
        times.sort()
    lines = [line.split(" ", 3) for line in nemesis_log]
    begins = [p for p in lines if len(p) >= 3 and p[2] == "begin"]
    missed = sum(1 for p in begins if len(p) == 4 and "no writable master" in p[3])
    times = [float(p[0]) for p in begins if not (len(p) == 4 and "no writable master" in p[3])]
    seconds: list[float] = []
    delivery: dict[str, list[float]] = {g: [] for g in deliveries}
    worst: list[float] = []
    for t, following in zip(times, [*times[1:], float("inf")], strict=True):
        sent = _resumed(t, following, acks, window_s)
        if sent is not None:
            seconds.append(sent)
        per_group = [(g, _resumed(t, following, d, window_s)) for g, d in deliveries.items()]
        for g, resumed in per_group:
            if resumed is not None:
                delivery[g].append(resumed)
        if any(r is not None for _, r in per_group):
            worst.append(max(r for _, r in per_group if r is not None))
    seen: dict[str, set[str]] = {}
    redelivered: dict[str, int] = {}
    for e in history.deliveries(events):
        if e.group:
            got = seen.setdefault(e.group, set())
            if e.value in got:
                redelivered[e.group] = redelivered.get(e.group, 0) + 1
            got.add(e.value)
    return Takeovers(fault, seconds, missed, redelivered, delivery, worst)
