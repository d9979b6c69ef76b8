"""Wire-level rules shared by broker, client and connector.

Names a RocketMQ user knows (MixAll's topic prefixes, MessageConst's property
keys), the topic and group name rules, tag expressions and delay levels. Pure
functions only: no I/O, no grpc.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import secrets
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

from tidemark.common.sql92 import Sql92Filter, compile_sql92

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
# Transactions (RocketMQ's names): half messages wait in the first, their commits and rollbacks are
# recorded in the second.
TRANSACTION_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANSACTION_OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
SYSTEM_TOPIC_PREFIXES = (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)
# How long a client waits for PromoteBroker's answer (`tidemark broker promote`). A broker in controller
# mode may take its switchover timeout plus a lease, and a few etcd calls (PROMOTE_ETCD_MARGIN_S), to
# answer: its config is refused unless that fits (broker/config.py).
PROMOTE_DEADLINE_S = 30.0
PROMOTE_ETCD_MARGIN_S = 2.0

TOPIC_MAX_LENGTH = 127
GROUP_MAX_LENGTH = 255
_NAME_RE = re.compile(r"[%|a-zA-Z0-9_-]+")  # always fullmatch: `$` would let a trailing newline through
CLIENT_ID_MAX_LENGTH = 255
_CLIENT_ID_RE = re.compile(r"[\x21-\x7e]+")  # visible ASCII: client ids end up in logs and lock tables

DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024
# Trailing metadata naming a refusal's error class (e.g. FencedError), for callers that must tell it apart.
ERROR_CLASS_KEY = "tidemark-error"
DEFAULT_PORT = 10911
DEFAULT_BROKER_ADDR = f"127.0.0.1:{DEFAULT_PORT}"

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"


class PropertyKey:
    """Message property keys, named as RocketMQ's MessageConst names them."""

    KEYS = "KEYS"
    TAGS = "TAGS"
    UNIQ_KEY = "UNIQ_KEY"
    DELAY = "DELAY"
    RETRY_TOPIC = "RETRY_TOPIC"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QID = "REAL_QID"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    RECONSUME_TIME = "RECONSUME_TIME"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    CONSUME_START_TIME = "CONSUME_START_TIME"
    # Timestamp (ms) at which a scheduled message is due.
    DELIVER_TIMESTAMP = "DELIVER_TIMESTAMP"
    # A transaction's half message ("true") and its producer group (RocketMQ's names).
    TRANSACTION_PREPARED = "TRAN_MSG"
    PRODUCER_GROUP = "PGROUP"
    # On a committed transactional message: the queue offset of its half message.
    TRANSACTION_HALF_OFFSET = "TRAN_HALF_OFFSET"
    # A message's message group (RocketMQ 5 FIFO; RocketMQ 4's sharding key): both protocols store it here.
    SHARDING_KEY = "__SHARDINGKEY"


class InvalidNameError(ValueError):
    """A topic or group name breaks the naming rules."""


def check_topic_name(name: str, *, allow_system: bool = True) -> None:
    """Raise InvalidNameError with a message saying what is wrong with a topic name."""
    _check_name("topic", name, TOPIC_MAX_LENGTH)
    if not allow_system and name.startswith("%"):
        raise InvalidNameError(f"topic {name!r} is reserved: names starting with '%' are system topics")


def check_group_name(name: str) -> None:
    """Raise InvalidNameError with a message saying what is wrong with a group name."""
    _check_name("group", name, GROUP_MAX_LENGTH)


def _check_name(kind: str, name: str, max_length: int) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidNameError(f"{kind} name must not be empty")
    if len(name) > max_length:
        raise InvalidNameError(f"{kind} name {name[:40]!r}... is {len(name)} characters; at most {max_length} allowed")
    if not _NAME_RE.fullmatch(name):
        raise InvalidNameError(f"{kind} name {name!r} may only contain letters, digits, '%', '|', '_' and '-'")


def check_client_id(client_id: str) -> None:
    """Raise InvalidNameError unless client_id is 1..255 visible ASCII characters (no spaces or controls)."""
    if not isinstance(client_id, str) or not client_id:
        raise InvalidNameError("client id must not be empty")
    if len(client_id) > CLIENT_ID_MAX_LENGTH:
        raise InvalidNameError(f"client id {client_id[:40]!r}... is {len(client_id)} characters; "
                               f"at most {CLIENT_ID_MAX_LENGTH} allowed")
    if not _CLIENT_ID_RE.fullmatch(client_id):
        raise InvalidNameError(f"client id {client_id!r} may only contain visible ASCII characters "
                               f"(no spaces or control characters)")


# Topics only the broker writes (producers are refused).
_BROKER_TOPICS = frozenset({SCHEDULE_TOPIC, TRANSACTION_HALF_TOPIC, TRANSACTION_OP_TOPIC})


def split_host_port(address: str) -> tuple[str, int] | None:
    """`host:port` as (host, port), or None when it is not one: a port of ASCII digits 1..65535 (str.isdigit
    alone lets '¹' through, which int() refuses), after a non-empty host ("[::1]" keeps its brackets)."""
    host, colon, port = address.rpartition(":")
    if not colon or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        return None
    return host, int(port)


def is_broker_topic(topic: str) -> bool:
    return topic in _BROKER_TOPICS


def is_system_topic(topic: str) -> bool:
    return topic.startswith(SYSTEM_TOPIC_PREFIXES) or topic in _BROKER_TOPICS


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_GROUP_TOPIC_PREFIX)


def is_dlq_topic(topic: str) -> bool:
    return topic.startswith(DLQ_GROUP_TOPIC_PREFIX)


def tag_hash(tag: str) -> int:
    """The tags code stored in a consume queue entry for a message tag (0 for none)."""
    if not tag:
        return 0
    return zlib.crc32(tag.encode("utf-8"))


class ExpressionType:
    """How a subscription's expression is read (RocketMQ's ExpressionType): tags, or an SQL92 condition on the
    message's properties (common/sql92.py)."""

    TAG = "TAG"
    SQL92 = "SQL92"
    ALL = (TAG, SQL92)


@dataclass(frozen=True, slots=True)
class TagExpression:
    """A parsed subscription expression: "*" (everything) or "tagA || tagB"."""

    expression: str
    tags: frozenset[str]
    codes: frozenset[int]

    expression_type: ClassVar[str] = ExpressionType.TAG

    @property
    def matches_all(self) -> bool:
        return not self.tags

    @property
    def code_filter(self) -> frozenset[int] | None:
        """The consume-queue tags codes to pre-filter by; None when every entry may match."""
        return None if not self.tags else self.codes

    def matches_properties(self, properties: Mapping[str, str]) -> bool:
        """Exact check on a stored message's properties (its TAGS)."""
        return not self.tags or properties.get(PropertyKey.TAGS, "") in self.tags

    def matches_code(self, code: int) -> bool:
        """First, cheap check on the consume queue's tags code."""
        return self.matches_all or code in self.codes

    def matches_tag(self, tag: str) -> bool:
        """Exact check on the stored tag (hash codes may collide)."""
        return self.matches_all or tag in self.tags


@functools.lru_cache(maxsize=1024)
def parse_tag_expression(expression: str | None) -> TagExpression:
    """Parse "*", "" (everything) or "a || b"; raise ValueError on an empty alternative.

    Memoised: every pull (client and broker) carries its subscription, and a process sees few of them."""
    text = (expression or "").strip()
    if text in ("", "*"):
        return TagExpression("*", frozenset(), frozenset())
    tags = [part.strip() for part in text.split("||")]
    if any(not t for t in tags):
        raise ValueError(f"tag expression {expression!r} has an empty tag; use '*' or 'tagA || tagB'")
    if any("*" in t for t in tags):
        raise ValueError(f"tag expression {expression!r}: '*' must stand alone")
    return TagExpression(text, frozenset(tags), frozenset(tag_hash(t) for t in tags))


# What a read of a queue filters by: either kind offers expression, expression_type, matches_all, code_filter,
# matches_code (the consume queue's tags code) and matches_properties (the stored message's properties).
MessageFilter: TypeAlias = TagExpression | Sql92Filter


def parse_filter(expression: str | None, expression_type: str = ExpressionType.TAG) -> MessageFilter:
    """A subscription's filter: a tag expression (parse_tag_expression) or an SQL92 condition (compile_sql92;
    Sql92Error names the column); ValueError for a bad one. Both are memoised."""
    if expression_type == ExpressionType.TAG:
        return parse_tag_expression(expression)
    if expression_type == ExpressionType.SQL92:
        return compile_sql92(expression or "")
    raise ValueError(f"expression type {expression_type!r} is not one of {', '.join(ExpressionType.ALL)}")


_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION_RE = re.compile(r"^(\d+)(ms|s|m|h|d)$")


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """Parse RocketMQ's messageDelayLevel string ("1s 5s 10s 30s 1m ...") into milliseconds.

    Level n (1-based) waits levels[n - 1] ms.
    """
    levels = []
    for token in text.split():
        m = _DURATION_RE.fullmatch(token)
        if not m:
            raise ValueError(f"delay level {token!r} is not a duration like 500ms, 5s, 1m, 2h or 1d")
        levels.append(int(m.group(1)) * _DURATION_UNITS_MS[m.group(2)])
    if not levels:
        raise ValueError("at least one delay level is needed")
    return tuple(levels)


def delay_level_of(value: str | None) -> int:
    """A DELAY property's level as RocketMQ reads it: absent or blank is 0; ValueError when it is no
    integer. (0 or below: not delayed; above the broker's levels: its last level, the send's clamp.)"""
    if value is None or not value.strip():
        return 0
    return int(value)


def delays(value: str | None) -> bool:
    """Whether a DELAY property delays its message; one that is no integer counts (a send refuses it)."""
    try:
        return delay_level_of(value) > 0
    except ValueError:
        return True


def due_later(deliver_at: str | None, now_ms: float) -> bool:
    """Whether a DELIVER_TIMESTAMP property is still to come at `now_ms`; one that is no number counts (a
    send refuses it). One already past, as a delivered timed message carries it, is due now."""
    if deliver_at is None:
        return False
    try:
        return int(deliver_at) > now_ms
    except ValueError:
        return True


def format_duration_ms(ms: int) -> str:
    for unit in ("d", "h", "m", "s"):
        size = _DURATION_UNITS_MS[unit]
        if ms % size == 0 and ms >= size:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def split_keys(keys: str) -> list[str]:
    """RocketMQ stores several keys in one property separated by spaces."""
    return [k for k in keys.split(" ") if k]


class MessageIdGenerator:
    """Unique message ids (RocketMQ's UNIQ_KEY shape: 32 upper-case hex characters).

    16 bytes: a per-process prefix (pid and random bits, so two processes on one
    host differ), milliseconds since the epoch, and a wrapping counter.
    Thread-safe: next() on an itertools.count is one atomic step in CPython.
    """

    def __init__(self) -> None:
        self._prefix = ((os.getpid() & 0xFFFF).to_bytes(2, "big") + secrets.token_bytes(4)).hex().upper()
        self._counter = itertools.count(1)

    def next(self) -> str:
        return f"{self._prefix}{time.time_ns() // 1_000_000:016X}{next(self._counter) & 0xFFFF:04X}"
