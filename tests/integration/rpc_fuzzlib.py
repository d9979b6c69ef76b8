"""Helpers for the RPC fuzz tests: every method of the four services, request strategies built from
the protobuf descriptors, raw calls with a deadline, and a snapshot of the broker's observable state."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator

import grpc
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import strategies as st

from tidemark.v1 import admin_pb2, membership_pb2, messaging_pb2, offsets_pb2

SERVICES = (messaging_pb2, offsets_pb2, membership_pb2, admin_pb2)

# Names that exist in the seeded broker, names that could be created, and names that break the rules.
TOPICS = ("fz-t", "fz-u", "%RETRY%fz-g")
GROUPS = ("fz-g", "fz-h")
CLIENT_IDS = ("127.0.0.1@fz-1", "127.0.0.1@fz-2")
BAD_NAMES = ("", "nl-topic\n", "tab\tname", "nul\x00", "esc\x1b[31m", "a b", "ü", "x" * 300, "%", "dot.name",
             "\r", "name\u2028")
EDGE_INTS = (0, 1, 2, 3, -1, 7, 255, 256, 2**31 - 1, -(2**31), 2**32 - 1, 2**63 - 1, -(2**63), 10**12)

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1), FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1), FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1), FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
NAME_FIELDS = ("topic", "name", "group", "client_id")


@dataclasses.dataclass(frozen=True)
class Method:
    service: str
    name: str
    input_type: object  # a message class
    client_streaming: bool
    server_streaming: bool

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"


def _identity(b: bytes) -> bytes:
    return b


# Managed only on a broker started with --auth (test_auth.py, test_auth_admin.py); refused before
# decoding elsewhere.
AUTH_ONLY = frozenset({"CreateUser", "UpdateUser", "DeleteUser", "ListUsers", "CreateAcl", "DeleteAcl", "ListAcls"})


def methods(*, include_auth_only: bool = False) -> list[Method]:
    from google.protobuf import message_factory

    out = []
    for module in SERVICES:
        for service in module.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                if m.name in AUTH_ONLY and not include_auth_only:
                    continue
                out.append(Method(service.full_name, m.name, message_factory.GetMessageClass(m.input_type),
                                  m.client_streaming, m.server_streaming))
    return out


def _repeated(field: FieldDescriptor) -> bool:
    return field.is_repeated if hasattr(field, "is_repeated") else field.label == FieldDescriptor.LABEL_REPEATED


def _string_for(field: FieldDescriptor) -> st.SearchStrategy[str]:
    weird = st.sampled_from(BAD_NAMES) | st.text(max_size=12)
    if field.name in ("topic", "name"):
        return st.sampled_from(TOPICS) | weird
    if field.name == "group":
        return st.sampled_from(GROUPS) | weird
    if field.name == "client_id":
        return st.sampled_from(CLIENT_IDS) | weird
    if field.name in ("subscription", "expression"):
        return st.sampled_from(("*", "a || b", "a", "||", " ", "*||a")) | weird
    return st.sampled_from(("", "a", "broker-a")) | weird


def _scalar(field: FieldDescriptor, depth: int) -> st.SearchStrategy:
    t = field.type
    if t == FieldDescriptor.TYPE_MESSAGE:
        return request_strategy(field.message_type, depth + 1)
    if t == FieldDescriptor.TYPE_STRING:
        return _string_for(field)
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values] + [-1, 99])
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=True, width=32)
    low, high = _INT_RANGES[t]
    return st.sampled_from([v for v in EDGE_INTS if low <= v <= high]) | st.integers(low, high)


def request_strategy(descriptor, depth: int = 0) -> st.SearchStrategy:
    """Messages of `descriptor` with any subset of fields set, nested to a bounded depth."""
    from google.protobuf import message_factory

    cls = message_factory.GetMessageClass(descriptor)
    if depth > 3:
        return st.just(cls())
    fields = {}
    for f in descriptor.fields:
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            fields[f.name] = st.dictionaries(_scalar(key, depth), _scalar(value, depth), max_size=3)
        elif _repeated(f):
            fields[f.name] = st.lists(_scalar(f, depth), max_size=3)
        else:
            fields[f.name] = _scalar(f, depth)

    @st.composite
    def build(draw):
        message = cls()
        for name in draw(st.lists(st.sampled_from(sorted(fields)), unique=True)) if fields else ():
            f, value = descriptor.fields_by_name[name], draw(fields[name])
            if isinstance(value, dict):
                getattr(message, name).update(value)
            elif _repeated(f):
                getattr(message, name).extend(value)
            elif f.message_type is not None:
                getattr(message, name).CopyFrom(value)
            else:
                setattr(message, name, value)
        return message

    return build()


def call(channel: grpc.Channel, method: Method, payloads: list[bytes], timeout: float = 2.0) -> grpc.StatusCode:
    """Send raw payloads to a method; the final status (DEADLINE_EXCEEDED for a stream still open)."""
    try:
        if method.client_streaming and method.server_streaming:
            stub = channel.stream_stream(method.path, request_serializer=_identity, response_deserializer=_identity)
            responses = stub(iter(payloads), timeout=timeout)
            for _ in itertools.islice(responses, 100):
                pass
        elif method.client_streaming:
            channel.stream_unary(method.path, request_serializer=_identity,
                                 response_deserializer=_identity)(iter(payloads), timeout=timeout)
        elif method.server_streaming:
            responses = channel.unary_stream(method.path, request_serializer=_identity,
                                             response_deserializer=_identity)(payloads[0], timeout=timeout)
            for _ in itertools.islice(responses, 100):
                pass
        else:
            channel.unary_unary(method.path, request_serializer=_identity,
                                response_deserializer=_identity)(payloads[0], timeout=timeout)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def snapshot(stubs) -> dict:
    """Everything a rejected request must leave alone: topics, messages, groups, offsets, locks, members,
    broker permission. Timestamps that move by themselves (lock expiry, heartbeats) are left out."""
    admin, offsets = stubs.admin, stubs.offsets
    state: dict = {}
    topics = admin.ListTopics(admin_pb2.ListTopicsRequest(include_system=True)).topics
    state["topics"] = sorted((t.name, t.read_queue_nums, t.write_queue_nums, t.readable, t.writable) for t in topics)
    state["queues"] = {t.name: sorted((q.queue.queue_id, q.min_offset, q.max_offset) for q in
                                      admin.GetTopicStats(admin_pb2.GetTopicStatsRequest(topic=t.name)).queues)
                       for t in topics}
    groups = sorted(g.group for g in admin.ListGroups(admin_pb2.ListGroupsRequest()).groups)
    state["groups"] = groups
    for g in groups:
        try:
            c = admin.GetGroupConfig(admin_pb2.GetGroupConfigRequest(group=g))
            state[f"config:{g}"] = (c.consume_enable, c.consume_broadcast_enable, c.retry_queue_nums,
                                    c.retry_max_times)
        except grpc.RpcError as e:
            state[f"config:{g}"] = e.code()
        d = admin.DescribeGroup(admin_pb2.DescribeGroupRequest(group=g))
        state[f"members:{g}"] = sorted((m.client_id, m.message_model, tuple(sorted(
            (s.topic, s.expression) for s in m.subscriptions))) for m in d.members)
        state[f"locks:{g}"] = sorted((lk.queue.topic, lk.queue.queue_id, lk.client_id, lk.owner_epoch)
                                     for lk in d.locks)
        stats = offsets.GetConsumeStats(offsets_pb2.GetConsumeStatsRequest(group=g))
        state[f"offsets:{g}"] = sorted((q.queue.topic, q.queue.queue_id, q.consumer_offset) for q in stats.queues)
    info = admin.GetBrokerInfo(admin_pb2.GetBrokerInfoRequest())
    state["permission"] = (info.readable, info.writable)
    return state


def set_path(message, path: tuple[str, ...], value: str) -> None:
    """Set a (possibly nested, possibly repeated) field; a repeated message gets one element."""
    for step in path[:-1]:
        field = message.DESCRIPTOR.fields_by_name[step]
        if _repeated(field):
            container = getattr(message, step)
            message = container[0] if len(container) else container.add()
        else:
            message = getattr(message, step)
    setattr(message, path[-1], value)


def valid_name(field: str) -> str:
    return {"topic": TOPICS[0], "name": TOPICS[0], "group": GROUPS[0], "client_id": CLIENT_IDS[0]}[field]


def name_field_paths(descriptor, prefix: tuple[str, ...] = (), depth: int = 0) -> Iterator[tuple[str, ...]]:
    """Paths to every name field (topic, group, client id) of a request, through nested messages."""
    if depth > 3:
        return
    for f in descriptor.fields:
        if f.type == FieldDescriptor.TYPE_STRING and f.name in NAME_FIELDS:
            yield (*prefix, f.name)
        elif f.type == FieldDescriptor.TYPE_MESSAGE and not f.message_type.GetOptions().map_entry:
            yield from name_field_paths(f.message_type, (*prefix, f.name), depth + 1)
