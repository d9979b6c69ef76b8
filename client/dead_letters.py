"""Dead-letter queues: reading %DLQ%<group> and requeueing its messages to their original topic.

The DLQ is append-only like every topic: a requeue sends a copy of a message
to the topic it was first sent to, with the same msg id and the retry
bookkeeping the broker added on the way (retry topic, reconsume count, delay)
left behind, so the copy starts fresh.
"""

from __future__ import annotations

from dataclasses import dataclass

from client.message import Message, MessageExt, MessageQueue
from tidemark.protocol import PropertyKey

# Properties the broker adds on the way to the DLQ; a requeued copy starts without them.
RETRY_PROPERTIES = frozenset({PropertyKey.RETRY_TOPIC, PropertyKey.ORIGIN_MESSAGE_ID,
                              PropertyKey.MAX_RECONSUME_TIMES, PropertyKey.RECONSUME_TIME, PropertyKey.REAL_TOPIC,
                              PropertyKey.REAL_QID, PropertyKey.DELAY, PropertyKey.DELIVER_TIMESTAMP})


@dataclass(frozen=True, slots=True)
class Requeued:
    msg_id: str
    topic: str
    queue: MessageQueue
    queue_offset: int


def requeue_copy(dead: MessageExt) -> Message:
    """The message to send for a dead letter: to its original topic, same id, retry bookkeeping dropped."""
    props = {k: v for k, v in dead.properties.items() if k not in RETRY_PROPERTIES}
    props[PropertyKey.UNIQ_KEY] = dead.msg_id
    return Message(dead.origin_topic, dead.body, tags=dead.tags, keys=dead.keys, properties=props)
