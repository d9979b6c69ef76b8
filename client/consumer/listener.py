"""Listener contracts of the push consumer.

A concurrent listener is `(msgs, context) -> ConsumeConcurrentlyStatus`. It may
set `context.ack_index`: messages up to and including it count as consumed and
only the ones after it are retried, whether the listener returns
CONSUME_SUCCESS or RECONSUME_LATER (RocketMQ ignores ack_index on
RECONSUME_LATER and retries the whole batch, redelivering what already succeeded).
An orderly listener is `(msgs, context) -> ConsumeOrderlyStatus`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tidemark.client.message import (
    ConsumeConcurrentlyStatus,
    ConsumeOrderlyStatus,
    MessageExt,
    MessageQueue,
)


@dataclass(slots=True)
class ConsumeConcurrentlyContext:
    message_queue: MessageQueue
    # None: every message of the batch shares the returned status.
    ack_index: int | None = None
    # 0: the broker picks 3 + reconsume times; -1: straight to the DLQ; n: that delay level.
    delay_level_when_next_consume: int = 0


@dataclass(slots=True)
class ConsumeOrderlyContext:
    message_queue: MessageQueue
    # None: the consumer's suspend_current_queue_time_ms.
    suspend_current_queue_time_ms: int | None = None


MessageListenerConcurrently = Callable[[Sequence[MessageExt], ConsumeConcurrentlyContext], ConsumeConcurrentlyStatus]
MessageListenerOrderly = Callable[[Sequence[MessageExt], ConsumeOrderlyContext], ConsumeOrderlyStatus]


def split_by_ack_index(count: int, status: ConsumeConcurrentlyStatus, ack_index: int | None) -> int:
    """How many leading messages of a batch of `count` count as consumed.

    SUCCESS without ack_index: all. RECONSUME_LATER without ack_index: none.
    With ack_index k (clamped to -1..count-1): the first k + 1, for either status.
    """
    if ack_index is None:
        return count if status is ConsumeConcurrentlyStatus.CONSUME_SUCCESS else 0
    return max(-1, min(ack_index, count - 1)) + 1
