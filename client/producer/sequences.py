"""Sequences of an idempotent producer: a producer id per broker, an epoch and a next sequence per queue.

The broker stores a batch once per (producer id, epoch, sequence) and answers
a retry of it as a duplicate (broker/producers/table.py). For that the
producer keeps, per queue, the sequence its next batch starts at, and sends one
batch per queue at a time (`QueueSequence.lock`): a batch's retries go out
before any later batch of its queue, so the broker sees sequences in order
and nothing has to be reordered. Batches of different queues still travel
together (max_in_flight_requests).

How a sequence moves:
- a batch stored (or answered as a duplicate): `next_seq += count`;
- a batch the broker refused (`attempts.outcome_of(error)` is REFUSED: a bad request,
  a permission, an unknown topic): nothing was stored, the sequence stays;
- any other failure leaves the outcome unknown (a timeout, a reset mid-call,
  an internal error, a cancelled send): the batch was stored or not. Its
  retries reuse the sequence (the broker answers a stored one as a
  duplicate); once the producer gives up on it, the queue moves to a new
  epoch, sequence 0, so the next batch neither waits on a gap nor is taken
  for the stored one. Reusing the sequence for a *different* batch would be
  acknowledged with the first batch's offsets and never stored: the one
  thing this module must not allow, whatever the error;
- OutOfOrderSequenceError (the broker lost the queue's state: a power cut,
  an expiry): nothing was stored; the batch moves to a new epoch too;
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tidemark.client.message import MessageQueue


@dataclass(slots=True)
class QueueSequence:
    epoch: int = 0
    next_seq: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def stored(self, count: int) -> None:
        self.next_seq += count

    def new_epoch(self) -> None:
        self.epoch += 1
        self.next_seq = 0


class ProducerSequences:
    def __init__(self, key: str = "", epoch: int = 0) -> None:
        self.key = key
        self._first_epoch = epoch
        self._ids: dict[str, int] = {}
        self._id_locks: dict[str, asyncio.Lock] = {}
        self._queues: dict[MessageQueue, QueueSequence] = {}

    def queue(self, mq: MessageQueue) -> QueueSequence:
        state = self._queues.get(mq)
        if state is None:
            state = self._queues[mq] = QueueSequence(self._first_epoch)
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
                    state.epoch, state.next_seq = self._first_epoch, 0
