"""Settings of each client component: frozen dataclasses with RocketMQ's defaults, validated once.

Build them directly (`PushConsumerSettings(group="g", brokers=("h:p",))`) or pass
keyword overrides to a component (`PushConsumer(group="g", pull_batch_size=64)`).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from client.consumer.allocate import AllocateMessageQueueStrategy
from client.errors import InvalidArgumentError
from client.message import ConsumeFromWhere, MessageModel
from tidemark.protocol import (
    DEFAULT_BROKER_ADDR,
    DEFAULT_MAX_MESSAGE_SIZE,
    InvalidNameError,
    check_group_name,
)

BROKER_ENV = "TIDEMARK_BROKER"


def default_brokers() -> tuple[str, ...]:
    """Broker addresses from TIDEMARK_BROKER (comma list), else 127.0.0.1:10911."""
    return parse_brokers(os.environ.get(BROKER_ENV) or DEFAULT_BROKER_ADDR)


def parse_brokers(value: str | Sequence[str]) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    out = tuple(a.strip() for a in items if a and a.strip())
    if not out:
        raise InvalidArgumentError("at least one broker address (host:port) is needed")
    for address in out:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgumentError(f"broker address {address!r} is not host:port")
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
                                        "127.0.0.1:10911)", factory=default_brokers)
    client_ip: str = _setting(None, "IP part of the client id ip@instanceName", factory=local_ip)
    instance_name: str = _setting("", "Instance part of the client id (default: the pid)")
    request_timeout_s: float = _setting(3.0, "Timeout of one request to a broker")
    route_refresh_interval_s: float = _setting(30.0, "How long a topic route is trusted before it is fetched again")

    def __post_init__(self) -> None:
        object.__setattr__(self, "brokers", parse_brokers(self.brokers))
        if self.request_timeout_s <= 0:
            raise InvalidArgumentError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")

    @property
    def client_id(self) -> str:
        return f"{self.client_ip}@{self.instance_name or os.getpid()}"


def _check_group(group: str) -> None:
    try:
        check_group_name(group)
    except InvalidNameError as e:
        raise InvalidArgumentError(str(e)) from None


def _positive(settings: object, *names: str) -> None:
    for name in names:
        value = getattr(settings, name)
        if value <= 0:
            raise InvalidArgumentError(f"{name} must be > 0, got {value}")


@dataclass(frozen=True, kw_only=True)
class ProducerSettings(ClientSettings):
    producer_group: str = _setting("DEFAULT_PRODUCER", "Producer group name")
    send_msg_timeout_s: float = _setting(3.0, "Timeout of one send")
    retry_times_when_send_failed: int = _setting(2, "Retries of a retriable send failure, on another broker's queue "
                                                    "when there is one")
    max_message_size: int = _setting(DEFAULT_MAX_MESSAGE_SIZE, "Largest body accepted")
    max_async_in_flight: int = _setting(1024, "send_async/send_oneway requests in flight before new ones wait")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_group(self.producer_group)
        _positive(self, "send_msg_timeout_s", "max_message_size", "max_async_in_flight")
        if self.retry_times_when_send_failed < 0:
            raise InvalidArgumentError("retry_times_when_send_failed must be >= 0")


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
    pull_batch_size: int = _setting(32, "Messages per pull")
    pull_threshold_for_queue: int = _setting(1000, "Cached messages per queue before pulling pauses")
    pull_threshold_size_for_queue: int = _setting(100 * 1024 * 1024, "Cached bytes per queue before pulling pauses")
    persist_consumer_offset_interval_s: float = _setting(5.0, "How often offsets are committed (oneway)")
    rebalance_interval_s: float = _setting(20.0, "Periodic rebalance (also on start and membership change)")
    heartbeat_interval_s: float = _setting(30.0, "Heartbeat to every broker")
    broker_suspend_max_time_ms: int = _setting(15_000, "Long polling: how long the broker may hold a pull")
    queue_locking: bool = _setting(True, "Zero-duplicate handover with queue locks (False: RocketMQ's behaviour)")
    drain_timeout_s: float = _setting(10.0, "Wait for in-flight messages of a queue that moves away")
    lock_renew_interval_s: float = _setting(20.0, "Queue lock renewal (locks expire after 60 s)")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_group(self.group)
        _positive(self, "pull_batch_size", "pull_threshold_for_queue", "pull_threshold_size_for_queue",
                  "persist_consumer_offset_interval_s", "rebalance_interval_s", "heartbeat_interval_s",
                  "drain_timeout_s", "lock_renew_interval_s")
        if not 1 <= self.pull_batch_size <= 1024:
            raise InvalidArgumentError(f"pull_batch_size must be 1..1024, got {self.pull_batch_size}")
        if self.broker_suspend_max_time_ms < 0:
            raise InvalidArgumentError("broker_suspend_max_time_ms must be >= 0")
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
    consume_thread_min: int = _setting(20, "Listener threads (minimum)")
    consume_thread_max: int = _setting(20, "Listener threads (maximum)")
    consume_message_batch_max_size: int = _setting(1, "Messages per listener call")
    consume_concurrently_max_span: int = _setting(2000, "Pause pulling when cached offsets span more than this")
    max_reconsume_times: int = _setting(-1, "Retries before the DLQ; -1: the group's retry_max_times (16), "
                                            "unlimited local retries for orderly")
    suspend_current_queue_time_ms: int = _setting(1000, "Orderly: wait before retrying a suspended queue")
    local_retry_delay_s: float = _setting(5.0, "Re-consume locally after this when the send-back failed")

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive(self, "consume_thread_min", "consume_thread_max", "consume_message_batch_max_size",
                  "consume_concurrently_max_span", "suspend_current_queue_time_ms", "local_retry_delay_s")
        if self.consume_thread_min > self.consume_thread_max:
            raise InvalidArgumentError("consume_thread_min must not exceed consume_thread_max")
        if self.max_reconsume_times < -1:
            raise InvalidArgumentError("max_reconsume_times must be -1 (default) or >= 0")


@dataclass(frozen=True, kw_only=True)
class PullConsumerSettings(ConsumerSettings):
    pull_batch_size: int = _setting(10, "Messages per pull")
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
