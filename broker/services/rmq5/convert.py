"""Messages of RocketMQ 5's protocol to and from the broker's domain.

A sent `Message` becomes an `OutgoingMessage`: the tag, the keys (joined by a
space, RocketMQ's KEYS separator), the client-made message id kept as UNIQ_KEY
(so a retried send keeps its id), the message group as `__SHARDINGKEY` and the
delivery time. The checks here are the protocol's own, with the codes the
proxy answers them with; the domain checks the rest (SendService).

A stored message becomes a `Message` with the system properties the clients
read: the original topic of a retried message, an MD5 body digest (uppercase
hex: the Node.js client misreads a CRC32 one and needs a digest present), the
message type inferred from what the message carries, and the delivery attempt.

Topics and groups may come in a namespace (`Resource.resource_namespace`): the
broker stores them as `NAMESPACE%name` (common/namespaces.py, RocketMQ's
form), and answers a client with its namespace and the bare name, as the
RocketMQ proxy does; the official clients look up a received message's
topic among their subscriptions by the bare name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from tidemark.broker.operations import OutgoingMessage, StoredMessage
from tidemark.broker.services.rmq5.status import Code, ProtocolError
from tidemark.common.namespaces import NamespaceError, in_namespace, unwrap, wrap
from tidemark.common.protocol import InvalidNameError, PropertyKey
from tidemark.rmq5.v2 import messaging_pb2 as pb

# RocketMQ's property names for what RocketMQ 5 calls a message group and a delivery time.
MESSAGE_GROUP_KEY = "__SHARDINGKEY"
MAX_MESSAGE_GROUP_LENGTH = 64
# Property keys a user property may not use: the broker's own.
TRACEPARENT = "traceparent"
SYSTEM_KEYS = frozenset(v for k, v in vars(PropertyKey).items() if k.isupper()) | {MESSAGE_GROUP_KEY}
# A delivery_timestamp whose seconds exceed this is in milliseconds: the Python client 5.1.x puts
# time.time() * 1000 into the seconds field (seconds this large would be about year 5138).
_MS_IN_SECONDS_THRESHOLD = 10**11

# The producer group of every RocketMQ 5 client's half messages (see `outgoing`).
RMQ5_PRODUCER_GROUP = "RMQ5_PRODUCERS"


def duration_ms(d: Duration) -> int:
    return d.seconds * 1000 + d.nanos // 1_000_000


def duration(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def timestamp_ms(t: Timestamp) -> int:
    if t.seconds > _MS_IN_SECONDS_THRESHOLD:
        return t.seconds
    return t.seconds * 1000 + t.nanos // 1_000_000


def resource_name(resource: pb.Resource, kind: str) -> str:
    """The stored name of a topic or group ("topic" or "group"): `NAMESPACE%name` in a namespace, the name
    as it is without one. ILLEGAL_TOPIC / ILLEGAL_CONSUMER_GROUP for an empty name; as `stored_name`."""
    if not resource.name:
        raise ProtocolError(_illegal(kind), f"{kind} name must not be empty")
    return stored_name(resource, kind)


def stored_name(resource: pb.Resource, kind: str) -> str:
    """`resource_name` that lets an empty name through (for the access checks, which run before the
    handler refuses it). BAD_REQUEST naming a bad namespace; ILLEGAL_TOPIC / ILLEGAL_CONSUMER_GROUP for a
    name the namespace cannot hold (one with '%')."""
    if not resource.resource_namespace:
        return resource.name
    try:
        return wrap(resource.resource_namespace, resource.name, kind=kind)
    except NamespaceError as e:
        raise ProtocolError(Code.BAD_REQUEST, f"{kind} {resource.name!r}: {e}") from None
    except InvalidNameError as e:
        raise ProtocolError(_illegal(kind), str(e)) from None


def _illegal(kind: str) -> int:
    return Code.ILLEGAL_TOPIC if kind == "topic" else Code.ILLEGAL_CONSUMER_GROUP


def answer_topic(stored: str, namespace: str) -> pb.Resource:
    """A stored topic as a client in `namespace` knows it: the bare name and the namespace (a topic outside
    the namespace, as stored and without one)."""
    if namespace and in_namespace(namespace, stored):
        return pb.Resource(name=unwrap(namespace, stored), resource_namespace=namespace)
    return pb.Resource(name=stored)


def outgoing(m: pb.Message, max_body_size: int) -> tuple[OutgoingMessage, str]:
    """The domain message for a sent one, and its message group ("" for none)."""
    sp = m.system_properties
    if not m.body:
        raise ProtocolError(Code.MESSAGE_BODY_EMPTY, "message body is empty")
    if len(m.body) > max_body_size:
        raise ProtocolError(Code.MESSAGE_BODY_TOO_LARGE,
                            f"message body is {len(m.body)} bytes; at most {max_body_size} allowed")
    if not sp.message_id:
        raise ProtocolError(Code.ILLEGAL_MESSAGE_ID, "message_id must be set by the client")
    for key in m.user_properties:
        if key in SYSTEM_KEYS:
            raise ProtocolError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                                f"user property {key!r} is a reserved system property key")
    if sp.tag and ("|" in sp.tag or not sp.tag.strip()):
        raise ProtocolError(Code.ILLEGAL_MESSAGE_TAG, f"tag {sp.tag!r} must not be blank or contain '|'")
    group = sp.message_group if sp.HasField("message_group") else ""
    delivery = sp.HasField("delivery_timestamp")
    _check_type(sp.message_type, group, delivery)
    if len(group) > MAX_MESSAGE_GROUP_LENGTH:
        raise ProtocolError(Code.ILLEGAL_MESSAGE_GROUP,
                            f"message group is {len(group)} characters; at most {MAX_MESSAGE_GROUP_LENGTH} allowed")
    properties = dict(m.user_properties)
    properties[PropertyKey.UNIQ_KEY] = sp.message_id
    if sp.message_type == pb.TRANSACTION:
        # RocketMQ 5 producers have no group: the checks of their half messages go to any producer of
        # this protocol that publishes to the topic (the proxy's rule), through their telemetry streams.
        properties[PropertyKey.TRANSACTION_PREPARED] = "true"
        properties[PropertyKey.PRODUCER_GROUP] = RMQ5_PRODUCER_GROUP
    if group:
        properties[MESSAGE_GROUP_KEY] = group
    if sp.trace_context and TRACEPARENT not in properties:
        # RocketMQ 5 clients carry W3C Trace Context here; Tidemark's clients and store spans read it
        # from the message's traceparent property (tidemark.client.tracing).
        properties[TRACEPARENT] = sp.trace_context
    message = OutgoingMessage(
        body=m.body,
        tags=sp.tag,
        keys=" ".join(k for k in sp.keys if k),
        properties=properties,
        born_timestamp=timestamp_ms(sp.born_timestamp) if sp.HasField("born_timestamp") else 0,
        born_host=sp.born_host,
        deliver_at_ms=timestamp_ms(sp.delivery_timestamp) if delivery else 0,
    )
    return message, group


def _check_type(message_type: int, group: str, delivery: bool) -> None:
    """The declared type must match what the message carries (the proxy's MESSAGE_PROPERTY_CONFLICT_WITH_TYPE)."""
    name = pb.MessageType.Name(message_type) if message_type in pb.MessageType.values() else str(message_type)
    if message_type in (pb.LITE, pb.PRIORITY):
        raise ProtocolError(Code.UNSUPPORTED, f"{name} messages are not supported by this broker")
    conflict = ("a message group and a delivery timestamp exclude each other" if group and delivery
                else "a FIFO message needs a message group" if message_type == pb.FIFO and not group
                else "a DELAY message needs a delivery timestamp" if message_type == pb.DELAY and not delivery
                else f"a {name} message must not carry a message group or a delivery timestamp"
                if message_type in (pb.NORMAL, pb.TRANSACTION) and (group or delivery) else None)
    if conflict:
        raise ProtocolError(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, conflict)


def message_type(m: StoredMessage) -> int:
    """The type the RocketMQ proxy reports for a stored message (its GrpcConverter), read off what the
    message carries, in the proxy's order: a half message is TRANSACTION, one with a delay level or a
    delivery time DELAY, one with a message group FIFO, any other NORMAL.

    So what a message still carries when a consumer receives it decides, as it does there. A delay-level
    message arrives without DELAY and DELIVER_TIMESTAMP (ingest/delays.py; RocketMQ's schedule service
    clears them): NORMAL. A message sent for a delivery time keeps DELIVER_TIMESTAMP on its topic, as
    RocketMQ's timer store keeps TIMER_DELIVER_MS: still DELAY, with its delivery_timestamp, whether it
    waited or was due at once. A committed transactional message is TRANSACTION, as its half: RocketMQ's
    commit stores the half's properties string, TRAN_MSG=true included (EndTransactionProcessor clears
    TRAN_MSG from the property map only after it built that string), and so does ours."""
    props = m.properties
    if props.get(PropertyKey.TRANSACTION_PREPARED, "").lower() == "true":
        return pb.TRANSACTION
    if PropertyKey.DELIVER_TIMESTAMP in props or PropertyKey.DELAY in props:
        return pb.DELAY
    if MESSAGE_GROUP_KEY in props:
        return pb.FIFO
    return pb.NORMAL


def body_digest(body: bytes) -> pb.Digest:
    return pb.Digest(type=pb.MD5, checksum=hashlib.md5(body).hexdigest().upper())


def received(m: StoredMessage, *, store_host: str, delivery_attempt: int = 1, namespace: str = "") -> pb.Message:
    """A stored message as a consumer in `namespace` receives it (receipt handle and invisible time are the
    caller's)."""
    props = m.properties
    sp = pb.SystemProperties(
        keys=[k for k in props.get(PropertyKey.KEYS, "").split(" ") if k],
        message_id=props.get(PropertyKey.UNIQ_KEY, ""),
        body_digest=body_digest(m.body),
        body_encoding=pb.IDENTITY,
        message_type=message_type(m),
        born_timestamp=timestamp(m.born_timestamp),
        born_host=m.born_host,
        store_timestamp=timestamp(m.store_timestamp),
        store_host=store_host,
        queue_id=m.queue_id,
        queue_offset=m.queue_offset,
        delivery_attempt=delivery_attempt,
    )
    if tag := props.get(PropertyKey.TAGS):
        sp.tag = tag
    if group := props.get(MESSAGE_GROUP_KEY):
        sp.message_group = group
    if trace_context := props.get(TRACEPARENT):
        sp.trace_context = trace_context
    if deliver_at := props.get(PropertyKey.DELIVER_TIMESTAMP):
        try:
            sp.delivery_timestamp.CopyFrom(timestamp(int(deliver_at)))
        except ValueError:
            pass  # written by another client as a free-form property: not a delivery time
    return pb.Message(
        topic=answer_topic(props.get(PropertyKey.RETRY_TOPIC, m.topic), namespace),
        user_properties=user_properties(props.items()),
        system_properties=sp,
        body=m.body,
    )


def user_properties(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {k: v for k, v in items if k not in SYSTEM_KEYS}
