"""ProducerTable: what the broker remembers of idempotent producers, so a retried batch is stored once.

Kafka's idempotent producer, on Tidemark's record batches. A producer asks a
broker for a **producer id** (`allocate`; a keyed producer, such as a Spark
task writing partition p of micro-batch b, gets the same id for the same key
every time). Each batch it sends carries (producer id, epoch, base sequence):
sequences count messages per (producer, topic, queue), from 0, and the batch
holds base .. base + count - 1. Per producer and queue the table keeps the
epoch, the last sequence stored, and the last `WINDOW` batches with where they
were stored. `check` decides what a batch is:

- the next one (base == last + 1, or base 0 of a newer epoch): APPEND;
- one already stored (within the last sequence): DUPLICATE, with the original
  first queue offset when the batch is still in the window, else without it
  (Spark replays a whole partition, far behind the window);
- anything else is refused and stores nothing: a batch ahead of the next
  sequence (SequenceGapError: an earlier batch has not arrived, or the broker
  lost it), an overlap that matches no stored batch (OutOfOrderSequenceError),
  an older epoch (ProducerFencedError), a producer id this broker never gave
  out or has forgotten (UnknownProducerError).

A producer keeps up to `WINDOW` batches per queue in flight (Kafka's rule,
client/producer/sequences.py) on one stream, in sequence order, so batch N+1
normally arrives right after N. When N fails on the way (a reset, a timeout),
N+1 may come first, or alone: it is refused with the retriable
SequenceGapError, and the producer sends both again, N first. A retry of any
of the last `WINDOW` batches is a duplicate answered with its original
offsets, which covers every batch a producer can have in flight.

Bounded and expiring: a producer idle for `expiry_ms` is forgotten
(`expire`), and beyond `max_producers` the least recently active one goes
first. A forgotten producer's retries get UnknownProducerError, and the
client asks for a new id.

Event-sourced like the pop ledger: operations validate, describe their change
as events (Allocated, Appended, Forgotten), hand them to the `sink` (the
journal: if it raises, nothing changes), then `apply` them, the same method
a journal replay uses. `check` changes nothing; `appended` records a stored
batch. The journal entry of a batch is written *before* the batch is appended
to the store (so a kill -9 between the two cannot leave a stored batch the
table does not know), and `drop_unstored` removes, at startup, batches the
store does not hold (the process died between the two writes). The first
message id of each batch is kept for that check.

Pure: no clock reads, no I/O.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from tidemark.broker.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError

# Batches remembered per producer and queue with their offsets (Kafka keeps 5: its max in-flight requests).
WINDOW = 5
MAX_KEY_LENGTH = 255
_MAX_INT64 = 2**63 - 1

__all__ = [
    "WINDOW", "ProducerTable", "Verdict", "Decision", "StoredBatch", "QueueSequence", "ProducerState",
    "OutOfOrderSequenceError", "SequenceGapError", "ProducerFencedError", "UnknownProducerError", "ProducerStateError",
    "Allocated", "Appended", "Forgotten", "ProducerEvent",
]


class OutOfOrderSequenceError(FailedPreconditionError):
    """A batch whose sequence does not follow the last one stored (a gap or an overlap); nothing was stored."""


class SequenceGapError(OutOfOrderSequenceError):
    """A batch ahead of the next sequence: the batch before it has not arrived (it is on its way, or failed on
    its way) or the broker lost it. Nothing was stored; the producer sends it again after the earlier one."""


class ProducerFencedError(FailedPreconditionError):
    """A batch with an epoch older than the one the broker holds for its producer and queue."""


class UnknownProducerError(NotFoundError):
    """A producer id this broker never gave out, or has forgotten (idle past the expiry, or evicted)."""


class ProducerStateError(ValueError):
    """A snapshot that is not a producer table."""


class Verdict(enum.Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    # DUPLICATE: the original batch's first queue offset, or -1 when it is older than the window.
    first_offset: int = -1


@dataclass(frozen=True, slots=True)
class StoredBatch:
    base_seq: int
    count: int
    first_offset: int
    first_msg_id: str


@dataclass(slots=True)
class QueueSequence:
    epoch: int
    last_seq: int
    recent: collections.deque[StoredBatch] = field(default_factory=lambda: collections.deque(maxlen=WINDOW))


@dataclass(slots=True)
class ProducerState:
    producer_id: int
    key: str
    created_ms: int
    last_ms: int
    queues: dict[tuple[str, int], QueueSequence] = field(default_factory=dict)


# -- events -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Allocated:
    producer_id: int
    key: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class Appended:
    producer_id: int
    epoch: int
    topic: str
    queue_id: int
    base_seq: int
    count: int
    first_offset: int
    first_msg_id: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class Forgotten:
    producer_id: int


ProducerEvent = Allocated | Appended | Forgotten


# check's answer for the next batch (one object for all: Decision is frozen).
_APPEND = Decision(Verdict.APPEND)


def _check_int(name: str, value: int, low: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= _MAX_INT64:
        raise InvalidArgumentError(f"{name} {value!r} must be an integer in {low}..{_MAX_INT64}")


class ProducerTable:
    def __init__(self, *, max_producers: int = 100_000, expiry_ms: int = 86_400_000,
                 id_floor: int = 0) -> None:
        if max_producers < 1 or expiry_ms < 1:
            raise ValueError("max_producers and expiry_ms must be >= 1")
        self.max_producers = max_producers
        self.expiry_ms = expiry_ms
        # Insertion order = least recently active first: touching a producer moves it to the end.
        self._producers: collections.OrderedDict[int, ProducerState] = collections.OrderedDict()
        self._by_key: dict[str, int] = {}
        # Ids grow across restarts: the snapshot keeps the largest, the floor (wall-clock based) covers a
        # journal tail lost in a power cut.
        self._last_id = id_floor
        self.sink: Callable[[Sequence[ProducerEvent]], None] = lambda events: None
        self.version = 0

    def __len__(self) -> int:
        return len(self._producers)

    def producers(self) -> Iterator[ProducerState]:
        return iter(self._producers.values())

    def get(self, producer_id: int) -> ProducerState | None:
        return self._producers.get(producer_id)

    # -- operations -------------------------------------------------------------------------------

    def allocate(self, key: str, now_ms: int) -> int:
        """A new producer id; for a non-empty key, the id that key already has if it has one."""
        if not isinstance(key, str) or len(key) > MAX_KEY_LENGTH or any(ord(c) < 32 for c in key):
            raise InvalidArgumentError(f"producer key must be at most {MAX_KEY_LENGTH} printable characters, "
                                       f"got {key!r:.80}")
        if key and key in self._by_key:
            producer_id = self._by_key[key]
            self._emit([Allocated(producer_id, key, now_ms)])  # refreshes its activity
            return producer_id
        events: list[ProducerEvent] = [Allocated(self._last_id + 1, key, now_ms)]
        if len(self._producers) >= self.max_producers:
            events.insert(0, Forgotten(next(iter(self._producers))))
        self._emit(events)
        return self._last_id

    def check(self, producer_id: int, epoch: int, topic: str, queue_id: int, base_seq: int,
              count: int, first_msg_id: str | Callable[[], str] = "") -> Decision:
        """What a batch is (APPEND or DUPLICATE), or the error that refuses it. Changes nothing.

        A duplicate of an unkeyed producer must also start with the stored batch's message id: a retry
        carries the same messages, so another id means the producer reused a sequence for another
        batch, and answering it as a duplicate would acknowledge messages that were never stored. (A
        keyed producer's replay, a restarted Spark task, carries the same rows under new ids.) The id
        may come as a function that reads it: only a possible duplicate needs it, and reading it out of
        the batch is a few us of every append's."""
        if not (type(epoch) is int and 0 <= epoch <= _MAX_INT64):  # (the common case without a call)
            _check_int("epoch", epoch)
        if not (type(base_seq) is int and 0 <= base_seq <= _MAX_INT64):
            _check_int("base sequence", base_seq)
        producer = self._producers.get(producer_id)
        if producer is None:
            raise UnknownProducerError(
                f"producer id {producer_id} is unknown to this broker (never given out, or forgotten after "
                f"{self.expiry_ms} ms idle or beyond {self.max_producers} producers): ask for a new one")
        state = producer.queues.get((topic, queue_id))
        if state is None or epoch > state.epoch:
            if base_seq != 0:
                raise SequenceGapError(
                    f"producer {producer_id} epoch {epoch} on {topic}:{queue_id}: the first batch must have "
                    f"sequence 0, got {base_seq} (the broker holds no sequence for it)")
            return _APPEND
        if epoch < state.epoch:
            raise ProducerFencedError(
                f"producer {producer_id} on {topic}:{queue_id}: epoch {epoch} is older than the broker's "
                f"{state.epoch}")
        if base_seq == state.last_seq + 1:
            return _APPEND
        last = base_seq + count - 1
        if last <= state.last_seq:
            for batch in state.recent:
                if batch.base_seq == base_seq and batch.count == count:
                    mine = first_msg_id() if callable(first_msg_id) else first_msg_id
                    if not producer.key and mine and batch.first_msg_id and mine != batch.first_msg_id:
                        raise OutOfOrderSequenceError(
                            f"producer {producer_id} on {topic}:{queue_id}: sequences {base_seq}..{last} hold "
                            f"another batch (first message {batch.first_msg_id}, this one {mine}); "
                            f"nothing stored")
                    return Decision(Verdict.DUPLICATE, batch.first_offset)
            if base_seq > state.last_seq - _window_span(state):
                raise OutOfOrderSequenceError(
                    f"producer {producer_id} on {topic}:{queue_id}: batch {base_seq}..{last} overlaps stored "
                    f"batches without matching one (last stored sequence {state.last_seq})")
            return Decision(Verdict.DUPLICATE)
        if base_seq > state.last_seq + 1:
            raise SequenceGapError(
                f"producer {producer_id} on {topic}:{queue_id}: expected sequence {state.last_seq + 1}, got "
                f"{base_seq} (epoch {epoch}): an earlier batch is missing")
        raise OutOfOrderSequenceError(
            f"producer {producer_id} on {topic}:{queue_id}: expected sequence {state.last_seq + 1}, got "
            f"{base_seq} (epoch {epoch})")

    def journal_append(self, producer_id: int, epoch: int, topic: str, queue_id: int, base_seq: int, count: int,
                       first_offset: int, first_msg_id: str, now_ms: int) -> Appended:
        """Journal a batch `check` accepted, before the store appends it at `first_offset` (raises OSError
        when the journal cannot be written); `apply` the event once the store has the batch. A batch the
        store then refuses leaves a journal entry only, which `drop_unstored` removes at the next start."""
        event = Appended(producer_id, epoch, topic, queue_id, base_seq, count, first_offset, first_msg_id, now_ms)
        self.sink([event])
        return event

    def will_append(self, producer_id: int, epoch: int, topic: str, queue_id: int, base_seq: int, count: int,
                    first_offset: int, first_msg_id: str, now_ms: int) -> None:
        """journal_append and apply in one (a batch stored as soon as it is journaled)."""
        self.apply(self.journal_append(producer_id, epoch, topic, queue_id, base_seq, count, first_offset,
                                       first_msg_id, now_ms))

    def expire(self, now_ms: int) -> int:
        """Forget producers idle for expiry_ms; return how many."""
        idle = [pid for pid, p in self._producers.items() if now_ms - p.last_ms >= self.expiry_ms]
        if idle:
            self._emit([Forgotten(pid) for pid in idle])
        return len(idle)

    def forget_topic(self, topic: str) -> None:
        """A deleted topic's sequences go (not journaled: a replay of its Appended events is undone by
        drop_unstored, which finds the topic's queues empty)."""
        for producer in self._producers.values():
            for key in [k for k in producer.queues if k[0] == topic]:
                del producer.queues[key]
        self.version += 1

    def drop_unstored(self, stored: Callable[[str, int, int, int, str], bool]) -> int:
        """At startup: remove the newest batches of each queue that the store does not hold
        (`stored(topic, queue_id, first_offset, count, first_msg_id)`), rolling the last sequence back to
        before them; return how many went. Only the newest can be missing: journal first, store second."""
        dropped = 0
        for producer in self._producers.values():
            for key, state in list(producer.queues.items()):
                while state.recent and not stored(key[0], key[1], state.recent[-1].first_offset,
                                                  state.recent[-1].count, state.recent[-1].first_msg_id):
                    batch = state.recent.pop()
                    state.last_seq = batch.base_seq - 1
                    dropped += 1
                if state.last_seq < 0 and not state.recent:
                    del producer.queues[key]
        if dropped:
            self.version += 1
        return dropped

    # -- events -----------------------------------------------------------------------------------

    def _emit(self, events: Sequence[ProducerEvent]) -> None:
        self.sink(events)
        for event in events:
            self.apply(event)

    def apply(self, event: ProducerEvent) -> bool:
        """Apply one event (live or replayed); False when it does not fit the state (skipped)."""
        self.version += 1
        if type(event) is Appended:  # first: one per stored batch
            producer = self._producers.get(event.producer_id)
            if producer is None:
                return False
            key = (event.topic, event.queue_id)
            state = producer.queues.get(key)
            if state is None or event.epoch > state.epoch:
                state = producer.queues[key] = QueueSequence(event.epoch, -1)
            elif event.epoch < state.epoch or event.base_seq <= state.last_seq:
                return False
            state.last_seq = event.base_seq + event.count - 1
            state.recent.append(StoredBatch(event.base_seq, event.count, event.first_offset, event.first_msg_id))
            self._touch(producer, event.at_ms)
            return True
        if isinstance(event, Allocated):
            producer = self._producers.get(event.producer_id)
            if producer is None:
                producer = ProducerState(event.producer_id, event.key, event.at_ms, event.at_ms)
                self._producers[event.producer_id] = producer
                if event.key:
                    self._by_key[event.key] = event.producer_id
            self._touch(producer, event.at_ms)
            self._last_id = max(self._last_id, event.producer_id)
            return True
        producer = self._producers.pop(event.producer_id, None)  # Forgotten
        if producer is None:
            return False
        if producer.key:
            self._by_key.pop(producer.key, None)
        return True

    def _touch(self, producer: ProducerState, now_ms: int) -> None:
        if now_ms > producer.last_ms:
            producer.last_ms = now_ms
        self._producers.move_to_end(producer.producer_id)

    # -- snapshot ---------------------------------------------------------------------------------

    def snapshot(self) -> dict:
        return {
            "lastProducerId": self._last_id,
            "producers": [
                {"id": p.producer_id, "key": p.key, "created": p.created_ms, "last": p.last_ms,
                 "queues": [[topic, queue_id, s.epoch, s.last_seq,
                             [[b.base_seq, b.count, b.first_offset, b.first_msg_id] for b in s.recent]]
                            for (topic, queue_id), s in p.queues.items()]}
                for p in self._producers.values()],
        }

    @classmethod
    def from_snapshot(cls, doc: dict, *, max_producers: int = 100_000, expiry_ms: int = 86_400_000,
                      id_floor: int = 0) -> ProducerTable:
        table = cls(max_producers=max_producers, expiry_ms=expiry_ms, id_floor=id_floor)
        try:
            table._last_id = max(id_floor, _int(doc["lastProducerId"]))
            for p in doc["producers"]:
                producer = ProducerState(_int(p["id"]), _str(p["key"]), _int(p["created"]), _int(p["last"]))
                for topic, queue_id, epoch, last_seq, recent in p["queues"]:
                    state = QueueSequence(_int(epoch), _int(last_seq, low=-1))
                    for base_seq, count, first_offset, msg_id in recent:
                        state.recent.append(StoredBatch(_int(base_seq), _int(count), _int(first_offset),
                                                        _str(msg_id)))
                    producer.queues[(_str(topic), _int(queue_id))] = state
                table._producers[producer.producer_id] = producer
                if producer.key:
                    table._by_key[producer.key] = producer.producer_id
                table._last_id = max(table._last_id, producer.producer_id)
        except (KeyError, TypeError, ValueError) as e:
            raise ProducerStateError(f"not a producer table ({type(e).__name__}: {e})") from None
        return table


def _window_span(state: QueueSequence) -> int:
    """How many sequences back the window reaches (a batch starting there or later must match one)."""
    return state.last_seq - state.recent[0].base_seq + 1 if state.recent else 0


def _int(value: object, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= _MAX_INT64:
        raise ValueError(f"{value!r} is not an integer in {low}..{_MAX_INT64}")
    return value


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a string")
    return value
