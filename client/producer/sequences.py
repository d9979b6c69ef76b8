"""Sequences of an idempotent producer: a producer id per broker, an epoch, a next sequence and a window per queue.

The broker stores a batch once per (producer id, epoch, sequence), accepts a
batch only right after the one before it, and answers a retry of any of the
last five batches as a duplicate with its original offsets
(broker/producers/table.py). The producer keeps, per queue, up to
`max_in_flight` batches on their way (Kafka's rule: 5), numbered in the order
they are written to the broker's stream, so in the normal case they arrive in
order and are stored in order.

`QueueSequence.window` holds the queue's batches whose outcome is not settled,
in sequence order; each is a `Slot` with its numbers. A batch is admitted
(numbered) only while the window has room and the queue is not recovering.
Any failed attempt puts the queue into recovery: nothing new is admitted, and
the window's batches are tried again one at a time, the oldest first (a batch
waits for its `turn`), until the window is empty. Then the earlier batch is
settled before a later one is tried, as with one batch in flight.

How numbers move:
- a batch stored (or answered as a duplicate): settled, it leaves the window;
- SequenceGapError (it came before a batch ahead of it, or the broker lost
  the queue's state): nothing stored under these numbers; it waits for its
  turn and tries again. A gap answered to the oldest batch with current
  numbers means the broker lost the state: a new epoch;
- a batch the broker refused (`attempts.outcome_of(error)` is REFUSED: a bad
  request, a permission, an unknown topic): settled, not stored. The batches
  numbered after it would leave a gap: a new epoch for them;
- any other failure leaves the outcome unknown (a timeout, a reset mid-call,
  an internal error, a cancelled send): the batch was stored or not, and so,
  maybe, the batches after it (`Slot.doubt`). Its retries reuse its numbers
  (the broker answers a stored one as a duplicate); once the producer gives up
  on it, the queue moves to a new epoch. Reusing numbers for a *different*
  batch would be acknowledged with the first batch's offsets and never stored:
  the one thing this module must not allow, whatever the error. So a batch's
  numbers change (`renumber`, into the queue's current epoch, at its turn)
  only while no attempt under them is in doubt: its last answer said nothing
  was stored (a gap, an older epoch fenced by our own newer one);
- OutOfOrderSequenceError (an overlap the broker cannot match): nothing was
  stored; a new epoch;
- UnknownProducerError (the broker forgot the id): a new id for that broker,
  every queue of it starts again.

A keyed producer (`producer_key`, the Spark sink's query and partition) gets
the same id from the broker on every start and starts each queue at sequence 0
of `producer_epoch` (the sink's micro-batch id, shifted): a replay of the same
batches is recognised as duplicates, and the next micro-batch starts a newer
epoch.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tidemark.client.errors import QueueInDoubtError
from tidemark.client.message import MessageQueue

# The broker remembers this many batches per producer and queue (broker/producers/table.py WINDOW): more in
# flight and a retried batch could be older than what the broker can answer with its offsets.
MAX_IN_FLIGHT_PER_QUEUE = 5


@dataclass(slots=True, eq=False)
class Slot:
    """A batch's place in its queue's sequence."""

    count: int
    producer_id: int
    epoch: int
    base: int
    doubt: bool = False  # an attempt under these numbers got no answer: stored or not
    settled: bool = False

    @property
    def numbers(self) -> tuple[int, int, int]:
        return self.producer_id, self.epoch, self.base


class QueueSequence:
    """One queue's epoch, next sequence and window of unsettled batches (the producer's loop only)."""

    def __init__(self, epoch: int = 0, max_in_flight: int = MAX_IN_FLIGHT_PER_QUEUE, *,
                 fixed_epoch: bool = False) -> None:
        self.epoch = epoch
        # A keyed producer's epoch is its owner's (a Spark task attempt replays the same epoch and numbers):
        # where another producer moves on to a new epoch, this queue halts instead (`halted`).
        self.fixed_epoch = fixed_epoch
        self.halted: QueueInDoubtError | None = None
        self.next_seq = 0
        self.max_in_flight = max_in_flight
        self.window: collections.deque[Slot] = collections.deque()
        self.recovering = False
        self._changed = asyncio.Event()
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()  # admissions, in order
        self._granted = 0  # admissions woken that have not run yet

    async def admit(self, count: int, producer_id: int) -> Slot:
        """Number a new batch once the window has room and the queue is not recovering, first come first
        numbered. The caller writes it to the broker's stream before its next await, so batches go out in
        sequence order, and a queue's batches in the order they were sent."""
        if self.halted is not None:
            raise self.halted
        if self._waiting or self._granted or not self._room():
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.cancelled() or not waiter.done():
                    if waiter in self._waiting:
                        self._waiting.remove(waiter)
                else:  # granted, then cancelled before it could use the grant: the next one takes it
                    self._granted -= 1
                    self._grant()
                raise
            self._granted -= 1
            if self.halted is not None:
                self._grant()
                raise self.halted
        slot = Slot(count, producer_id, self.epoch, self.next_seq)
        self.next_seq += count
        self.window.append(slot)
        self._grant()
        return slot

    def _room(self) -> bool:
        if self.halted is not None:
            return True  # every waiting admission wakes, to hear of it
        return not self.recovering and len(self.window) + self._granted < self.max_in_flight

    def _grant(self) -> None:
        """Wake the longest waiting admissions the window has room for."""
        while self._waiting and self._room():
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._granted += 1

    async def turn(self, slot: Slot) -> None:
        """Until every batch numbered before `slot` is settled; QueueInDoubtError once the queue halted."""
        while self.window[0] is not slot:
            await self._wait()
        if self.halted is not None:
            raise self.halted

    def head(self, slot: Slot) -> bool:
        return bool(self.window) and self.window[0] is slot

    def stale(self, slot: Slot, producer_id: int) -> bool:
        """Whether the queue moved on (a new epoch or producer id) since the slot was numbered."""
        return slot.epoch != self.epoch or slot.producer_id != producer_id

    def renumber(self, slot: Slot, producer_id: int) -> None:
        """New numbers in the current epoch, for a batch known not to be stored under its old ones."""
        if slot.doubt:
            raise AssertionError("a batch that may be stored keeps its sequence")
        slot.producer_id, slot.epoch, slot.base = producer_id, self.epoch, self.next_seq
        self.next_seq += slot.count

    def failed(self, slot: Slot, *, doubt: bool) -> None:
        """An attempt failed: the slot waits for its turn, the queue recovers (nothing new is admitted)."""
        slot.doubt = doubt
        self.recovering = True

    def settle(self, slot: Slot, *, stored: bool) -> None:
        """The batch is done with: stored, or given up (refused, or in doubt)."""
        if slot.settled:
            return
        slot.settled = True
        self.window.remove(slot)
        if not stored:
            if (not slot.doubt and not self.window and slot.epoch == self.epoch
                    and slot.base + slot.count == self.next_seq):
                self.next_seq = slot.base  # the last one numbered, surely not stored: its sequence is free
            elif self.fixed_epoch:
                self.halted = self.halted or QueueInDoubtError(
                    f"a batch of this queue was given up {'in doubt' if slot.doubt else 'refused'} under epoch "
                    f"{slot.epoch}, sequence {slot.base}: the batches after it are not sent (this producer's "
                    f"epoch is fixed by its key; replay from that batch)")
            else:
                self.new_epoch()  # it may hold its numbers, or later batches would wait on its gap
            if self.window:
                self.recovering = True
        if not self.window:
            self.recovering = False
        self._notify()
        self._grant()

    def new_epoch(self) -> None:
        self.epoch += 1
        self.next_seq = 0

    def reset(self, epoch: int) -> None:
        """The broker forgot the producer id: the next numbers start again (the window's are stale)."""
        self.epoch, self.next_seq = epoch, 0

    async def _wait(self) -> None:
        await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


class ProducerSequences:
    def __init__(self, key: str = "", epoch: int = 0, max_in_flight: int = MAX_IN_FLIGHT_PER_QUEUE) -> None:
        self.key = key
        self._first_epoch = epoch
        self._max_in_flight = max_in_flight
        self._ids: dict[str, int] = {}
        self._id_locks: dict[str, asyncio.Lock] = {}
        self._queues: dict[MessageQueue, QueueSequence] = {}

    def queue(self, mq: MessageQueue) -> QueueSequence:
        state = self._queues.get(mq)
        if state is None:
            state = self._queues[mq] = QueueSequence(self._first_epoch, self._max_in_flight, fixed_epoch=bool(self.key))
        return state

    async def producer_id(self, broker_name: str, init: Callable[[str], Awaitable[int]]) -> int:
        """This producer's id on a broker, asked for once (`init(key)`: the broker's InitProducer)."""
        producer_id = self._ids.get(broker_name)
        if producer_id is not None:
            return producer_id
        lock = self._id_locks.setdefault(broker_name, asyncio.Lock())
        async with lock:
            if broker_name not in self._ids:
                self._ids[broker_name] = await init(self.key)
            return self._ids[broker_name]

    def forget_broker(self, broker_name: str, producer_id: int) -> None:
        """The broker no longer knows `producer_id`: a new id next time, every queue of the broker from 0."""
        if self._ids.get(broker_name) == producer_id:
            del self._ids[broker_name]
            for mq, state in self._queues.items():
                if mq.broker_name == broker_name:
                    state.reset(self._first_epoch)
