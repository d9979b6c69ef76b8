"""The clients of RocketMQ 5's protocol: their settings, and the answer the broker gives them.

Every official client opens a `Telemetry` stream at start-up and sends its
`Settings` (what it is, which topics it publishes or which group and
subscriptions it consumes); the broker answers each with the effective
settings. Several clients (Java, C#, Node.js, the Python push consumer) do not
start until that answer arrives, and they take from it the retry policy, the
largest body, the receive batch and the long-polling time.

A consumer is a member of its group like any other (ConsumerManager: `group
describe` lists it, heartbeats refresh it, silence or a termination notice
ends it), registered from its settings, with the consume type CONSUME_POP.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidemark.broker.controller import BrokerController
from tidemark.broker.errors import InvalidArgumentError
from tidemark.broker.membership.groups import check_group
from tidemark.broker.membership.members import ConsumerInfo
from tidemark.broker.services.convert import checked_client_id
from tidemark.broker.services.rmq5.convert import duration, resource_name
from tidemark.broker.services.rmq5.status import Code, ProtocolError
from tidemark.common.protocol import ExpressionType, MessageFilter, parse_filter
from tidemark.rmq5.v2 import messaging_pb2 as pb

CONSUME_POP = "CONSUME_POP"
CONSUMER_TYPES = (pb.PUSH_CONSUMER, pb.SIMPLE_CONSUMER)
# The proxy's defaults for what the broker tells its clients.
PRODUCER_MAX_ATTEMPTS = 3
PRODUCER_BACKOFF = pb.ExponentialBackoff(initial=duration(10), max=duration(1000), multiplier=2.0)
RECEIVE_BATCH_SIZE = 32
LONG_POLLING_TIMEOUT_MS = 20_000
CLIENT_ID_HEADER = "x-mq-client-id"


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """What a client said it is."""

    client_id: str
    client_type: int
    group: str = ""
    subscriptions: tuple[tuple[str, str], ...] = ()
    topics: tuple[str, ...] = ()
    sql92_topics: frozenset[str] = frozenset()  # the subscriptions whose expression is SQL92
    namespace: str = ""  # the client's namespace: how it is answered (topics and group are stored names)


def client_id_of(metadata) -> str:
    """The x-mq-client-id header every official client sends; CLIENT_ID_REQUIRED without one."""
    for key, value in metadata or ():
        if key.lower() == CLIENT_ID_HEADER and isinstance(value, str) and value:
            try:
                return checked_client_id(value)
            except InvalidArgumentError as e:
                raise ProtocolError(Code.CLIENT_ID_REQUIRED, f"{CLIENT_ID_HEADER}: {e}") from None
    raise ProtocolError(Code.CLIENT_ID_REQUIRED, f"the {CLIENT_ID_HEADER} header is required")


def parse_settings(client_id: str, s: pb.Settings) -> ClientSettings:
    """The client's own description, checked; InvalidArgumentError for settings the broker cannot serve."""
    kind = s.client_type if s.HasField("client_type") else pb.CLIENT_TYPE_UNSPECIFIED
    if kind == pb.PRODUCER:
        if s.WhichOneof("pub_sub") != "publishing":
            raise ProtocolError(Code.BAD_REQUEST, "a producer's settings need `publishing`")
        return ClientSettings(client_id, kind, topics=tuple(resource_name(t, "topic") for t in s.publishing.topics),
                              namespace=next((t.resource_namespace for t in s.publishing.topics), ""))
    if kind not in CONSUMER_TYPES:
        name = pb.ClientType.Name(kind) if kind in pb.ClientType.values() else str(kind)
        raise ProtocolError(Code.UNRECOGNIZED_CLIENT_TYPE, f"client type {name} is not supported by this broker")
    if s.WhichOneof("pub_sub") != "subscription" or not s.subscription.HasField("group"):
        raise ProtocolError(Code.BAD_REQUEST, "a consumer's settings need `subscription` with its group")
    group = resource_name(s.subscription.group, "group")
    check_group(group)
    subscriptions, sql92 = [], set()
    for entry in s.subscription.subscriptions:
        topic, f = resource_name(entry.topic, "topic"), filter_expression(entry.expression)
        subscriptions.append((topic, f.expression))
        if f.expression_type == ExpressionType.SQL92:
            sql92.add(topic)
    return ClientSettings(client_id, kind, group=group, subscriptions=tuple(subscriptions),
                          sql92_topics=frozenset(sql92), namespace=s.subscription.group.resource_namespace)


def filter_expression(f: pb.FilterExpression) -> MessageFilter:
    """The filter of a subscription or a receive: a tag expression ("*", "a||b"; TAG or unspecified) or an
    SQL92 condition on the message's properties (SQL); ILLEGAL_FILTER_EXPRESSION, with the column of the
    error, for a bad one."""
    kind = ExpressionType.SQL92 if f.type == pb.SQL else ExpressionType.TAG
    try:
        return parse_filter(f.expression, kind)
    except ValueError as e:
        raise ProtocolError(Code.ILLEGAL_FILTER_EXPRESSION, str(e)) from None


class ClientRegistry:
    """The clients of the protocol with an open telemetry stream, by client id: what they said they are.
    Bounded by the open streams; a consumer's membership itself lives in ConsumerManager (expiry)."""

    def __init__(self, broker: BrokerController) -> None:
        self._b = broker
        self._clients: dict[str, ClientSettings] = {}

    def get(self, client_id: str) -> ClientSettings | None:
        return self._clients.get(client_id)

    def settings(self, client_id: str, s: pb.Settings, host: str) -> pb.Settings:
        """Register what the client says it is; the effective settings to answer it with."""
        client = parse_settings(client_id, s)
        previous = self._clients.get(client_id)
        if previous is not None and previous.group and previous.group != client.group:
            self._b.consumers.unregister(previous.group, client_id, reason="settings changed")
        self._clients[client_id] = client
        if client.group:
            self._join(client, host)
        return self._effective(s, client)

    def heartbeat(self, client_id: str, group: str, client_type: int, host: str) -> None:
        """Refresh a consumer's membership (a producer's heartbeat only says it is alive)."""
        if client_type not in CONSUMER_TYPES and not group:
            return
        if client_type == pb.PRODUCER:
            raise ProtocolError(Code.BAD_REQUEST, "a producer's heartbeat carries no group")
        check_group(group)
        client = self._clients.get(client_id)
        if client is None or client.group != group:
            # Its settings are on the way (the clients do not wait for their answer): a member now.
            client = ClientSettings(client_id, client_type, group=group)
        self._join(client, host)

    def terminated(self, client_id: str, group: str) -> None:
        """NotifyClientTermination: the client leaves its group now, not at expiry."""
        client = self._clients.pop(client_id, None)
        for g in {group, client.group if client else ""} - {""}:
            self._b.consumers.unregister(g, client_id, reason="client terminated")

    def disconnected(self, client_id: str, said: ClientSettings | None) -> None:
        """The telemetry stream on which the client said `said` ended: it stays a member until it
        terminates or its heartbeats stop (a client reopens the stream and says again what it is; a
        newer stream's settings stay)."""
        if said is not None and self._clients.get(client_id) is said:
            del self._clients[client_id]

    def _join(self, client: ClientSettings, host: str) -> None:
        self._b.heartbeat(ConsumerInfo(
            client_id=client.client_id, group=client.group, subscriptions=client.subscriptions,
            consume_type=CONSUME_POP, host=host, sql92_topics=client.sql92_topics))

    def _effective(self, s: pb.Settings, client: ClientSettings) -> pb.Settings:
        out = pb.Settings()
        out.CopyFrom(s)
        out.metric.Clear()
        out.metric.on = False
        config = self._b.config
        if client.client_type == pb.PRODUCER:
            out.backoff_policy.CopyFrom(pb.RetryPolicy(max_attempts=PRODUCER_MAX_ATTEMPTS,
                                                       exponential_backoff=PRODUCER_BACKOFF))
            out.publishing.max_body_size = config.max_message_size
            out.publishing.validate_message_type = True
            return out
        group = self._b.groups.ensure(client.group)
        delays = self._b.operations.redelivery_delays_ms()
        out.backoff_policy.CopyFrom(pb.RetryPolicy(
            max_attempts=group.retry_max_times + 1,
            customized_backoff=pb.CustomizedBackoff(next=[duration(ms) for ms in delays])))
        sub = out.subscription
        sub.fifo = group.consume_orderly
        sub.receive_batch_size = RECEIVE_BATCH_SIZE
        sub.long_polling_timeout.CopyFrom(duration(LONG_POLLING_TIMEOUT_MS))
        return out
