"""Options of the tidemark data source, parsed once at planning into frozen dataclasses.

Spark hands options over as strings with case-insensitive keys. Every option is
checked here, before any task runs, and a bad one raises OptionError naming it,
so `spark.read.format("tidemark").option("startingOffsets", "{oops").load()`
fails in load() itself (check_read_options, from DataSource.schema) with a message
a user can act on; what depends on batch vs streaming fails when the reader is made.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tidemark.client.errors import InvalidArgumentError
from tidemark.client.security import TlsSettings
from tidemark.client.settings import (
    default_brokers,
    default_namesrv,
    parse_addresses,
    parse_brokers,
)
from tidemark.common.auth import Credentials
from tidemark.common.protocol import (
    InvalidNameError,
    check_group_name,
    check_topic_name,
    parse_tag_expression,
)
from tidemark.spark_connector.offsets import EARLIEST, LATEST
from tidemark.spark_connector.queues import (
    QueueRef,
    QueueSpecError,
    Subscription,
    compile_pattern,
    parse_assign,
    parse_queue_values,
)

# Canonical spelling of each option; keys arrive lower-cased.
# Credentials and TLS, for reads and writes alike; secretKey never leaves ReadOptions/WriteOptions
# in text (Credentials keeps it out of repr; Spark redacts option keys matching "secret" in plans).
SECURITY_OPTIONS = ("accessKey", "secretKey", "tls", "tlsCaFile", "tlsCertFile", "tlsKeyFile")
SUBSCRIBE_OPTIONS = ("topic", "subscribePattern", "assign")
STARTING_OPTIONS = ("startingOffsets", "startingTimestamp", "startingOffsetsByTimestamp")
ENDING_OPTIONS = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
READ_OPTIONS = ("brokers", "namesrv", *SUBSCRIBE_OPTIONS, "group", *STARTING_OPTIONS, *ENDING_OPTIONS,
                "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay", "minPartitions", "failOnDataLoss",
                "tagExpression", "commitOffsets", "pollTimeoutMs", *SECURITY_OPTIONS)
STREAM_ONLY = ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay", "commitOffsets")
BATCH_ONLY = ENDING_OPTIONS
WRITE_OPTIONS = ("brokers", "namesrv", "topic", "idempotent", *SECURITY_OPTIONS)
# Keys Spark itself may put into a data source's options (DataFrameWriter.save(path), writeStream).
SPARK_OWNED = frozenset({"path", "checkpointlocation", "queryname"})

DEFAULT_POLL_TIMEOUT_MS = 60_000
DEFAULT_MAX_TRIGGER_DELAY_S = 15 * 60.0  # Kafka's maxTriggerDelay default


class OptionError(InvalidArgumentError):
    """An option of the tidemark data source is unknown, missing or malformed."""


class OffsetKind(enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    COMMITTED = "committed"


@dataclass(frozen=True, kw_only=True)
class ByTimestamp:
    """Each queue's first message stored at or after a time (ms since the epoch); a queue with no such
    message: its max offset (latest). `every_queue` (startingTimestamp / endingTimestamp) or `per_queue`
    (...OffsetsByTimestamp; queues left out start at earliest / end at latest)."""

    every_queue: int | None = None
    per_queue: Mapping[QueueRef, int] = field(default_factory=dict)


# Where to start or end: a named position for every queue, explicit offsets per queue (EARLIEST / LATEST
# sentinels allowed as values, like Kafka's -2 / -1), or times resolved by the brokers.
OffsetSpec = OffsetKind | Mapping[QueueRef, int] | ByTimestamp


@dataclass(frozen=True, kw_only=True)
class Security:
    """Credentials and TLS from the options; None: not given, the client's own default applies
    ($TIDEMARK_ACCESS_KEY... in the process that opens the connection)."""

    credentials: Credentials | None = None
    tls: TlsSettings | None = None

    def client_kwargs(self) -> dict[str, Any]:
        return {name: value for name, value in (("credentials", self.credentials), ("tls", self.tls))
                if value is not None}


def _client_kwargs(brokers: tuple[str, ...], namesrv: tuple[str, ...], security: Security) -> dict[str, Any]:
    """brokers, namesrv, credentials and tls for a Producer, Admin or RecordReader. namesrv is always
    passed, empty or not: the driver decided where the brokers are found, so $TIDEMARK_NAMESRV in the
    process that opens the connection (an executor) cannot override an explicit `brokers` option."""
    return {"brokers": ",".join(brokers), "namesrv": namesrv, **security.client_kwargs()}


def describe_servers(brokers: tuple[str, ...], namesrv: tuple[str, ...]) -> str:
    """Where the clients look for brokers, for error messages."""
    return f"name servers {','.join(namesrv)}" if namesrv else ",".join(brokers)


@dataclass(frozen=True, kw_only=True)
class ReadOptions:
    streaming: bool
    brokers: tuple[str, ...]
    namesrv: tuple[str, ...] = ()
    subscription: Subscription
    group: str | None
    starting: OffsetSpec
    ending: OffsetSpec
    max_offsets_per_trigger: int | None
    # Streaming: skip a trigger until this many new messages wait, or max_trigger_delay_s passed.
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_s: float = DEFAULT_MAX_TRIGGER_DELAY_S
    min_partitions: int | None
    fail_on_data_loss: bool
    tag_expression: str
    commit_offsets: bool
    poll_timeout_s: float
    security: Security

    @property
    def brokers_csv(self) -> str:
        return ",".join(self.brokers)

    @property
    def topics(self) -> tuple[str, ...]:
        """Topics named by option 'topic' or 'assign' (none for subscribePattern)."""
        return self.subscription.topic_names()

    def client_kwargs(self) -> dict[str, Any]:
        """brokers, namesrv, credentials and tls for a Producer, Admin or RecordReader."""
        return _client_kwargs(self.brokers, self.namesrv, self.security)


@dataclass(frozen=True, kw_only=True)
class WriteOptions:
    brokers: tuple[str, ...]
    namesrv: tuple[str, ...] = ()
    topic: str
    security: Security
    # A replayed task or micro-batch stores nothing twice (keyed idempotent producers); false: at-least-once.
    idempotent: bool = True

    @property
    def brokers_csv(self) -> str:
        return ",".join(self.brokers)

    def client_kwargs(self) -> dict[str, Any]:
        return _client_kwargs(self.brokers, self.namesrv, self.security)


def _canonical(options: Mapping[str, str], allowed: tuple[str, ...], what: str) -> dict[str, str]:
    """Options keyed by canonical name; unknown keys are an error."""
    by_lower = {name.lower(): name for name in allowed}
    out: dict[str, str] = {}
    for key, value in options.items():
        lower = key.lower()
        if lower in SPARK_OWNED:
            continue
        if lower not in by_lower:
            raise OptionError(f"unknown tidemark {what} option {key!r}; known options (case-insensitive): "
                              f"{', '.join(allowed)}")
        if value is None:
            raise OptionError(f"tidemark option {by_lower[lower]!r} has no value")
        out[by_lower[lower]] = str(value)
    return out


def parse_bool(name: str, value: str) -> bool:
    text = value.strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise OptionError(f"tidemark option {name!r} must be true or false, got {value!r}")


def parse_int(name: str, value: str, *, minimum: int) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise OptionError(f"tidemark option {name!r} must be an integer, got {value!r}") from None
    if number < minimum:
        raise OptionError(f"tidemark option {name!r} must be >= {minimum}, got {number}")
    return number


def parse_brokers_option(value: str | None) -> tuple[str, ...]:
    try:
        return parse_brokers(value) if value is not None else default_brokers()
    except InvalidArgumentError as e:
        raise OptionError(f"tidemark option 'brokers': {e}") from None


def parse_namesrv_option(value: str | None, *, brokers_given: bool) -> tuple[str, ...]:
    """Name servers of option 'namesrv'; without it $TIDEMARK_NAMESRV (read here, on the driver), unless
    option 'brokers' was given: an explicit broker list is not overridden by the environment."""
    if value is None:
        try:
            return () if brokers_given else default_namesrv()
        except InvalidArgumentError as e:
            raise OptionError(f"tidemark option 'namesrv' (default from $TIDEMARK_NAMESRV): {e}") from None
    try:
        return parse_addresses(value, "name server")
    except InvalidArgumentError as e:
        raise OptionError(f"tidemark option 'namesrv': {e}") from None


def parse_servers(opts: Mapping[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(brokers, namesrv) of the options; with name servers the brokers are found through them."""
    namesrv = parse_namesrv_option(opts.get("namesrv"), brokers_given="brokers" in opts)
    return parse_brokers_option(opts.get("brokers")), namesrv


def parse_topics(value: str | None, *, single: bool = False) -> tuple[str, ...]:
    if value is None or not value.strip():
        what = "a topic name" if single else "a topic name or a comma list; or set 'subscribePattern' or 'assign'"
        raise OptionError(f"tidemark option 'topic' is required ({what})")
    topics = tuple(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))
    if single and len(topics) != 1:
        raise OptionError(f"tidemark option 'topic' must name exactly one topic for writes, got {value!r}")
    for t in topics:
        try:
            check_topic_name(t)
        except InvalidNameError as e:
            raise OptionError(f"tidemark option 'topic': {e}") from None
    return topics


def parse_duration_s(name: str, value: str) -> float:
    """Spark's time strings: an integer with unit ms, s, m/min, h or d; no unit: milliseconds."""
    match = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|min|h|d)?\s*", value.lower())
    if match is None:
        raise OptionError(f"tidemark option {name!r} must be a duration like 500ms, 30s, 15m or 1h, got {value!r}")
    return int(match[1]) * _UNIT_S[match[2] or "ms"]


_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def _json(name: str, value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise OptionError(f"tidemark option {name!r} is not valid JSON ({e.msg} at char {e.pos}): {value!r}") from None


def _only_one(opts: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    given = [n for n in names if n in opts]
    if len(given) > 1:
        raise OptionError(f"set only one of tidemark options {', '.join(map(repr, names))}; got "
                          f"{' and '.join(map(repr, given))}")
    return given[0] if given else None


def parse_subscription(opts: Mapping[str, str]) -> Subscription:
    """Option 'topic', 'subscribePattern' or 'assign': exactly one (no option: 'topic' is required)."""
    name = _only_one(opts, SUBSCRIBE_OPTIONS)
    try:
        if name == "subscribePattern":
            return Subscription(pattern=compile_pattern(opts[name]))
        if name == "assign":
            return Subscription(assign=parse_assign(_json(name, opts[name])))
    except QueueSpecError as e:
        raise OptionError(f"tidemark option {name!r}: {e}") from None
    return Subscription(topics=parse_topics(opts.get("topic")))


def _check_subscribed(name: str, refs: Mapping[QueueRef, int], subscription: Subscription) -> None:
    for ref in refs:
        if not subscription.covers_topic(ref.topic):
            raise OptionError(f"tidemark option {name!r} names topic {ref.topic!r}, which the read does not "
                              f"subscribe to ({subscription.describe()})")
        if subscription.assign and not any(a.topic == ref.topic and a.queue_id == ref.queue_id and
                                           (a.broker is None or ref.broker in (None, a.broker))
                                           for a in subscription.assign):
            raise OptionError(f"tidemark option {name!r} names queue {ref}, which option 'assign' does not "
                              f"assign ({subscription.describe()})")


def _offset_value(allow_earliest: bool) -> Any:
    lowest = EARLIEST if allow_earliest else LATEST
    hint = "(or -2 earliest / -1 latest)" if allow_earliest else "(or -1 latest; -2 earliest is not an end)"

    def check(value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
            raise QueueSpecError(f"offset of {where} must be an integer >= 0 {hint}, got {value!r}")
        return value
    return check


def _timestamp_value(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise QueueSpecError(f"timestamp of {where} must be an integer >= 0 (ms since the epoch), got {value!r}")
    return value


def parse_offset_spec(name: str, value: str, subscription: Subscription, *,
                      allowed: tuple[OffsetKind, ...]) -> OffsetSpec:
    """'earliest' | 'latest' | 'committed' (as allowed) or JSON {"topic": {"broker": {"queueId": offset}}}
    or {"topic": {"queueId": offset}} (that queue id on every broker)."""
    text = value.strip()
    for kind in allowed:
        if text.lower() == kind.value:
            return kind
    if not text.startswith("{"):
        names = " | ".join(k.value for k in allowed)
        raise OptionError(f"tidemark option {name!r} must be {names} or JSON "
                          f'{{"topic": {{"broker": {{"queueId": offset}}}}}}, got {value!r}')
    try:
        offsets = parse_queue_values(_json(name, text), _offset_value(name == "startingOffsets"))
    except QueueSpecError as e:
        raise OptionError(f"tidemark option {name!r}: {e}") from None
    _check_subscribed(name, offsets, subscription)
    return offsets


def parse_position(opts: Mapping[str, str], names: tuple[str, str, str], default: str,
                   subscription: Subscription, *, allowed: tuple[OffsetKind, ...]) -> OffsetSpec:
    """One of (xOffsets, xTimestamp, xOffsetsByTimestamp), or `default` for xOffsets."""
    offsets_name, timestamp_name, by_timestamp_name = names
    name = _only_one(opts, names)
    if name == timestamp_name:
        return ByTimestamp(every_queue=parse_int(name, opts[name], minimum=0))
    if name == by_timestamp_name:
        try:
            per_queue = parse_queue_values(_json(name, opts[name]), _timestamp_value)
        except QueueSpecError as e:
            raise OptionError(f"tidemark option {name!r}: {e}") from None
        _check_subscribed(name, per_queue, subscription)
        return ByTimestamp(per_queue=per_queue)
    return parse_offset_spec(offsets_name, opts.get(offsets_name, default), subscription, allowed=allowed)


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Validate the options of spark.read / spark.readStream; OptionError names the bad one."""
    return _parse_read_options(options, streaming=streaming)


def check_read_options(options: Mapping[str, str]) -> None:
    """Every check that does not depend on batch vs streaming, for load(): Spark asks for the schema
    there, before it knows which reader it will want, so errors show at load() rather than in a task."""
    _parse_read_options(options, streaming=None)


def _parse_read_options(options: Mapping[str, str], *, streaming: bool | None) -> ReadOptions:
    opts = _canonical(options, READ_OPTIONS, "read")
    if streaming is not None:
        kind = "streaming" if streaming else "batch"
        for name in (BATCH_ONLY if streaming else STREAM_ONLY):
            if name in opts:
                other = "batch" if streaming else "streaming"
                raise OptionError(f"tidemark option {name!r} applies to {other} queries only, not to {kind} reads")
    brokers, namesrv = parse_servers(opts)
    subscription = parse_subscription(opts)
    group = opts.get("group")
    if group is not None:
        try:
            check_group_name(group.strip())
        except InvalidNameError as e:
            raise OptionError(f"tidemark option 'group': {e}") from None
        group = group.strip()

    starting = parse_position(opts, STARTING_OPTIONS, "latest" if streaming else "earliest", subscription,
                              allowed=(OffsetKind.EARLIEST, OffsetKind.LATEST, OffsetKind.COMMITTED))
    if starting is OffsetKind.COMMITTED and group is None:
        raise OptionError("tidemark option startingOffsets=committed needs option 'group'")
    ending = parse_position(opts, ENDING_OPTIONS, "latest", subscription, allowed=(OffsetKind.LATEST,))
    start_ms = starting.every_queue if isinstance(starting, ByTimestamp) else None
    end_ms = ending.every_queue if isinstance(ending, ByTimestamp) else None
    if start_ms is not None and end_ms is not None and end_ms < start_ms:
        raise OptionError(f"tidemark option 'endingTimestamp' ({end_ms}) is before 'startingTimestamp' ({start_ms})")

    max_offsets = opts.get("maxOffsetsPerTrigger")
    max_rows = None if max_offsets is None else parse_int("maxOffsetsPerTrigger", max_offsets, minimum=1)
    min_offsets = opts.get("minOffsetsPerTrigger")
    min_rows = None if min_offsets is None else parse_int("minOffsetsPerTrigger", min_offsets, minimum=1)
    if min_rows is not None and max_rows is not None and min_rows > max_rows:
        raise OptionError(f"tidemark option 'minOffsetsPerTrigger' ({min_rows}) is above 'maxOffsetsPerTrigger' "
                          f"({max_rows}): no micro-batch could ever satisfy both")
    if "maxTriggerDelay" in opts and min_rows is None:
        raise OptionError("tidemark option 'maxTriggerDelay' only applies with option 'minOffsetsPerTrigger'")
    max_delay_s = (parse_duration_s("maxTriggerDelay", opts["maxTriggerDelay"]) if "maxTriggerDelay" in opts
                   else DEFAULT_MAX_TRIGGER_DELAY_S)
    min_partitions = opts.get("minPartitions")
    expression = opts.get("tagExpression", "*")
    try:
        expression = parse_tag_expression(expression).expression
    except ValueError as e:
        raise OptionError(f"tidemark option 'tagExpression': {e}") from None
    return ReadOptions(
        streaming=bool(streaming), brokers=brokers, namesrv=namesrv, subscription=subscription, group=group,
        starting=starting, ending=ending, max_offsets_per_trigger=max_rows, min_offsets_per_trigger=min_rows,
        max_trigger_delay_s=max_delay_s,
        min_partitions=None if min_partitions is None else parse_int("minPartitions", min_partitions, minimum=1),
        fail_on_data_loss=parse_bool("failOnDataLoss", opts.get("failOnDataLoss", "true")),
        tag_expression=expression,
        commit_offsets=parse_bool("commitOffsets", opts.get("commitOffsets", "true")),
        poll_timeout_s=parse_int("pollTimeoutMs", opts.get("pollTimeoutMs", str(DEFAULT_POLL_TIMEOUT_MS)),
                                 minimum=1) / 1000,
        security=parse_security(opts),
    )


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """Validate the options of df.write / df.writeStream."""
    opts = _canonical(options, WRITE_OPTIONS, "write")
    brokers, namesrv = parse_servers(opts)
    return WriteOptions(brokers=brokers, namesrv=namesrv,
                        topic=parse_topics(opts.get("topic"), single=True)[0], security=parse_security(opts),
                        idempotent=parse_bool("idempotent", opts.get("idempotent", "true")))


def parse_security(opts: Mapping[str, str]) -> Security:
    """accessKey + secretKey (both or neither); tls=true, or any tls*File option, turns TLS on."""
    access, secret = opts.get("accessKey", "").strip(), opts.get("secretKey", "")
    if bool(access) != bool(secret):
        missing = "secretKey" if access else "accessKey"
        raise OptionError(f"tidemark options 'accessKey' and 'secretKey' go together: {missing!r} is missing")
    files = {name: opts.get(option, "").strip() for name, option in
             (("ca_file", "tlsCaFile"), ("cert_file", "tlsCertFile"), ("key_file", "tlsKeyFile"))}
    tls_flag = parse_bool("tls", opts["tls"]) if "tls" in opts else None
    if tls_flag is False and any(files.values()):
        raise OptionError("tidemark option tls=false contradicts tlsCaFile/tlsCertFile/tlsKeyFile")
    tls = None
    if tls_flag or any(files.values()):
        try:
            tls = TlsSettings(**files)
        except InvalidArgumentError:
            raise OptionError("tidemark options 'tlsCertFile' and 'tlsKeyFile' go together") from None
    return Security(credentials=Credentials(access, secret) if access else None, tls=tls)


__all__ = ["EARLIEST", "LATEST", "ByTimestamp", "OffsetKind", "OffsetSpec", "OptionError", "ReadOptions", "Security",
           "WriteOptions", "check_read_options", "parse_read_options", "parse_write_options"]
