"""Settings of each client component: frozen dataclasses with RocketMQ's defaults, validated once.

Build them directly (`PushConsumerSettings(group="g", brokers=("h:p",))`) or pass
keyword overrides to a component (`PushConsumer(group="g", pull_batch_size=64)`).
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidemark.client.consumer.allocate import AllocateMessageQueueStrategy, strategy_by_name
from tidemark.client.errors import InvalidArgumentError
from tidemark.client.message import ConsumeFromWhere, MessageModel
from tidemark.client.namespacing import wrap_name
from tidemark.client.security import (
    TlsSettings,
    coerce_credentials,
    coerce_tls,
    credentials_from_env,
    tls_from_env,
)
from tidemark.common.auth import Credentials
from tidemark.common.namespaces import check_namespace
from tidemark.common.protocol import (
    DEFAULT_BROKER_ADDR,
    DEFAULT_MAX_MESSAGE_SIZE,
    InvalidNameError,
    check_group_name,
    split_host_port,
)

BROKER_ENV = "TIDEMARK_BROKER"
NAMESRV_ENV = "TIDEMARK_NAMESRV"


def default_brokers() -> tuple[str, ...]:
    """Broker addresses from TIDEMARK_BROKER (comma list), else 127.0.0.1:10911."""
    return parse_brokers(os.environ.get(BROKER_ENV) or DEFAULT_BROKER_ADDR)


def default_namesrv() -> tuple[str, ...]:
    """Name server addresses from TIDEMARK_NAMESRV (comma list), else none."""
    value = os.environ.get(NAMESRV_ENV, "")
    return parse_addresses(value, "name server") if value.strip() else ()


def parse_brokers(value: str | Sequence[str]) -> tuple[str, ...]:
    return parse_addresses(value, "broker")


def parse_addresses(value: str | Sequence[str], kind: str) -> tuple[str, ...]:
    """host:port addresses from a comma list or a sequence; InvalidArgumentError naming a bad one."""
    items = value.split(",") if isinstance(value, str) else list(value)
    out = tuple(a.strip() for a in items if a and a.strip())
    if not out:
        raise InvalidArgumentError(f"at least one {kind} address (host:port) is needed")
    for address in out:
        if split_host_port(address) is None:
            raise InvalidArgumentError(f"{kind} address {address!r} is not host:port")
    return out


_instances = itertools.count(1)
_instances_lock = threading.Lock()


def unique_instance(settings: ClientSettings) -> ClientSettings:
    """settings with an instance name of its own when none was given: the pid for the first consumer
    of the process, pid-2, pid-3... after, so two consumers in one process never share a client id."""
    if settings.instance_name:
        return settings
    with _instances_lock:
        n = next(_instances)
    name = str(os.getpid()) if n == 1 else f"{os.getpid()}-{n}"
    return dataclasses.replace(settings, instance_name=name)


def local_ip() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _setting(default, help: str, *, factory=None, required: bool = False):
    """A settings field with its help text (shown in the README's configuration reference)."""
    metadata = {"help": help}
    if required:
        return field(metadata=metadata)
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _default_consume_timestamp() -> str:
    """RocketMQ's default: half an hour before start, as yyyyMMddHHmmss."""
    return time.strftime("%Y%m%d%H%M%S", time.localtime(time.time() - 30 * 60))


@dataclass(frozen=True, kw_only=True)
class ClientSettings:
    brokers: tuple[str, ...] = _setting(None, "Broker addresses host:port (default: $TIDEMARK_BROKER or "
                                        "127.0.0.1:10911, unless name servers are used)")
    namesrv: tuple[str, ...] = _setting(None, "Name server addresses host:port; when set, brokers are found "
                                        "through them and `brokers` is not used (default: $TIDEMARK_NAMESRV, "
                                        "unless `brokers` is given)")
    client_ip: str = _setting(None, "IP part of the client id ip@instanceName", factory=local_ip)
    instance_name: str = _setting("", "Instance part of the client id (default: the pid)")
    request_timeout_s: float = _setting(3.0, "Timeout of one request to a broker")
    route_refresh_interval_s: float = _setting(30.0, "How long a topic route is trusted before it is fetched again")
    credentials: Credentials | tuple[str, str] | None = _setting(
        None, "tidemark.common.auth.Credentials or (access_key, secret_key) signing every request (default: "
              "$TIDEMARK_ACCESS_KEY and $TIDEMARK_SECRET_KEY when both are set)", factory=credentials_from_env)
    tls: bool | TlsSettings | None = _setting(
        None, "False: plaintext; True: TLS with default trust roots; or TlsSettings(ca_file=, cert_file=, "
              "key_file=, server_name=) (default: TLS when $TIDEMARK_TLS_CA_FILE is set)", factory=tls_from_env)
    namespace: str = _setting("", "Namespace of the topics and groups this client names (RocketMQ's namespace): "
                                  "stored as NAMESPACE%name, handed back bare; '' for none")

    def __post_init__(self) -> None:
        # Given brokers and no name servers: those brokers, whatever $TIDEMARK_NAMESRV says.
        if self.namesrv is None:
            object.__setattr__(self, "namesrv", default_namesrv() if self.brokers is None else ())
        elif isinstance(self.namesrv, str) and not self.namesrv.strip():
            object.__setattr__(self, "namesrv", ())
        elif self.namesrv:
            object.__setattr__(self, "namesrv", parse_addresses(self.namesrv, "name server"))
        if self.brokers is None or (self.namesrv and not self.brokers):
            object.__setattr__(self, "brokers", () if self.namesrv else default_brokers())
        else:
            object.__setattr__(self, "brokers", parse_brokers(self.brokers))
        object.__setattr__(self, "credentials", coerce_credentials(self.credentials))
        object.__setattr__(self, "tls", coerce_tls(self.tls))
        if self.request_timeout_s <= 0:
            raise InvalidArgumentError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        try:
            check_namespace(self.namespace)
        except InvalidNameError as e:
            raise InvalidArgumentError(str(e)) from None

    @property
    def client_id(self) -> str:
        return f"{self.client_ip}@{self.instance_name or os.getpid()}"


def _check_group(group: str) -> None:
    try:
        check_group_name(group)
    except InvalidNameError as e:
        raise InvalidArgumentError(str(e)) from None


def _coerce_enum(settings: object, name: str, enum_cls: type[enum.Enum], *, prefix: str = "",
                 suffix: str = "") -> None:
    """Accept an enum member or its name (any case, the prefix and suffix optional: "first" for
    CONSUME_FROM_FIRST_OFFSET, as the CLI's --from-where); store the member."""
    value = getattr(settings, name)
    if isinstance(value, enum_cls):
        return
    if isinstance(value, str):
        key = value.strip().upper()
        for candidate in (key, prefix + key, prefix + key + suffix):
            if candidate in enum_cls.__members__:
                object.__setattr__(settings, name, enum_cls[candidate])
                return
    names = ", ".join(enum_cls.__members__)
    raise InvalidArgumentError(f"{name} must be one of {names} (or the member itself), got {value!r}")


def _strategy(value: object, args: Mapping[str, Any]) -> AllocateMessageQueueStrategy:
    """An allocation strategy instance from an instance, or from a name and its constructor arguments."""
    if isinstance(value, AllocateMessageQueueStrategy):
        return value  # (already built, maybe from a name and these args: settings are re-validated on replace)
    if not isinstance(value, str):
        raise InvalidArgumentError(f"allocate_strategy must be a strategy name or an AllocateMessageQueueStrategy, "
                                   f"got {type(value).__name__}")
    try:
        return strategy_by_name(value, **dict(args or {}))
    except TypeError as e:
        raise InvalidArgumentError(
            f"allocate_strategy {value!r} cannot be built from allocate_strategy_args={dict(args or {})!r}: {e}. "
            f"Pass its arguments in allocate_strategy_args or pass a strategy instance") from None
    except ValueError as e:
        raise InvalidArgumentError(f"allocate_strategy: {e}") from None


def _positive(settings: object, *names: str) -> None:
    for name in names:
        value = getattr(settings, name)
        if value <= 0:
            raise InvalidArgumentError(f"{name} must be > 0, got {value}")


@dataclass(frozen=True, kw_only=True)
class ProducerSettings(ClientSettings):
    send_msg_timeout_s: float = _setting(3.0, "Timeout of one send")
    retry_times_when_send_failed: int = _setting(2, "Retries of a retriable send failure, on another broker's queue "
                                                    "when there is one")
    max_message_size: int = _setting(DEFAULT_MAX_MESSAGE_SIZE, "Largest body accepted")
    max_async_in_flight: int = _setting(10_000, "send_async/send_oneway messages unanswered before new ones wait "
                                                "(RocketMQ's backPressureForAsyncSendNum)")
    linger_ms: float = _setting(0.0, "send_async/send_oneway: how long a batch may wait for more messages "
                                     "(Kafka's linger.ms; 0: at once while nothing is in flight to the "
                                     "broker, else with the messages that came meanwhile: natural batching)")
    batch_size: int = _setting(256 * 1024, "send_async/send_oneway: bytes of encoded messages per batch "
                                           "(Kafka's batch.size)")
    max_in_flight_requests: int = _setting(5, "Batches on their way to the brokers at once "
                                              "(Kafka's max.in.flight.requests.per.connection)")
    producer_group: str = _setting("", "Producer group: a transactional producer's half messages are checked with "
                                       "any live producer of its group (RocketMQ's producerGroup)")
    enable_idempotence: bool = _setting(True, "A retried batch is stored once (producer id and sequences per "
                                              "queue; Kafka's enable.idempotence)")
    max_in_flight_per_queue: int = _setting(5, "Idempotent producer: batches of one queue on their way at once, "
                                               "1..5 (Kafka's limit with idempotence: the broker answers a "
                                               "retry of any of a queue's last 5 batches with its offsets)")
    producer_key: str = _setting("", "Idempotent producers with the same key share one producer id, so a replay "
                                     "of the same sends (a restarted Spark task) is recognised; empty: a fresh id")
    producer_epoch: int = _setting(0, "The epoch every queue's sequences start in: a keyed producer that writes in "
                                      "rounds (Spark's micro-batches) starts each round higher, so a replay of a "
                                      "round matches it and an older round cannot write again")

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive(self, "send_msg_timeout_s", "max_message_size", "max_async_in_flight", "batch_size",
                  "max_in_flight_requests")
        if not 1 <= self.max_in_flight_per_queue <= 5:
            raise InvalidArgumentError(f"max_in_flight_per_queue must be 1..5, got {self.max_in_flight_per_queue}")
        if self.retry_times_when_send_failed < 0:
            raise InvalidArgumentError("retry_times_when_send_failed must be >= 0")
        if not 0 <= self.producer_epoch < 2**62:
            raise InvalidArgumentError(f"producer_epoch must be between 0 and 2**62, got {self.producer_epoch}")
        if not 0 <= self.linger_ms <= 60_000:
            raise InvalidArgumentError(f"linger_ms must be between 0 and 60000, got {self.linger_ms}")
        if self.producer_group:  # stored in the namespace: its transactions are checked by its own producers
            object.__setattr__(self, "producer_group", wrap_name(self.namespace, self.producer_group, "group"))


@dataclass(frozen=True, kw_only=True)
class ConsumerSettings(ClientSettings):
    group: str = _setting(None, "Consumer group (required)", required=True)
    message_model: MessageModel = _setting(MessageModel.CLUSTERING, "CLUSTERING (queues shared) or BROADCASTING")
    consume_from_where: ConsumeFromWhere = _setting(
        ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, "Start of a queue the group has no offset for")
    consume_timestamp: str = _setting(None, "yyyyMMddHHmmss for CONSUME_FROM_TIMESTAMP (default: 30 min ago)",
                                      factory=_default_consume_timestamp)
    allocate_strategy: str | AllocateMessageQueueStrategy = _setting(
        "AVG", "AVG, AVG_BY_CIRCLE, CONSISTENT_HASH, CONFIG, MACHINE_ROOM, MACHINE_ROOM_NEARBY or an instance")
    allocate_strategy_args: Mapping[str, Any] = _setting(
        None, "Constructor arguments of a strategy given by name, e.g. {'consume_idcs': ['hz']} for "
              "MACHINE_ROOM, {'message_queues': [...]} for CONFIG", factory=dict)
    pull_batch_size: int = _setting(32, "Messages of one queue per turn on the fetch stream (RocketMQ's "
                                        "pullBatchSize): queues take turns in each frame")
    pull_threshold_for_queue: int = _setting(1000, "Cached messages per queue before pulling pauses")
    pull_threshold_size_for_queue: int = _setting(100 * 1024 * 1024, "Cached bytes per queue before pulling pauses")
    persist_consumer_offset_interval_s: float = _setting(5.0, "How often offsets are committed (oneway)")
    rebalance_interval_s: float = _setting(20.0, "Periodic rebalance (also on start and membership change)")
    heartbeat_interval_s: float = _setting(30.0, "Heartbeat to every broker")
    queue_locking: bool = _setting(True, "Zero-duplicate handover with queue locks (False: RocketMQ's behaviour)")
    drain_timeout_s: float = _setting(
        10.0, "Wait for in-flight messages of a queue that moves away (an orderly queue stays locked until its "
              "listener call returns; at shutdown this long)")
    lock_renew_interval_s: float = _setting(
        20.0, "Queue lock renewal (a broker keeps a lock 60 s; an orderly queue waits once none was answered for 30)")

    def __post_init__(self) -> None:
        super().__post_init__()
        # The stored name from here on (offsets, membership, the retry topic); wrapping it again is a no-op.
        object.__setattr__(self, "group", wrap_name(self.namespace, self.group, "group"))
        _check_group(self.group)
        _coerce_enum(self, "message_model", MessageModel)
        _coerce_enum(self, "consume_from_where", ConsumeFromWhere, prefix="CONSUME_FROM_", suffix="_OFFSET")
        object.__setattr__(self, "allocate_strategy", _strategy(self.allocate_strategy, self.allocate_strategy_args))
        _positive(self, "pull_batch_size", "pull_threshold_for_queue", "pull_threshold_size_for_queue",
                  "persist_consumer_offset_interval_s", "rebalance_interval_s", "heartbeat_interval_s",
                  "drain_timeout_s", "lock_renew_interval_s")
        if not 1 <= self.pull_batch_size <= 1024:
            raise InvalidArgumentError(f"pull_batch_size must be 1..1024, got {self.pull_batch_size}")
        try:
            time.strptime(self.consume_timestamp, "%Y%m%d%H%M%S")
        except ValueError:
            raise InvalidArgumentError(
                f"consume_timestamp must be yyyyMMddHHmmss, got {self.consume_timestamp!r}") from None

    @property
    def consume_timestamp_ms(self) -> int:
        return int(time.mktime(time.strptime(self.consume_timestamp, "%Y%m%d%H%M%S")) * 1000)


@dataclass(frozen=True, kw_only=True)
class PushConsumerSettings(ConsumerSettings):
    consume_thread_max: int = _setting(20, "Listener threads (started as needed, up to this many)")
    consume_message_batch_max_size: int = _setting(1, "Messages per listener call")
    consume_concurrently_max_span: int = _setting(2000, "Pause pulling when cached offsets span more than this")
    max_reconsume_times: int = _setting(-1, "Retries before the DLQ; -1: the group's retry_max_times (16), "
                                            "unlimited local retries for orderly")
    suspend_current_queue_time_ms: int = _setting(1000, "Orderly: wait before retrying a suspended batch (it holds back its message group)")
    local_retry_delay_s: float = _setting(5.0, "Re-consume locally after this when the send-back failed")
    await_termination_ms_when_shutdown: int = _setting(
        0, "shutdown() without queue locks: wait up to this long for the listener batches already fetched, so "
           "the offsets persisted count them (RocketMQ's awaitTerminationMillisWhenShutdown; 0: not waited "
           "for, and delivered again after a restart). With locks every queue handed back waits for its own "
           "(drain_timeout_s)")

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive(self, "consume_thread_max", "consume_message_batch_max_size",
                  "consume_concurrently_max_span", "suspend_current_queue_time_ms", "local_retry_delay_s")
        if self.await_termination_ms_when_shutdown < 0:
            raise InvalidArgumentError(f"await_termination_ms_when_shutdown must be >= 0, got "
                                       f"{self.await_termination_ms_when_shutdown}")
        if self.max_reconsume_times < -1:
            raise InvalidArgumentError("max_reconsume_times must be -1 (default) or >= 0")


@dataclass(frozen=True, kw_only=True)
class PullConsumerSettings(ConsumerSettings):
    pull_batch_size: int = _setting(10, "Messages of one queue per turn on the fetch stream")
    auto_commit: bool = _setting(True, "Commit polled offsets periodically (off after a manual commit())")
    auto_commit_interval_s: float = _setting(5.0, "Auto commit interval")
    poll_timeout_s: float = _setting(5.0, "Default poll() timeout")

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive(self, "auto_commit_interval_s", "poll_timeout_s")


def build(cls: type, settings: object | None, overrides: dict) -> object:
    """settings, with keyword overrides applied (or a new instance from the overrides)."""
    if settings is not None and not isinstance(settings, cls):
        raise InvalidArgumentError(f"expected {cls.__name__}, got {type(settings).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise InvalidArgumentError(f"unknown {cls.__name__} option(s): {', '.join(unknown)}")
    try:
        return dataclasses.replace(settings, **overrides) if settings is not None else cls(**overrides)
    except TypeError as e:
        raise InvalidArgumentError(f"{cls.__name__}: {e}") from None


def reference_table(cls: type) -> str:
    """Markdown table of a settings class: option, default, meaning."""
    rows = ["| option | default | meaning |", "| --- | --- | --- |"]
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default.value if hasattr(f.default, "value") else f.default
            shown = f"`{default!r}`" if isinstance(default, str) else f"`{default}`"
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            shown = "(computed)"
        else:
            shown = "required"
        rows.append(f"| `{f.name}` | {shown} | {f.metadata.get('help', '')} |")
    return "\n".join(rows)
