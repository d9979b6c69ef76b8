"""One fault run: a cluster of real processes, workloads, the nemesis, the read-back and the verdict.

A scenario (scenarios.py) builds its cluster with `Run`'s helpers (brokers,
replicas, name servers, each optionally behind a FaultProxy, in a network
namespace or on a small disk), adds workloads and faults, and calls
`execute`, which always goes the same way:

1. workloads start (producers, consumer groups, the offset observer);
2. the nemesis plays the seeded schedule for `duration` seconds;
3. every fault is healed; producers stop;
4. consumer groups are delivered everything stored, failing after `drain_s` without any progress
   (read back again after: a request the network held back may be stored late, and is drained too);
5. consumers stop, offsets are observed one last time, every queue is read back;
6. the checker judges the history; broker and client logs are searched for
   tracebacks and the asyncio complaints of an unowned task.

The `Outcome` holds the checker's report, the violations of what the run's
mode promises, the log findings and the nemesis log; everything is also
written to the run's directory (history.jsonl, outcome.json, the processes'
logs) so a failure can be studied, and re-run from its seed.
"""

from __future__ import annotations

import datetime
import json
import logging
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brokerproc import BrokerProcess, NamesrvProcess, free_port
from etcdproc import EtcdProcess

from tidemark.client import Admin

from .checker import Expect, Report, check
from .disk import SmallDisk
from .history import History, QueueKey
from .nemesis import Fault, Nemesis, schedule
from .netns import Host, Network
from .proxy import FaultProxy
from .workloads import Clients, OffsetObserver, Workload, read_back, wait_drained

__all__ = ["Node", "Outcome", "Run", "LOG_PROBLEMS"]

# Lines no process may log, fault or not: an unhandled exception, a task nobody owned.
LOG_PROBLEMS = re.compile(r"Traceback \(most recent call last\)|Task exception was never retrieved|"
                          r"Task was destroyed but it is pending|Unexpected \[|Failed sending|"
                          r"Exception in thread|Exception in callback|Fatal Python error")


@dataclass
class Node:
    """A broker or name server process and, when it has one, the proxy clients reach it through."""

    process: BrokerProcess | NamesrvProcess
    proxy: FaultProxy | None = None
    host: Host | None = None

    @property
    def address(self) -> str:
        """Where clients dial it."""
        return self.proxy.address if self.proxy is not None else self.process.address


@dataclass
class Outcome:
    scenario: str
    seed: int
    mode: dict[str, Any]
    report: Report
    violations: list[str]
    log_findings: list[str]
    crashes: list[str]
    nemesis: str
    workdir: Path
    elapsed_s: float
    schedule: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.violations or self.log_findings or self.crashes)

    def describe(self) -> str:
        mode = " ".join(f"{k}={v}" for k, v in self.mode.items())
        lines = [f"{self.scenario} seed={self.seed} {mode}: {'ok' if self.ok else 'FAILED'} in {self.elapsed_s:.0f} s",
                 f"  faults: {self.nemesis}", "  " + self.report.summary().replace("\n", "\n  ")]
        lines += [f"  VIOLATION {v}" for v in self.violations]
        lines += [f"  LOG {f}" for f in self.log_findings]
        lines += [f"  CRASH {c}" for c in self.crashes]
        if not self.ok:
            lines.append(f"  artifacts: {self.workdir}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "seed": self.seed, "mode": self.mode, "ok": self.ok,
                "figures": self.report.row(), "violations": self.violations, "log_findings": self.log_findings,
                "crashes": self.crashes, "nemesis": self.nemesis, "schedule": self.schedule,
                "elapsed_s": round(self.elapsed_s, 1)}


class Run:
    def __init__(self, scenario: str, seed: int, workdir: Path, *, duration: float, mode: dict[str, Any]) -> None:
        self.scenario = scenario
        self.seed = seed
        self.rng = random.Random(seed)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.duration = duration
        self.mode = dict(mode)
        self.history = History()
        self.run_id = f"r{seed}"
        self.nodes: list[Node] = []
        self.workloads: list[Workload] = []
        self.faults: list[Fault] = []
        self._closers: list[Callable[[], object]] = []
        self._net: Network | None = None
        self.nemesis: Nemesis | None = None

    # -- the cluster ------------------------------------------------------------------------------

    def network(self) -> Network:
        if self._net is None:
            self._net = Network()
            self._closers.append(self._net.close)
        return self._net

    def disk(self, size_bytes: int) -> SmallDisk:
        disk = SmallDisk(self.workdir / f"disk{len(self._closers)}", size_bytes)
        self._closers.append(disk.close)
        return disk

    def broker(self, name: str = "broker-a", *, args: Sequence[str] = (), proxied: bool = True,
               host: Host | None = None, data_dir: Path | None = None, start: bool = True) -> Node:
        """A broker; `proxied`: clients reach it through a FaultProxy (its --advertise-addr), so routes
        from name servers and brokers lead there too."""
        port = free_port()
        proc_host = host.ip if host is not None else "127.0.0.1"
        proxy = FaultProxy(f"{proc_host}:{port}", name=f"proxy-{name}-{len(self.nodes)}") if proxied else None
        extra = ("--advertise-addr", proxy.address) if proxy is not None else ()
        proc = BrokerProcess(data_dir or self.workdir / f"data-{name}-{len(self.nodes)}", port=port,
                             broker_name=name, args=(*args, *extra), host=proc_host,
                             launch=tuple(host.command([])) if host is not None else ())
        node = Node(proc, proxy, host)
        self.nodes.append(node)
        if start:
            proc.start()
        return node

    def namesrv(self, *, proxied: bool = False, host: Host | None = None) -> Node:
        proc_host = host.ip if host is not None else "127.0.0.1"
        proc = NamesrvProcess(self.workdir, host=proc_host, launch=tuple(host.command([])) if host else ())
        proxy = FaultProxy(proc.address, name=f"proxy-namesrv-{len(self.nodes)}") if proxied else None
        node = Node(proc, proxy, host)
        self.nodes.append(node)
        proc.start()
        return node

    def etcd(self) -> EtcdProcess:
        """An etcd for controller mode (tests/etcdproc.py), stopped with the run."""
        server = EtcdProcess(self.workdir / f"etcd-{len(self._closers)}").start()
        self._closers.append(server.stop)
        return server

    def proxy(self, target: str, name: str = "") -> FaultProxy:
        proxy = FaultProxy(target, name=name)
        self._closers.append(proxy.close)
        return proxy

    def clients(self, *, brokers: Iterable[Node] = (), namesrv: Iterable[Node] = (), **settings: Any) -> Clients:
        return Clients(self.run_id, self.history, brokers=tuple(n.address for n in brokers),
                       namesrv=tuple(n.address for n in namesrv), settings=settings)

    def create_topics(self, clients: Clients, topics: dict[str, int]) -> None:
        with Admin(**clients.options()) as admin:
            for topic, queues in topics.items():
                admin.create_topic(topic, queues)

    # -- the run ----------------------------------------------------------------------------------

    def execute(self, clients: Clients, expect: Expect, *, topics: Iterable[str],
                groups: dict[str, list[str]] | None = None, drain_s: float = 30.0,
                settle: Callable[[], object] | None = None) -> Outcome:
        """Run the workloads under the faults and judge the result (see the module docstring).
        `groups`: every consumer group with its topics (observed; drained if in expect.drained);
        `settle`: called after healing, before producers stop (e.g. wait for transaction checks)."""
        started = time.monotonic()
        groups = groups or {}
        steps = schedule(self.rng, self.faults, self.duration)
        capture = _ClientLogCapture(self.workdir / "clients.log")
        observer = OffsetObserver(clients, groups) if groups else None
        nemesis = self.nemesis = Nemesis(steps, self.history)
        crashes: list[str] = []
        with capture:
            for w in [*self.workloads, *([observer] if observer else [])]:
                w.start()
            for w in self.workloads:  # faults begin once every client has started (see Workload)
                if not w.ready.wait(120):
                    crashes.append(f"{w.name} did not start its clients within 120 s")
            nemesis.play(self.duration)
            for node in self.nodes:
                if node.proxy is not None:
                    node.proxy.heal()
            if settle is not None:
                settle()
            consumers = [w for w in self.workloads if w.consumes]
            for w in self.workloads:
                if w not in consumers:
                    w.stop(60)
            topics = list(topics)
            drained, missing = self._drain(clients, topics, {g: groups[g] for g in expect.drained}, drain_s)
            for w in consumers:
                w.stop(60)
            if observer is not None:
                observer.stop()
                observer.observe_once()
            stored = read_back(clients, topics)
        for w in [*self.workloads, *([observer] if observer else [])]:
            if w.is_alive():
                crashes.append(f"{w.name} did not stop")
            if w.crash is not None:
                crashes.append(f"{w.name}: {type(w.crash).__name__}: {w.crash}")
        report = check(self.history.events(), stored, expect, drained_stored=drained)
        findings = self._log_findings(capture)
        outcome = Outcome(self.scenario, self.seed, self.mode, report, report.violations(expect), findings,
                          crashes, nemesis.summary(), self.workdir, time.monotonic() - started,
                          [f"{s.at:.1f}s {s.fault.name} hold {s.hold:.1f}s" for s in steps])
        if any(missing.values()):
            outcome.report.undelivered.examples.insert(0, f"drain timed out: {missing}")
        self._save(outcome, nemesis)
        return outcome

    def _drain(self, clients: Clients, topics: list[str], groups: dict[str, list[str]], drain_s: float,
               rounds: int = 3) -> tuple[dict[QueueKey, list[tuple[int, str]]], dict[str, int]]:
        """Wait for the groups to drain what is stored, then read back again: a send the network held
        back (a request TCP retransmits seconds after a partition heals) can be stored after the
        producers stopped, and is drained too. Returns the read-back drained and what each group misses."""
        stored = read_back(clients, topics)
        for _ in range(rounds):
            missing = wait_drained(self.history, stored, groups, drain_s)
            again = read_back(clients, topics)
            if any(missing.values()) or again == stored:
                break
            stored = again
        return stored, missing

    def _log_findings(self, capture: _ClientLogCapture) -> list[str]:
        findings = []
        for node in self.nodes:
            path = node.process.log_path
            if path.exists():
                findings += [f"{path.name}: {line}" for line in _problem_lines(path.read_text("utf-8", "replace"))]
        findings += [f"client: {line}" for line in _problem_lines(capture.text())]
        return findings[:20]

    def _save(self, outcome: Outcome, nemesis: Nemesis) -> None:
        self.history.dump(self.workdir / "history.jsonl")
        doc = outcome.to_json()
        doc["nemesis_log"] = [f"{a.time:.2f} {a.fault} {a.phase} {a.detail}".strip() for a in nemesis.log]
        # Event times count from here; the processes' logs are stamped in UTC.
        doc["time_zero_utc"] = datetime.datetime.fromtimestamp(self.history.started_at, datetime.UTC).isoformat()
        (self.workdir / "outcome.json").write_text(json.dumps(doc, indent=2))

    def close(self) -> None:
        for w in self.workloads:
            w.stopping.set()
        for node in reversed(self.nodes):
            node.process.kill()
            if node.proxy is not None:
                node.proxy.close()
        for close in reversed(self._closers):
            try:
                close()
            except Exception as e:  # cleanup goes on; the next close may still matter
                print(f"cleanup of {self.scenario} seed {self.seed}: {e}", file=sys.stderr)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _problem_lines(text: str) -> list[str]:
    """Each kind of problem line once, with how often it occurred (the message, not the traceback)."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("[official client]"):
            continue
        match = LOG_PROBLEMS.search(line)
        if match:
            message = _MSG.search(line)
            key = (message.group(1) if message else line.strip())[:240]
            counts[key] = counts.get(key, 0) + 1
    return [f"{n}x {key}" for key, n in counts.items()]


_MSG = re.compile(r'msg="((?:[^"\\]|\\.)*)"')


_OFFICIAL_CLIENT = "site-packages/rocketmq/"


class _ClientLogCapture(logging.Handler):
    """The test process's log (the clients') at WARNING and above into a file for the run, plus any
    exception that escapes a thread."""

    def __init__(self, path: Path) -> None:
        super().__init__(logging.WARNING)
        self.path = path
        self._lines: list[str] = []
        self._lock2 = threading.Lock()
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:
            text = str(record.msg)
        if _OFFICIAL_CLIENT in text:
            # The official RocketMQ 5 client's own tracebacks (its heartbeat callback re-raises a failed
            # call under faults): the pop workload's peer, not Tidemark's code. Kept, marked, not a finding.
            text = "[official client] " + text.replace("\n", " | ")
        with self._lock2:
            self._lines.append(text)

    def text(self) -> str:
        with self._lock2:
            return "\n".join(self._lines)

    def __enter__(self) -> _ClientLogCapture:
        logging.getLogger().addHandler(self)
        self._hook = threading.excepthook

        def hook(args: threading.ExceptHookArgs) -> None:
            import traceback
            with self._lock2:
                self._lines.append(f"Exception in thread {args.thread.name if args.thread else '?'}:\n"
                                   + "".join(traceback.format_exception(args.exc_type, args.exc_value,
                                                                        args.exc_traceback)))
        threading.excepthook = hook
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger().removeHandler(self)
        threading.excepthook = self._hook
        self.path.write_text(self.text())
