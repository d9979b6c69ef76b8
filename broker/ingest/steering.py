"""Properties that steer how a message is stored, whichever call carried it.

Three property names are not plain user properties but instructions to the
broker, as in RocketMQ:
- DELAY: the delay level. RocketMQ 4's Message.setDelayTimeLevel sets exactly
  this property, so a message that carries it (set by hand, or by a client
  written against RocketMQ's model) is delayed by that level; the
  `delay_level` field of a send, when given, wins over it.
- DELIVER_TIMESTAMP: the time (epoch ms) a message is due, which a timed
  message keeps (broker/ingest/delays.py). A message that carries it without
  a delay level is delivered at that time, as if the send's `deliver_at_ms`
  said so (the field, when given, wins); a time already past is due now.
- TRAN_MSG=true: a transaction's prepared half, held until it is committed.

A send (SendMessage, RocketMQ 5's SendMessage) honours them all: the message
is scheduled, or held as a half. A record batch (the Produce stream) is stored
as its bytes came, without a per-message step, so it cannot: a batch in which
any record carries one (a delivery time still ahead) is refused whole, with
the record and the property named, instead of being stored as plain messages
that would be delivered at once. Tidemark's producer sends such messages with
SendMessage, so only a hand-made batch meets the refusal; a batch that copies
delivered messages (their DELIVER_TIMESTAMP past) is stored.

Pure: no I/O. Whether a batch carries either name at all is read from the
store's check of it (the property pairs of its bulk check, or the property
sections its per-record check cut out); only then are its records walked.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from tidemark.broker.errors import InvalidArgumentError
from tidemark.broker.store.batches import Checked
from tidemark.common.protocol import PropertyKey, delay_level_of, delays, due_later
from tidemark.common.records import (
    CheckedBatch,
    RawProperties,
    RecordError,
    record_spans,
    variable_fields,
)

if TYPE_CHECKING:
    from tidemark.broker.ingest.send import OutgoingMessage

_DELAY = PropertyKey.DELAY.encode() + b"\x01"
_PREPARED = PropertyKey.TRANSACTION_PREPARED.encode() + b"\x01"
_DELIVER_AT = PropertyKey.DELIVER_TIMESTAMP.encode() + b"\x01"


def delay_from_property(message: OutgoingMessage, now_ms: int, levels: int) -> OutgoingMessage:
    """The message with a DELAY property turned into its delay level (at most `levels`, the broker's last, as
    RocketMQ clamps it; 0 or below: not delayed), or else a DELIVER_TIMESTAMP property still ahead of
    `now_ms` into its delivery time (the schedule sets either property again when it stores the message
    delayed). A DELIVER_TIMESTAMP already past stays a plain property: a delivered timed message copied
    (forwarded, or sent on in a batch) is due and goes as it came."""
    value = message.properties.get(PropertyKey.DELAY)
    if value is None:
        return _deliver_at_from_property(message, now_ms)
    properties = {k: v for k, v in message.properties.items() if k != PropertyKey.DELAY}
    if message.delay_level:
        return replace(message, properties=properties)
    try:
        level = delay_level_of(value)
    except ValueError:
        raise InvalidArgumentError(f"property DELAY={value!r} must be a delay level (an integer)") from None
    return replace(message, delay_level=min(max(level, 0), levels), properties=properties)


def _deliver_at_from_property(message: OutgoingMessage, now_ms: int) -> OutgoingMessage:
    value = message.properties.get(PropertyKey.DELIVER_TIMESTAMP)
    if value is None or message.delay_level or message.deliver_at_ms:
        return message  # (a delay level with it: send's check refuses the two together)
    try:
        deliver_at = int(value)
    except ValueError:
        raise InvalidArgumentError(
            f"property DELIVER_TIMESTAMP={value!r} must be a delivery time (epoch milliseconds)") from None
    if deliver_at <= now_ms:
        return message
    properties = {k: v for k, v in message.properties.items() if k != PropertyKey.DELIVER_TIMESTAMP}
    return replace(message, deliver_at_ms=deliver_at, properties=properties)


def steering_record(data: bytes | memoryview, count: int, checked: Checked | CheckedBatch | None = None, *,
                    now_ms: int = 0) -> tuple[int, str] | None:
    """(index, property) of the first record of a batch that sets DELAY (a level above 0), TRAN_MSG=true or
    DELIVER_TIMESTAMP after `now_ms` (a time that is no integer counts: a send would refuse it); None when
    none does, or when the batch cannot be walked (its check then says what is wrong). With the
    store's check of the batch (`checked`), whether either key occurs at all is read from the property
    pairs its bulk check found, or searched in the property sections its per-record check cut out (a
    search of the whole batch's bytes, bodies included, cost 0.4 ns a byte)."""
    if isinstance(checked, Checked):
        if not checked.has_key(_DELAY[:-1], _PREPARED[:-1], _DELIVER_AT[:-1]):
            return None
    elif isinstance(checked, CheckedBatch):
        if not any(_DELAY in props or _PREPARED in props or _DELIVER_AT in props for props in checked.properties):
            return None
    elif _DELAY not in data and _PREPARED not in data and _DELIVER_AT not in data:
        return None
    try:
        spans = record_spans(data, count)
    except RecordError:
        return None
    for index, (start, _) in enumerate(spans):
        try:
            props_at, props_len = variable_fields(data, start)[4:6]
            # (a key given twice has its last value, as every decoder of properties reads it)
            props = RawProperties(bytes(data[props_at:props_at + props_len]))
            delay = props.get(PropertyKey.DELAY)
            prepared = props.get(PropertyKey.TRANSACTION_PREPARED)
            deliver_at = props.get(PropertyKey.DELIVER_TIMESTAMP)
        except (ValueError, IndexError):  # (a malformed record: the batch's check refuses it)
            return None
        if delays(delay):
            return index, PropertyKey.DELAY
        if prepared is not None and prepared.lower() == "true":
            return index, PropertyKey.TRANSACTION_PREPARED
        if due_later(deliver_at, now_ms):
            return index, PropertyKey.DELIVER_TIMESTAMP
    return None


def check_no_steering(data: bytes | memoryview, count: int, checked: Checked | CheckedBatch | None = None, *,
                      now_ms: int = 0) -> None:
    """Refuse a record batch that carries a property it cannot honour (InvalidArgumentError); `checked`: the
    store's check of it, `now_ms` the time a DELIVER_TIMESTAMP must not be after."""
    found = steering_record(data, count, checked, now_ms=now_ms)
    if found is None:
        return
    index, name = found
    what = {PropertyKey.DELAY: "a delay level", PropertyKey.DELIVER_TIMESTAMP: "a delivery time still ahead"}.get(
        name, "a transaction's prepared half")
    raise InvalidArgumentError(
        f"record {index} of the batch sets {name} ({what}): a record batch stores messages as they came; "
        f"send such a message with SendMessage, which honours it")
