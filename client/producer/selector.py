"""Queue selectors: pick the queue for a message (ordered messages use a sharding key or a message group)."""

from __future__ import annotations

import random
import zlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from tidemark.client.errors import InvalidArgumentError
from tidemark.client.message import Message, MessageQueue
from tidemark.common.protocol import PropertyKey


class MessageQueueSelector(ABC):
    """Chooses one of a topic's writable queues (sorted) for a message; `arg` is the caller's key."""

    @abstractmethod
    def select(self, mqs: Sequence[MessageQueue], message: Message, arg: Any) -> MessageQueue: ...


class SelectMessageQueueByHash(MessageQueueSelector):
    """Same key, same queue: messages of one key stay in order. Stable across processes (CRC32, not hash())."""

    def select(self, mqs: Sequence[MessageQueue], message: Message, arg: Any) -> MessageQueue:
        key = arg if isinstance(arg, bytes) else str(arg).encode("utf-8")
        return mqs[zlib.crc32(key) % len(mqs)]


class SelectMessageQueueByMessageGroup(MessageQueueSelector):
    """The producer's choice for a message with a message group and no queue or selector: the queue
    SelectMessageQueueByHash picks for the group as its key, so the two agree, and every message of the
    group (and every retry of one) goes to the same queue while the topic's queues stay the same. The key is
    the stored `__SHARDINGKEY` property, which the broker's FIFO rule reads as the group: a value there that
    is no group by RocketMQ's rule (set by hand, or by another producer) still keeps its messages together."""

    def select(self, mqs: Sequence[MessageQueue], message: Message, arg: Any) -> MessageQueue:
        return _BY_HASH.select(mqs, message, group_key(message))


def group_key(message: Message) -> str | None:
    """What the broker's FIFO rule takes for the message's group (None: no group)."""
    return message.properties.get(PropertyKey.SHARDING_KEY)


_BY_HASH = SelectMessageQueueByHash()
BY_MESSAGE_GROUP = SelectMessageQueueByMessageGroup()


def route_by_group(messages: Sequence[Message], queue: MessageQueue | None,
                   selector: MessageQueueSelector | None) -> MessageQueueSelector | None:
    """The selector for messages sent as one batch (one queue): a message group without a queue or selector
    picks its queue by hash, so every message and every retry of the group goes there. A batch routed so
    must hold one group: messages of another group (or of none) in it would land on this group's queue
    while that group's other messages land on its own, and its order would be lost."""
    if queue is not None or selector is not None:
        return selector
    groups = {group_key(m) for m in messages}
    if groups == {None}:
        return None
    if len(groups) > 1:
        shown = ", ".join(sorted(repr(g) for g in groups))
        raise InvalidArgumentError(f"a batch goes to one queue and these messages are of several message groups "
                                   f"({shown}): send each group in its own batch, or name the queue")
    return BY_MESSAGE_GROUP


class SelectMessageQueueByRandom(MessageQueueSelector):
    def select(self, mqs: Sequence[MessageQueue], message: Message, arg: Any) -> MessageQueue:
        return random.choice(list(mqs))
