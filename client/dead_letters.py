"""Dead-letter queues: reading %DLQ%<group> and requeueing its messages to their original topic.

The DLQ is append-only like every topic: a requeue sends a copy of a message
to the topic it was first sent to, with the same msg id and the retry
bookkeeping the broker added on the way (retry topic, reconsume count, delay)
left behind, so the copy starts fresh.

What was requeued is remembered the way consumers remember what they read: the
group's committed offset on each queue of its DLQ (a group never consumes its
own %DLQ% topic otherwise) is the mark below which every dead letter was sent
back. A requeue of all starts at the mark and advances it, so a second run
finds nothing new (a message requeued alone by msg id past the mark is sent
again by a later requeue of all); `tidemark group progress
GROUP --topic %DLQ%GROUP` shows how many dead letters wait, and `tidemark group
reset-offset GROUP --topic %DLQ%GROUP --to-earliest` makes them all eligible
again, as Kafka users move a group back to re-read a topic. With auth, moving
the mark is a commit of the group: a requeue needs Sub on Group:GROUP too.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidemark.client.message import Message, MessageExt, MessageQueue
from tidemark.common.protocol import PropertyKey

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


def requeue_start(low: int, mark: int) -> int:
    """The first offset of a DLQ queue a requeue of all sends: past the mark of earlier requeues (-1 when
    none), never before the queue's first message (older ones may have been deleted)."""
    return max(low, mark)


def advanced(mark: int, offset: int) -> int:
    """The mark once the message at `offset` was requeued: it moves only over a contiguous prefix, so a
    message requeued alone (by msg id) past the mark does not hide the unsent ones before it."""
    return offset + 1 if offset == mark else mark
