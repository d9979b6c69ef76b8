"""Settings of each client component: frozen dataclasses with RocketMQ's defaults, validated once.

Build them directly (`PushConsumerSettings(group="g", brokers=("h:p",))`) or pass
keyword overrides to a component (`PushConsumer(group="g", pull_batch_size=64)`).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from client.consumer.allocate import AllocateMessageQueueStrategy
from client.errors import InvalidArgumentError
from client.message import ConsumeFromWhere, MessageModel
from tidemark.protocol import DEFAULT_BROKER_ADDR, DEFAULT_MAX_MESSAGE_SIZE, InvalidNameError, check_group_name

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


def local_ip() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _default_consume_timestamp() -> str:
    """RocketMQ's default: half an hour before start, as yyyyMMddHHmmss."""
    return time.strftime("%Y%m%d%H%M%S", time.localtime(time.time() - 30 * 60))


@dataclass(frozen=True, kw_only=True)
class ClientSettings:
    brokers: tuple[str, ...] = field(default_factory=default_brokers)
    client_ip: str = field(default_factory=local_ip)
    # Default: the pid, so two processes on one host differ (RocketMQ's instanceName).
    instance_name: str = ""
    request_timeout_s: float = 3.0
    # How long a topic route is trusted before it is fetched again.
    route_refresh_interval_s: float = 30.0

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
    producer_group: str = "DEFAULT_PRODUCER"
    send_msg_timeout_s: float = 3.0
    retry_times_when_send_failed: int = 2
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_group(self.producer_group)
        _positive(self, "send_msg_timeout_s", "max_message_size")
        if self.retry_times_when_send_failed < 0:
            raise InvalidArgumentError("retry_times_when_send_failed must be >= 0")


@dataclass(frozen=True, kw_only=True)
class ConsumerSettings(ClientSettings):
    group: str
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    consume_timestamp: str = field(default_factory=_default_consume_timestamp)
    allocate_strategy: str | AllocateMessageQueueStrategy = "AVG"
    pull_batch_size: int = 32
    pull_threshold_for_queue: int = 1000
    pull_threshold_size_for_queue: int = 100 * 1024 * 1024
    persist_consumer_offset_interval_s: float = 5.0
    rebalance_interval_s: float = 20.0
    heartbeat_interval_s: float = 30.0
    # Long polling: how long the broker may hold a pull at the end of a queue.
    broker_suspend_max_time_ms: int = 15_000
    # Zero-duplicate handover: own a queue only while holding its broker lock (False: RocketMQ's behaviour).
    queue_locking: bool = True
    # Bounded wait for in-flight messages of a queue that moves away.
    drain_timeout_s: float = 10.0
    lock_renew_interval_s: float = 20.0

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
    consume_thread_min: int = 20
    consume_thread_max: int = 20
    consume_message_batch_max_size: int = 1
    consume_concurrently_max_span: int = 2000
    # -1: 16 for concurrent listeners, unlimited (local retries only) for orderly ones.
    max_reconsume_times: int = -1
    suspend_current_queue_time_ms: int = 1000
    # Failed messages whose send-back also failed are consumed again locally after this delay.
    local_retry_delay_s: float = 5.0

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
    pull_batch_size: int = 10
    auto_commit: bool = True
    auto_commit_interval_s: float = 5.0
    poll_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive(self, "auto_commit_interval_s", "poll_timeout_s")


def build(cls: type, settings: object | None, overrides: dict) -> object:
    """settings, with keyword overrides applied (or a new instance from the overrides)."""
    if settings is not None and not isinstance(settings, cls):
        raise InvalidArgumentError(f"expected {cls.__name__}, got {type(settings).__name__}")
    if "brokers" in overrides and isinstance(overrides["brokers"], str):
        overrides["brokers"] = parse_brokers(overrides["brokers"])
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise InvalidArgumentError(f"unknown {cls.__name__} option(s): {', '.join(unknown)}")
    try:
        return dataclasses.replace(settings, **overrides) if settings is not None else cls(**overrides)
    except TypeError as e:
        raise InvalidArgumentError(f"{cls.__name__}: {e}") from None
