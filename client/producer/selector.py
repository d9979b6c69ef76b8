"""Queue selectors: pick the queue for a message (ordered messages use a sharding key)."""

from __future__ import annotations

import random
import zlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from tidemark.client.message import Message, MessageQueue


class MessageQueueSelector(ABC):
    """Chooses one of a topic's writable queues (sorted) for a message; `arg` is the caller's key."""

    @abstractmethod
    def select(self, mqs: Sequence[MessageQueue], message: Message, arg: Any) -> MessageQueue: ...


class SelectMessageQueueByHash(MessageQueueSelector):
    """Same key, same queue: messages of one key stay in order. Stable across processes (CRC32, not hash())."""

    def select(self, mqs: Sequence[MessageQueue], message: Message, arg: Any) -> MessageQueue:
        key = arg if isinstance(arg, bytes) else str(arg).encode("utf-8")
        return mqs[zlib.crc32(key) % len(mqs)]


class SelectMessageQueueByRandom(MessageQueueSelector):
    def select(self, mqs: Sequence[MessageQueue], message: Message, arg: Any) -> MessageQueue:
        return random.choice(list(mqs))
