"""History: every client operation of a fault run, as it happened, for the checker to judge.

In the manner of Jepsen's histories. A send is two events: its invocation and
its completion, which is one of
- OK: the broker acknowledged it, naming the queue and offset it says it
  stored the message at;
- FAIL: refused for certain (the error says nothing was stored: a bad
  request, a permission, an out-of-order sequence, no in-sync replica);
- INFO: the outcome is unknown (a timeout, a reset mid-call, a broker that
  went away): stored or not, the checker will find out from the read-back.
A send that never completes (the run ended first) counts as INFO.

Deliveries (a consumer's listener got a message) and offset observations (a
group's committed offset of a queue, as the broker answered it) are single
events; an orderly listener's call also records its start (a delivery's
INVOKE, `call_started`), so that the checker can tell two members' calls of
one queue that overlapped. Every message body carries a unique value, so reading the queues
back at the end tells which sends were stored, where, and how often.

Recording is thread-safe and cheap (a lock and an append); `dump`/`load`
keep a history as JSON lines beside a failing run's logs, so a finding can be
checked again without running the faults again.
"""

from __future__ import annotations

import enum
import json
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["Event", "History", "Kind", "Phase", "QueueKey"]

# (topic, broker name, queue id): a message queue, as the product names it.
QueueKey = tuple[str, str, int]


class Kind(enum.Enum):
    SEND = "send"
    DELIVER = "deliver"
    OFFSET = "offset"  # a committed offset observed


class Phase(enum.Enum):
    INVOKE = "invoke"
    OK = "ok"
    FAIL = "fail"  # definitely not done
    INFO = "info"  # unknown whether done


@dataclass(frozen=True, slots=True)
class Event:
    kind: Kind
    phase: Phase
    process: str
    value: str = ""           # the body id (sends, deliveries)
    time: float = 0.0         # seconds since the history began
    topic: str = ""
    broker: str = ""
    queue_id: int = -1
    offset: int = -1          # acknowledged / delivered queue offset, or the committed offset observed
    group: str = ""           # deliveries and offsets: the consumer group ("" for a group-less reader)
    key: str = ""             # sends: the FIFO key (sharding key / message group), if any
    error: str = ""           # FAIL/INFO: the error's class and message

    @property
    def queue(self) -> QueueKey:
        return (self.topic, self.broker, self.queue_id)

    def to_json(self) -> str:
        doc = {k: v for k, v in asdict(self).items() if v not in ("", -1)}
        doc["kind"], doc["phase"] = self.kind.value, self.phase.value
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> Event:
        doc = json.loads(line)
        doc["kind"], doc["phase"] = Kind(doc["kind"]), Phase(doc["phase"])
        return cls(**doc)


def deliveries(events: list[Event]) -> list[Event]:
    """One event per delivery: its end (OK, or FAIL when the listener failed). An orderly listener's call is
    also recorded at its start (`History.call_started`, Phase.INVOKE), which is not another delivery."""
    return [e for e in events if e.kind is Kind.DELIVER and e.phase is not Phase.INVOKE]


class History:
    """An append-only, thread-safe list of events with times relative to its creation."""

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self._events: list[Event] = list(events)
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self.started_at = time.time()  # the wall clock at time 0, to line events up with the processes' logs

    def now(self) -> float:
        return time.monotonic() - self._t0

    def add(self, kind: Kind, phase: Phase, process: str, **fields: object) -> Event:
        event = Event(kind, phase, process, time=self.now(), **fields)  # type: ignore[arg-type]
        with self._lock:
            self._events.append(event)
        return event

    # -- the common shapes ------------------------------------------------------------------------

    def invoke_send(self, process: str, value: str, topic: str, key: str = "") -> None:
        self.add(Kind.SEND, Phase.INVOKE, process, value=value, topic=topic, key=key)

    def send_ok(self, process: str, value: str, queue: QueueKey, offset: int, key: str = "") -> None:
        self.add(Kind.SEND, Phase.OK, process, value=value, topic=queue[0], broker=queue[1],
                 queue_id=queue[2], offset=offset, key=key)

    def send_failed(self, process: str, value: str, topic: str, error: BaseException, *, definite: bool) -> None:
        self.add(Kind.SEND, Phase.FAIL if definite else Phase.INFO, process, value=value, topic=topic,
                 error=f"{type(error).__name__}: {error}"[:300])

    def delivered(self, process: str, group: str, value: str, queue: QueueKey, offset: int) -> None:
        self.add(Kind.DELIVER, Phase.OK, process, value=value, group=group, topic=queue[0], broker=queue[1],
                 queue_id=queue[2], offset=offset)

    def call_started(self, process: str, group: str, value: str, queue: QueueKey, offset: int) -> None:
        """An orderly listener call begins with the message `value` (its deliveries, at its end, close it)."""
        self.add(Kind.DELIVER, Phase.INVOKE, process, value=value, group=group, topic=queue[0], broker=queue[1],
                 queue_id=queue[2], offset=offset)

    def offset_seen(self, process: str, group: str, queue: QueueKey, offset: int) -> None:
        self.add(Kind.OFFSET, Phase.OK, process, group=group, topic=queue[0], broker=queue[1],
                 queue_id=queue[2], offset=offset)

    # -- reading ----------------------------------------------------------------------------------

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events())

    def __len__(self) -> int:
        with self._lock:
            return len(self._events)

    def dump(self, path: Path) -> None:
        path.write_text("".join(e.to_json() + "\n" for e in self.events()))

    @classmethod
    def load(cls, path: Path) -> History:
        return cls(Event.from_json(line) for line in path.read_text().splitlines() if line.strip())
