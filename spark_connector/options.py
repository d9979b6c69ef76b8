"""Options of the tidemark data source, parsed once at planning into frozen dataclasses.

Spark hands options over as strings with case-insensitive keys. Every option is
checked here, before any task runs, and a bad one raises OptionError naming it,
so `spark.read.format("tidemark").option("startingOffsets", "{oops").load()`
fails at planning with a message a user can act on.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from client.errors import InvalidArgumentError
from client.message import MessageQueue
from client.security import TlsSettings
from client.settings import default_brokers, default_namesrv, parse_addresses, parse_brokers
from spark_connector.offsets import EARLIEST, LATEST, OffsetFormatError, offsets_from_json
from tidemark.auth import Credentials
from tidemark.protocol import (
    InvalidNameError,
    check_group_name,
    check_topic_name,
    parse_tag_expression,
)

# Canonical spelling of each option; keys arrive lower-cased.
# Credentials and TLS, for reads and writes alike; secretKey never leaves ReadOptions/WriteOptions
# in text (Credentials keeps it out of repr; Spark redacts option keys matching "secret" in plans).
SECURITY_OPTIONS = ("accessKey", "secretKey", "tls", "tlsCaFile", "tlsCertFile", "tlsKeyFile")
READ_OPTIONS = ("brokers", "namesrv", "topic", "group", "startingOffsets", "endingOffsets", "startingTimestamp",
                "maxOffsetsPerTrigger", "minPartitions", "failOnDataLoss", "tagExpression", "commitOffsets",
                "pollTimeoutMs", *SECURITY_OPTIONS)
STREAM_ONLY = ("maxOffsetsPerTrigger", "commitOffsets")
BATCH_ONLY = ("endingOffsets",)
WRITE_OPTIONS = ("brokers", "namesrv", "topic", "idempotent", *SECURITY_OPTIONS)
# Keys Spark itself may put into a data source's options (DataFrameWriter.save(path), writeStream).
SPARK_OWNED = frozenset({"path", "checkpointlocation", "queryname"})

DEFAULT_POLL_TIMEOUT_MS = 60_000


class OptionError(InvalidArgumentError):
    """An option of the tidemark data source is unknown, missing or malformed."""


class OffsetKind(enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    COMMITTED = "committed"


# Where to start or end: a named position for every queue, or explicit offsets per queue
# (EARLIEST / LATEST sentinels allowed as values, like Kafka's -2 / -1).
OffsetSpec = OffsetKind | Mapping[MessageQueue, int]


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
    topics: tuple[str, ...]
    group: str | None
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp: int | None
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    fail_on_data_loss: bool
    tag_expression: str
    commit_offsets: bool
    poll_timeout_s: float
    security: Security

    @property
    def brokers_csv(self) -> str:
        return ",".join(self.brokers)

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
        raise OptionError("tidemark option 'topic' is required (a topic name, or a comma list for reads)")
    topics = tuple(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))
    if single and len(topics) != 1:
        raise OptionError(f"tidemark option 'topic' must name exactly one topic for writes, got {value!r}")
    for t in topics:
        try:
            check_topic_name(t)
        except InvalidNameError as e:
            raise OptionError(f"tidemark option 'topic': {e}") from None
    return topics


def parse_offset_spec(name: str, value: str, topics: tuple[str, ...], *, allowed: tuple[OffsetKind, ...]) -> OffsetSpec:
    """'earliest' | 'latest' | 'committed' (as allowed) or JSON {"topic": {"broker": {"queueId": offset}}}."""
    text = value.strip()
    for kind in allowed:
        if text.lower() == kind.value:
            return kind
    if not text.startswith("{"):
        names = " | ".join(k.value for k in allowed)
        raise OptionError(f"tidemark option {name!r} must be {names} or JSON "
                          f'{{"topic": {{"broker": {{"queueId": offset}}}}}}, got {value!r}')
    try:
        doc: Any = json.loads(text)
    except json.JSONDecodeError as e:
        raise OptionError(f"tidemark option {name!r} is not valid JSON ({e.msg} at char {e.pos}): {value!r}") from None
    try:
        offsets = offsets_from_json(doc, allow_sentinels=True)
    except OffsetFormatError as e:
        raise OptionError(f"tidemark option {name!r}: {e}") from None
    for mq, offset in offsets.items():
        if mq.topic not in topics:
            raise OptionError(f"tidemark option {name!r} names topic {mq.topic!r}, which is not in option "
                              f"'topic' ({', '.join(topics)})")
        if name == "endingOffsets" and offset == EARLIEST:
            raise OptionError(f"tidemark option 'endingOffsets' cannot use -2 (earliest) for {mq}")
    return offsets


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Validate the options of spark.read / spark.readStream; OptionError names the bad one."""
    opts = _canonical(options, READ_OPTIONS, "read")
    kind = "streaming" if streaming else "batch"
    for name in (BATCH_ONLY if streaming else STREAM_ONLY):
        if name in opts:
            other = "batch" if streaming else "streaming"
            raise OptionError(f"tidemark option {name!r} applies to {other} queries only, not to {kind} reads")
    brokers, namesrv = parse_servers(opts)
    topics = parse_topics(opts.get("topic"))
    group = opts.get("group")
    if group is not None:
        try:
            check_group_name(group.strip())
        except InvalidNameError as e:
            raise OptionError(f"tidemark option 'group': {e}") from None
        group = group.strip()

    starting_timestamp = None
    if "startingTimestamp" in opts:
        if "startingOffsets" in opts:
            raise OptionError("set either tidemark option 'startingOffsets' or 'startingTimestamp', not both")
        starting_timestamp = parse_int("startingTimestamp", opts["startingTimestamp"], minimum=0)
    default_start = "latest" if streaming else "earliest"
    starting = parse_offset_spec("startingOffsets", opts.get("startingOffsets", default_start), topics,
                                 allowed=(OffsetKind.EARLIEST, OffsetKind.LATEST, OffsetKind.COMMITTED))
    if starting is OffsetKind.COMMITTED and group is None:
        raise OptionError("tidemark option startingOffsets=committed needs option 'group'")
    ending = parse_offset_spec("endingOffsets", opts.get("endingOffsets", "latest"), topics,
                               allowed=(OffsetKind.LATEST,))

    max_offsets = opts.get("maxOffsetsPerTrigger")
    min_partitions = opts.get("minPartitions")
    expression = opts.get("tagExpression", "*")
    try:
        expression = parse_tag_expression(expression).expression
    except ValueError as e:
        raise OptionError(f"tidemark option 'tagExpression': {e}") from None
    return ReadOptions(
        streaming=streaming, brokers=brokers, namesrv=namesrv, topics=topics, group=group, starting=starting, ending=ending,
        starting_timestamp=starting_timestamp,
        max_offsets_per_trigger=None if max_offsets is None else parse_int("maxOffsetsPerTrigger", max_offsets,
                                                                           minimum=1),
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


__all__ = ["EARLIEST", "LATEST", "OffsetKind", "OffsetSpec", "OptionError", "ReadOptions", "Security", "WriteOptions",
           "parse_read_options", "parse_write_options"]
