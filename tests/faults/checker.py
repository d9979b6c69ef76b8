"""The history checker: what a fault run's clients were told, against what the queues hold.

Jepsen's queue checkers, for Tidemark's model (a message queue is topic,
broker name, queue id; offsets are entry indexes). Input: the run's history
(history.py) and the read-back: every queue read offset by offset after the
faults healed, as (offset, body value) pairs. Output: a `Report` of counts,
each with a few examples, and `Report.violations(expect)` naming what breaks
the guarantees the run's mode promises (docs/guarantees.md).

What is counted:
- lost: acknowledged sends whose value is in no queue;
- unexpected: values stored or delivered that no send invoked;
- duplicated: extra stored copies of a value (a value stored 3 times counts 2);
- recovered: sends that failed or whose outcome was unknown, stored anyway
  (allowed: the outcome was unknown), and among them `refused_stored`, sends
  refused *for certain* and stored (never allowed: the client was told
  nothing was stored);
- misplaced: acknowledgements of a stored value that is not where the
  acknowledgement says (the client was told where its message is, and it is
  elsewhere); an acknowledged value stored nowhere is `lost`, whose position
  may then hold another value (the sequence-reuse bug, an async failover);
- offsets_backwards: a group's committed offset of a queue observed lower
  than an earlier observation;
- order: for orderly groups, a message delivered for the first time after a
  later message of its queue was; for FIFO keys, a process's acknowledged
  sends of one key stored out of their acknowledgement order;
- overlap: for orderly groups, two members' listener calls with messages of
  one queue that ran at the same time (a call runs from its recorded start
  to its last delivery);
- undelivered: per draining group, stored values of its topics it never got (of those stored when
  the drain ended: a request the network held back can still be stored after it);
- windows: the longest stretch without a successful send, and without a
  delivery, while the workload ran.

Pure: no clock, no I/O. Property-tested in tests/unit/test_fault_checker.py.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from . import history
from .history import Event, Kind, Phase, QueueKey

__all__ = ["Expect", "Report", "check"]

EXAMPLES = 5


@dataclass(frozen=True)
class Expect:
    """What a run's mode promises (docs/guarantees.md)."""

    no_loss: bool = True            # durable mode: flush sync, or sync replication (and every healed run)
    no_duplicates: bool = False     # idempotence on, nothing re-sent by the application
    orderly_groups: frozenset[str] = frozenset()  # groups whose first deliveries come in queue order
    fifo: bool = False              # a process's keyed sends are stored in acknowledgement order
    # group -> the topics it consumed to the end: every stored message of them must reach it
    drained: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # Always: nothing unexpected, nothing misplaced, nothing refused-and-stored, no offset backwards.


@dataclass
class Count:
    n: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, example: str, n: int = 1) -> None:
        self.n += n
        if len(self.examples) < EXAMPLES:
            self.examples.append(example)

    def __str__(self) -> str:
        return f"{self.n}" + (f" (e.g. {'; '.join(self.examples)})" if self.n else "")


@dataclass
class Report:
    attempted: int = 0
    acknowledged: int = 0
    failed: int = 0        # refused for certain
    unknown: int = 0       # outcome unknown (INFO or never completed)
    stored: int = 0        # entries read back
    delivered: int = 0     # delivery events
    lost: Count = field(default_factory=Count)
    unexpected: Count = field(default_factory=Count)
    duplicated: Count = field(default_factory=Count)
    recovered: Count = field(default_factory=Count)
    refused_stored: Count = field(default_factory=Count)
    misplaced: Count = field(default_factory=Count)
    offsets_backwards: Count = field(default_factory=Count)
    order: Count = field(default_factory=Count)
    overlap: Count = field(default_factory=Count)
    undelivered: Count = field(default_factory=Count)
    send_gap_s: float = 0.0      # longest stretch without an acknowledged send
    delivery_gap_s: float = 0.0  # longest stretch without a delivery

    COUNTS = ("lost", "unexpected", "duplicated", "recovered", "refused_stored", "misplaced",
              "offsets_backwards", "order", "overlap", "undelivered")

    def violations(self, expect: Expect) -> list[str]:
        """What this run broke, given what its mode promises; empty when it kept every promise."""
        broken = {"unexpected", "refused_stored", "misplaced", "offsets_backwards"}
        if expect.no_loss:
            broken.add("lost")
        if expect.no_duplicates:
            broken.add("duplicated")
        if expect.orderly_groups or expect.fifo:
            broken.add("order")
        if expect.orderly_groups:
            broken.add("overlap")
        if expect.drained:
            broken.add("undelivered")
        return [f"{name}: {getattr(self, name)}" for name in self.COUNTS
                if name in broken and getattr(self, name).n]

    def row(self) -> dict[str, float | int]:
        """The figures of one run, flat (for tables and JSON)."""
        out: dict[str, float | int] = {k: getattr(self, k) for k in
                                       ("attempted", "acknowledged", "failed", "unknown", "stored", "delivered")}
        out.update({name: getattr(self, name).n for name in self.COUNTS})
        out["send_gap_s"] = round(self.send_gap_s, 2)
        out["delivery_gap_s"] = round(self.delivery_gap_s, 2)
        return out

    def summary(self) -> str:
        head = ", ".join(f"{k}={v}" for k, v in self.row().items())
        details = [f"  {name}: {getattr(self, name)}" for name in self.COUNTS if getattr(self, name).n]
        return "\n".join([head, *details])


def check(events: Iterable[Event], stored: Mapping[QueueKey, Sequence[tuple[int, str]]],
          expect: Expect = Expect(),
          drained_stored: Mapping[QueueKey, Sequence[tuple[int, str]]] | None = None) -> Report:
    """Judge a history against the read-back: `stored[q]` is every (offset, value) queue q holds; `expect`
    names the orderly groups and the groups that drained their topics (all else is counted regardless);
    `drained_stored` is the read-back the drain waited for (default `stored`): what the groups must have got."""
    events = list(events)
    report = Report()
    sends = [e for e in events if e.kind is Kind.SEND]
    invoked = {e.value for e in sends if e.phase is Phase.INVOKE}
    outcome: dict[tuple[str, str], Event] = {}
    for e in sends:
        if e.phase is not Phase.INVOKE:
            outcome[(e.process, e.value)] = e
    report.attempted = sum(1 for e in sends if e.phase is Phase.INVOKE)
    acked = [e for e in outcome.values() if e.phase is Phase.OK]
    acked_values = {e.value for e in acked}
    refused_values = {e.value for e in outcome.values() if e.phase is Phase.FAIL} - acked_values
    report.acknowledged = len(acked)
    report.failed = sum(1 for e in outcome.values() if e.phase is Phase.FAIL)
    report.unknown = report.attempted - report.acknowledged - report.failed

    copies: collections.Counter[str] = collections.Counter()
    where: dict[str, list[tuple[QueueKey, int]]] = collections.defaultdict(list)
    at: dict[tuple[QueueKey, int], str] = {}
    for queue, entries in stored.items():
        for offset, value in entries:
            copies[value] += 1
            where[value].append((queue, offset))
            at[(queue, offset)] = value
    report.stored = sum(copies.values())

    for e in sorted(acked, key=lambda e: e.time):
        if e.value not in copies:
            report.lost.add(f"{e.value} acked at {_q(e.queue)}@{e.offset} t={e.time:.2f}")
        if e.offset >= 0 and e.value in copies and (e.queue, e.offset) not in where[e.value]:
            there = at.get((e.queue, e.offset))
            report.misplaced.add(f"{e.value} acked at {_q(e.queue)}@{e.offset} which holds {there or 'nothing'}, "
                                 f"stored at {_where(where[e.value])}")
    for value, n in sorted(copies.items()):
        if value not in invoked:
            report.unexpected.add(f"{value} stored at {_where(where[value])}", n)
        elif n > 1:
            report.duplicated.add(f"{value} x{n} at {_where(where[value])}", n - 1)
    for value in sorted(invoked - acked_values):
        if value in copies:
            report.recovered.add(value)
            if value in refused_values:
                fail = next(e for e in outcome.values() if e.value == value and e.phase is Phase.FAIL)
                report.refused_stored.add(f"{value} refused ({fail.error}) but stored at {_where(where[value])}")

    deliveries = history.deliveries(events)
    report.delivered = len(deliveries)
    for e in deliveries:
        if e.value not in invoked:
            report.unexpected.add(f"{e.value} delivered to {e.group or e.process} from {_q(e.queue)}@{e.offset}")

    _offsets_backwards(events, report)
    _fifo_order(acked, report)
    _delivery_order([e for e in deliveries if e.group in expect.orderly_groups], report)
    _overlaps([e for e in events if e.kind is Kind.DELIVER and e.group in expect.orderly_groups], report)
    for group, topics in expect.drained.items():
        got = {e.value for e in deliveries if e.group == group}
        topics = set(topics)
        for queue, entries in sorted((stored if drained_stored is None else drained_stored).items()):
            if queue[0] in topics:
                for offset, value in entries:
                    if value not in got:
                        report.undelivered.add(f"{group} never got {value} ({_q(queue)}@{offset})")

    span = _span(events)
    report.send_gap_s = _longest_gap([e.time for e in acked], span)
    report.delivery_gap_s = _longest_gap([e.time for e in deliveries], span) if deliveries else 0.0
    return report


def _offsets_backwards(events: Sequence[Event], report: Report) -> None:
    last: dict[tuple[str, QueueKey], Event] = {}
    for e in events:
        if e.kind is not Kind.OFFSET or e.offset < 0:
            continue
        key = (e.group, e.queue)
        prev = last.get(key)
        if prev is not None and e.offset < prev.offset:
            report.offsets_backwards.add(f"{e.group} {_q(e.queue)}: {prev.offset} (t={prev.time:.2f}) -> "
                                         f"{e.offset} (t={e.time:.2f})")
        if prev is None or e.offset >= prev.offset:
            last[key] = e


def _fifo_order(acked: Sequence[Event], report: Report) -> None:
    """A process's acknowledged sends of one key (sent one after another) are stored in that order."""
    last: dict[tuple[str, str], Event] = {}
    for e in sorted(acked, key=lambda e: e.time):
        if not e.key or e.offset < 0:
            continue
        prev = last.get((e.process, e.key))
        if prev is not None and (prev.queue != e.queue or e.offset <= prev.offset):
            report.order.add(f"key {e.key} of {e.process}: {prev.value} at {_q(prev.queue)}@{prev.offset} "
                             f"then {e.value} at {_q(e.queue)}@{e.offset}")
        last[(e.process, e.key)] = e


def _delivery_order(deliveries: Sequence[Event], report: Report) -> None:
    """Per group and queue, first deliveries in offset order (the caller passes orderly groups only)."""
    seen: set[tuple[str, str]] = set()
    highest: dict[tuple[str, QueueKey], Event] = {}
    for e in sorted(deliveries, key=lambda e: e.time):
        if (e.group, e.value) in seen:
            continue  # a redelivery (at least once): order is judged on first deliveries
        seen.add((e.group, e.value))
        key = (e.group, e.queue)
        top = highest.get(key)
        if top is not None and e.offset < top.offset:
            report.order.add(f"{e.group} {_q(e.queue)}: {e.value}@{e.offset} first delivered after "
                             f"{top.value}@{top.offset}")
        if top is None or e.offset > top.offset:
            highest[key] = e


def _overlaps(events: Sequence[Event], report: Report) -> None:
    """Per group and queue, no two processes' listener calls at once. A call starts at its INVOKE and ends
    at the last delivery its process recorded of the queue before its next call (or the history's end)."""
    calls: dict[tuple[str, QueueKey], list[tuple[float, float, str]]] = collections.defaultdict(list)
    open_calls: dict[tuple[str, str, QueueKey], list[float]] = {}
    for e in sorted(events, key=lambda e: e.time):
        key = (e.group, e.process, e.queue)
        if e.phase is Phase.INVOKE:
            if key in open_calls:
                start, end = open_calls[key]
                calls[(e.group, e.queue)].append((start, end, e.process))
            open_calls[key] = [e.time, e.time]
        elif key in open_calls:
            open_calls[key][1] = e.time
    for (group, process, queue), (start, end) in open_calls.items():
        calls[(group, queue)].append((start, end, process))
    for (group, queue), spans in sorted(calls.items()):
        last_end: dict[str, float] = {}  # process -> the latest end of its calls so far (by start)
        for start, end, process in sorted(spans):
            for other, other_end in last_end.items():
                if other != process and other_end > start:
                    report.overlap.add(f"{group} {_q(queue)}: {process}'s call at t={start:.3f} began before "
                                       f"{other}'s ended (t={other_end:.3f})")
            last_end[process] = max(end, last_end.get(process, end))


def _span(events: Sequence[Event]) -> tuple[float, float]:
    sends = [e.time for e in events if e.kind is Kind.SEND]
    return (min(sends), max(sends)) if sends else (0.0, 0.0)


def _longest_gap(times: Sequence[float], span: tuple[float, float]) -> float:
    points = sorted([span[0], *(t for t in times if span[0] <= t <= span[1]), span[1]])
    return max((b - a for a, b in itertools.pairwise(points)), default=0.0)


def _q(queue: QueueKey) -> str:
    return f"{queue[0]}/{queue[1]}/{queue[2]}"


def _where(places: Sequence[tuple[QueueKey, int]]) -> str:
    return ", ".join(f"{_q(q)}@{o}" for q, o in places[:3]) + (" ..." if len(places) > 3 else "")
