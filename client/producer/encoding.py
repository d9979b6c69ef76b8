"""A message checked and encoded as the producer sends it: RocketMQ's checks, the properties, batch rules."""

from __future__ import annotations

import concurrent.futures
import time

from tidemark.client.errors import InvalidArgumentError
from tidemark.client.message import Message
from tidemark.client.producer.accumulator import SendCallback
from tidemark.common.logs import get_logger
from tidemark.common.protocol import (
    InvalidNameError,
    MessageIdGenerator,
    PropertyKey,
    check_topic_name,
    delays,
    due_later,
    is_system_topic,
    tag_hash,
)
from tidemark.common.records import RecordError, encode_properties

log = get_logger("tidemark.client.producer")


def check_message(message: Message, max_size: int) -> None:
    """RocketMQ's Validators.checkMessage: topic name, non-empty body, size limit."""
    if not isinstance(message, Message):
        raise InvalidArgumentError(f"expected a tidemark.client.Message, got {type(message).__name__}")
    try:
        check_topic_name(message.topic)
    except InvalidNameError as e:
        raise InvalidArgumentError(str(e)) from None
    if len(message.body) == 0:
        raise InvalidArgumentError("message body must not be empty")
    if len(message.body) > max_size:
        raise InvalidArgumentError(f"message body is {len(message.body)} bytes; max_message_size is {max_size}")


_UNIQ = PropertyKey.UNIQ_KEY + "\x01"
_TAGS = "\x02" + PropertyKey.TAGS + "\x01"
_KEYS = "\x02" + PropertyKey.KEYS + "\x01"


def encode_message(message: Message, ids: MessageIdGenerator) -> tuple[str, bytes, int]:
    """(msg id, encoded properties, tags code) of a message: UNIQ_KEY (kept if given), TAGS, KEYS, the rest."""
    tags, keys, user = message.tags, message.keys, message.properties
    if "||" in tags:
        raise InvalidArgumentError(f"tag {tags!r} must not contain '||'")
    if not user:
        # The common case, without a dict: a fresh id, maybe a tag and keys.
        if "\x01" in tags or "\x02" in tags or "\x01" in keys or "\x02" in keys:
            raise InvalidArgumentError("tags and keys must not contain the characters \\x01 or \\x02")
        msg_id = ids.next()
        text = _UNIQ + msg_id
        if tags:
            text += _TAGS + tags
        if keys:
            text += _KEYS + keys
        return msg_id, (text + "\x02").encode("utf-8"), tag_hash(tags)
    props = dict(user)
    msg_id = props.get(PropertyKey.UNIQ_KEY) or ids.next()
    props[PropertyKey.UNIQ_KEY] = msg_id
    if tags:
        props[PropertyKey.TAGS] = tags
    if keys:
        props[PropertyKey.KEYS] = keys
    try:
        return msg_id, encode_properties(props), tag_hash(props.get(PropertyKey.TAGS, ""))
    except RecordError as e:
        raise InvalidArgumentError(str(e)) from None




def check_batch_size(size: int, count: int, max_message_size: int) -> None:
    """RocketMQ's rule: a batch, encoded, is at most max_message_size (the broker refuses larger requests)."""
    if count > 1 and size > max_message_size:
        raise InvalidArgumentError(f"a batch of {count} messages is {size} bytes; a batch may hold at most "
                                   f"max_message_size ({max_message_size}) bytes: send it in smaller batches")


def needs_unary(message: Message) -> bool:
    """Whether a message must go by SendMessage: the broker stores a record batch as it came, so a delay
    (the field, or RocketMQ 4's DELAY property), a delivery time (DELIVER_TIMESTAMP), a transaction's half
    and a system topic are SendMessage's (the broker refuses a batch that carries them:
    broker/ingest/steering.py)."""
    return (bool(message.delay_level) or is_system_topic(message.topic)
            or PropertyKey.TRANSACTION_PREPARED in message.properties
            or due_later(message.properties.get(PropertyKey.DELIVER_TIMESTAMP), time.time() * 1000)
            or delays(message.properties.get(PropertyKey.DELAY)))


def call_back(callback: SendCallback, future: concurrent.futures.Future) -> None:
    error = future.exception()
    try:
        callback(None if error else future.result(), error)  # type: ignore[arg-type]
    except Exception:
        log.exception("send callback raised", event="send_callback_error")


__all__ = ["check_batch_size", "check_message", "encode_message", "needs_unary", "call_back"]
