"""Broker settings: one frozen dataclass, filled from defaults < TOML file < TIDEMARK_* env < flags.

Every field carries its help text, so the CLI flags, the environment variables,
the config file keys and the configuration reference all come from one place.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import functools
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidemark.broker.store.model import MIN_SEGMENT_SIZE
from tidemark.common.env_secrets import secret_from_env
from tidemark.common.protocol import (
    DEFAULT_DELAY_LEVELS,
    DEFAULT_PORT,
    PROMOTE_DEADLINE_S,
    PROMOTE_ETCD_MARGIN_S,
    parse_delay_levels,
    split_host_port,
)

ENV_PREFIX = "TIDEMARK_"
# NAME:SECRET of a user given on the command line (init_user, a name server's broker_user).
USER_SPEC = re.compile(r"[A-Za-z0-9_.-]{1,64}:[\x21-\x7e]{8,256}")
# What a request adds around its messages: protobuf framing, topic, properties of a batch.
REQUEST_OVERHEAD_BYTES = 64 * 1024


class ReplicationMode(enum.Enum):
    """When a master answers a send relative to its replicas (RocketMQ's ASYNC_MASTER / SYNC_MASTER)."""

    ASYNC = "async"
    SYNC = "sync"


class FlushDiskType(enum.Enum):
    """RocketMQ's flushDiskType: when a send is acknowledged relative to fsync."""

    ASYNC = "async"
    SYNC = "sync"


def _setting(default: Any, help: str, **kw: Any) -> Any:
    """A setting; `secret=True` keeps its value out of repr and --print-config."""
    return field(default=default, metadata={"help": help, **kw}, repr=not kw.get("secret", False))


@dataclass(frozen=True, kw_only=True)
class BrokerConfig:
    data_dir: Path = _setting(Path("./data"), "Store root: commitlog/, consumequeue/, config/")
    host: str = _setting("127.0.0.1", "Address to listen on (0.0.0.0 in containers)")
    port: int = _setting(DEFAULT_PORT, "gRPC port (RocketMQ's 10911); 0 picks a free port")
    broker_name: str = _setting("broker-a", "Broker name in routes and message queues")
    advertise_addr: str = _setting("", "host:port clients should use (default host:port)")
    cluster_name: str = _setting("DefaultCluster", "Cluster the broker belongs to (shown by `tidemark cluster list`)")
    namesrv: str = _setting("", "Name servers host:port[,host:port...] to register with (empty: none; clients "
                            "then need the broker's address)")
    peer_tls_ca: str = _setting("", "PEM CA bundle of the name servers' and the master's certificates: the broker "
                                "dials them over TLS (empty: plaintext)")
    broker_id: int = _setting(0, "0: the master of broker_name; above 0: a replica of it (needs master)")
    master: str = _setting("", "host:port of the master a replica copies (broker_id above 0)")
    controller: str = _setting("", "etcd://HOST:PORT[,HOST:PORT...]: etcd elects the master of broker_name among "
                               "its brokers, which start without broker_id and master (empty: roles by hand)")
    controller_user: str = _setting("", "Controller mode against an etcd with auth enabled: NAME:PASSWORD of the "
                                    "etcd user the broker signs in as (a role with read-write on /tidemark/)",
                                    secret=True)
    controller_lease_s: int = _setting(3, "Controller mode: the master's lease in etcd; a master that cannot renew "
                                       "it stops taking writes, and an in-sync replica takes over once it expires")
    switchover_timeout_ms: int = _setting(10_000, "Controller mode: how long a master handing its mastership to the "
                                          "replica `tidemark broker promote` names waits, writes paused, for it "
                                          "to hold everything; then it takes writes again and refuses (100..20000, and "
                                          "with controller_lease_s at most 28 s)")
    replication: ReplicationMode = _setting(ReplicationMode.ASYNC, "async: answer sends at once; sync: answer only "
                                            "once min_sync_replicas replicas have them, refuse them while fewer "
                                            "are in sync (master)")
    min_sync_replicas: int = _setting(1, "Sync replication: how many replicas must hold a send before it is "
                                      "acknowledged; while fewer are in sync, sends are refused before anything "
                                      "is stored (Kafka's min.insync.replicas, counting replicas only)")
    replication_timeout_ms: int = _setting(3000, "Sync replication: how long a stored send waits for a replica "
                                           "before its answer is an unknown outcome (DEADLINE_EXCEEDED); any "
                                           "replication: how long a queue lock grant or a topic or group change waits "
                                           "for the replicas in sync (at most 2 s)")
    register_interval_ms: int = _setting(5000, "How often the broker registers with the name servers (and at once "
                                         "after a topic or permission change)")
    flush: FlushDiskType = _setting(FlushDiskType.ASYNC, "async: fsync every flush interval; sync: ack after fsync")
    flush_interval_ms: int = _setting(500, "Async flush interval of the commitlog")
    commitlog_segment_size: int = _setting(64 * 1024 * 1024, "Bytes per commitlog segment file")
    consume_queue_entries_per_file: int = _setting(300_000, "20-byte entries per consume queue file")
    max_open_consume_queue_files: int = _setting(512, "Consume queue files kept open at once (least recently "
                                                 "used closed first); keep well under ulimit -n")
    max_message_size: int = _setting(4 * 1024 * 1024, "Largest accepted message (body + properties)")
    max_request_bytes: int = _setting(0, "Largest request accepted, e.g. a batch of sends "
                                      "(0: max_message_size + 64 KiB, so a batch holds at most max_message_size)")
    max_inflight_request_bytes: int = _setting(64 * 1024 * 1024, "Request bytes held at once across all calls; "
                                               "more is refused (unary) or waits (streams)")
    file_reserved_hours: float = _setting(72.0, "Commitlog retention before segments may be deleted")
    auto_create_topic: bool = _setting(False, "Create unknown topics on first send")
    default_topic_queue_nums: int = _setting(4, "Queues of an auto-created topic")
    flush_consumer_offset_interval_ms: int = _setting(5000, "How often consumerOffset.json is written when changed")
    force_empty_offsets: bool = _setting(False, "Start with an empty offset table if consumerOffset.json and its .bak are both unreadable")
    channel_expired_timeout_ms: int = _setting(120_000, "A consumer silent this long is removed from its group")
    watch_grace_ms: int = _setting(5000, "A broken watch stream counts as a leave after this grace")
    stop_grace_ms: int = _setting(3000, "A graceful stop (SIGTERM) waits this long at most for the answers it "
                                  "owes (sends waiting for the disk or a replica, unary calls) before it cuts "
                                  "the calls still open")
    lock_expiry_ms: int = _setting(60_000, "Queue ownership lock lifetime without renewal")
    max_long_polling_ms: int = _setting(30_000, "Upper bound on a pull's suspend timeout")
    keepalive_min_interval_ms: int = _setting(1_000, "Shortest keepalive ping interval a client's idle connection "
                                              "may use (Tidemark's clients ping every 3 s to find a silent "
                                              "connection; faster pingers are sent away with GOAWAY "
                                              "too_many_pings, gRPC's default is 5 min)")
    delay_levels: str = _setting(DEFAULT_DELAY_LEVELS, "Delay levels for scheduled and retried messages")
    retry_queue_nums: int = _setting(1, "Queues of an auto-created %RETRY% topic")
    max_reconsume_times: int = _setting(16, "Default retries before a message goes to %DLQ%")
    producer_id_expiry_ms: int = _setting(86_400_000, "An idempotent producer idle this long is forgotten (its "
                                          "retries then get a new producer id); Kafka's producer.id.expiration.ms")
    max_idempotent_producers: int = _setting(100_000, "Idempotent producers remembered at most (the least recently "
                                             "active are forgotten first)")
    transaction_timeout_ms: int = _setting(6000, "A half message unresolved this long is checked with its producer "
                                           "group (RocketMQ's transactionTimeOut)")
    transaction_check_interval_ms: int = _setting(30_000, "How often an unresolved half message is checked again")
    transaction_check_max: int = _setting(15, "Checks of a half message before it is rolled back and logged "
                                          "(RocketMQ's transactionCheckMax)")
    auth: bool = _setting(False, "Authenticate every request (RocketMQ 5 signatures) and authorize it by ACL")
    init_user: str = _setting("", "NAME:SECRET of the first super user, created when there are no users yet "
                              "(without peer_user, also the user of the broker's own calls)", secret=True)
    peer_user: str = _setting("", "NAME:SECRET the broker signs its own calls with: a replica's to its master, "
                              "registrations with the name servers (empty: init_user). Replication needs Update "
                              "on Cluster only, so this need not be a super user", secret=True)
    auth_max_skew_s: float = _setting(300.0, "How far a request's signed time may be from the broker's clock")
    tls_cert: str = _setting("", "PEM certificate chain served on the gRPC port (with tls_key; empty: plaintext)")
    tls_key: str = _setting("", "PEM private key of tls_cert")
    tls_client_ca: str = _setting("", "PEM CA bundle client certificates must chain to (mutual TLS; needs tls_cert)")
    metrics_port: int = _setting(0, "Prometheus metrics HTTP port (0 = off)")
    metrics_host: str = _setting("127.0.0.1", "Address of the metrics/health HTTP endpoint (loopback by default; "
                                 "0.0.0.0 where a scraper outside the host or container reads it)")
    log_level: str = _setting("INFO", "DEBUG, INFO, WARNING or ERROR")
    log_format: str = _setting("kv", "kv (key=value) or json")

    def __post_init__(self) -> None:
        problems = list(_problems(self))
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def address(self) -> str:
        return self.advertise_addr or f"{self.host}:{self.port}"

    @functools.cached_property
    def delay_levels_ms(self) -> tuple[int, ...]:
        return parse_delay_levels(self.delay_levels)

    @property
    def request_limit_bytes(self) -> int:
        """gRPC's receive limit: max_request_bytes, or one max_message_size of messages plus framing
        (RocketMQ's rule: a batch is at most maxMessageSize)."""
        return self.max_request_bytes or self.max_message_size + REQUEST_OVERHEAD_BYTES

    @property
    def config_dir(self) -> Path:
        return Path(self.data_dir) / "config"


def namesrv_addresses(c: BrokerConfig) -> tuple[str, ...]:
    return tuple(a.strip() for a in c.namesrv.split(",") if a.strip())


def role_conflict(c: BrokerConfig) -> str:
    """A role given by hand to a broker whose role etcd decides (checked on the user's config only: the
    controller's own decision fills broker_id and master)."""
    if c.controller and (c.broker_id or c.master):
        return "controller mode: etcd decides master and replicas; give neither broker_id nor master"
    return ""


def _controller_problems(c: BrokerConfig):
    from tidemark.broker.cluster.election import MIN_TTL_S, parse_controller
    from tidemark.broker.errors import InvalidArgumentError
    try:
        parse_controller(c.controller)
    except InvalidArgumentError as e:
        yield str(e)
    if c.controller_user and not re.fullmatch(r"[^:\s]{1,128}:\S{1,256}", c.controller_user):
        yield "controller_user must be NAME:PASSWORD"
    if not MIN_TTL_S <= c.controller_lease_s <= 60:
        yield f"controller_lease_s must be {MIN_TTL_S}..60, got {c.controller_lease_s}"
    if not 100 <= c.switchover_timeout_ms <= 20_000:
        yield f"switchover_timeout_ms must be 100..20000, got {c.switchover_timeout_ms}"
    # A promote waits for the master's answer up to the switchover timeout plus a lease (switchover.py's
    # _answer), and its client gives up after PROMOTE_DEADLINE_S: it would report a timeout while the
    # switchover may still go through.
    elif c.switchover_timeout_ms / 1000 + c.controller_lease_s > PROMOTE_DEADLINE_S - PROMOTE_ETCD_MARGIN_S:
        yield (f"switchover_timeout_ms ({c.switchover_timeout_ms / 1000:g} s) plus controller_lease_s "
               f"({c.controller_lease_s} s) must be at most {PROMOTE_DEADLINE_S - PROMOTE_ETCD_MARGIN_S:g} s: "
               f"`tidemark broker promote` waits {PROMOTE_DEADLINE_S:g} s for the switchover's outcome")


def _problems(c: BrokerConfig):
    if not 0 <= c.port <= 65535:
        yield f"port must be 0..65535, got {c.port}"
    if not c.broker_name or any(ch.isspace() for ch in c.broker_name):
        yield f"broker_name must be non-empty without spaces, got {c.broker_name!r}"
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,127}", c.cluster_name):
        yield f"cluster_name must be 1-127 of A-Z a-z 0-9 _ . -, got {c.cluster_name!r}"
    for address in namesrv_addresses(c):
        if split_host_port(address) is None:
            yield f"namesrv address {address!r} is not host:port"
    if c.peer_tls_ca and not (os.path.isfile(c.peer_tls_ca) and os.access(c.peer_tls_ca, os.R_OK)):
        yield f"peer_tls_ca {c.peer_tls_ca} is not a readable file"
    if not 0 <= c.broker_id < 2**31:
        yield f"broker_id must be 0..{2**31 - 1}, got {c.broker_id}"
    elif c.broker_id and not c.master:
        yield f"broker_id {c.broker_id} makes this broker a replica: give its master (host:port)"
    elif not c.broker_id and c.master:
        yield "master is for replicas: give broker_id above 0 (0 is the master itself)"
    if c.master and split_host_port(c.master) is None:
        yield f"master address {c.master!r} is not host:port"
    if c.controller:
        yield from _controller_problems(c)
    if not 1 <= c.min_sync_replicas <= 16:
        yield f"min_sync_replicas must be 1..16, got {c.min_sync_replicas}"
    elif c.min_sync_replicas != 1 and c.replication is not ReplicationMode.SYNC:
        yield "min_sync_replicas counts the replicas a send waits for: it needs replication sync"
    if not MIN_SEGMENT_SIZE <= c.commitlog_segment_size <= 2**31 - 1:
        yield f"commitlog_segment_size must be {MIN_SEGMENT_SIZE}..{2**31 - 1} bytes, got {c.commitlog_segment_size}"
    for name in ("replication_timeout_ms", "register_interval_ms", "flush_interval_ms", "flush_consumer_offset_interval_ms", "channel_expired_timeout_ms",
                 "lock_expiry_ms", "consume_queue_entries_per_file",
                 "max_open_consume_queue_files",
                 "max_message_size", "default_topic_queue_nums", "retry_queue_nums", "producer_id_expiry_ms",
                 "max_idempotent_producers", "transaction_timeout_ms", "transaction_check_interval_ms",
                 "transaction_check_max", "keepalive_min_interval_ms", "stop_grace_ms"):
        if getattr(c, name) <= 0:
            yield f"{name} must be > 0, got {getattr(c, name)}"
    if c.max_request_bytes < 0:
        yield f"max_request_bytes must be >= 0, got {c.max_request_bytes}"
    elif c.max_request_bytes and c.max_request_bytes < c.max_message_size + REQUEST_OVERHEAD_BYTES:
        yield (f"max_request_bytes ({c.max_request_bytes}) must leave room for one message of max_message_size "
               f"({c.max_message_size}) plus {REQUEST_OVERHEAD_BYTES} bytes of framing")
    if c.max_inflight_request_bytes <= 0:
        yield f"max_inflight_request_bytes must be > 0, got {c.max_inflight_request_bytes}"
    for name in ("init_user", "peer_user"):
        if getattr(c, name) and not USER_SPEC.fullmatch(getattr(c, name)):
            yield f"{name} must be NAME:SECRET (the secret at least 8 characters)"
    if c.auth_max_skew_s <= 0:
        yield f"auth_max_skew_s must be > 0, got {c.auth_max_skew_s}"
    yield from _tls_problems(c)
    if c.max_reconsume_times < 0:
        yield f"max_reconsume_times must be >= 0, got {c.max_reconsume_times}"
    if c.file_reserved_hours < 0:
        yield f"file_reserved_hours must be >= 0, got {c.file_reserved_hours}"
    if c.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        yield f"log_level must be DEBUG, INFO, WARNING or ERROR, got {c.log_level!r}"
    if c.log_format not in ("kv", "json"):
        yield f"log_format must be kv or json, got {c.log_format!r}"
    try:
        parse_delay_levels(c.delay_levels)
    except ValueError as e:
        yield str(e)



def _tls_problems(c: BrokerConfig):
    """A certificate without its key (or the reverse) or an unreadable file would only fail at the
    first handshake, long after start; refuse the config instead."""
    if bool(c.tls_cert) != bool(c.tls_key):
        yield "tls_cert and tls_key must be given together"
    if c.tls_client_ca and not c.tls_cert:
        yield "tls_client_ca (mutual TLS) needs tls_cert and tls_key"
    for name in ("tls_cert", "tls_key", "tls_client_ca"):
        path = getattr(c, name)
        if path and not (os.path.isfile(path) and os.access(path, os.R_OK)):
            yield f"{name} {path} is not a readable file"

def fields() -> tuple[dataclasses.Field, ...]:
    return dataclasses.fields(BrokerConfig)


def _convert(f: dataclasses.Field, raw: Any, origin: str) -> Any:
    """Turn a string (env, flag) or TOML value into the field's type, or raise ValueError naming the origin."""
    default = f.default
    try:
        if isinstance(default, bool):
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"expected true/false, got {raw!r}")
        if isinstance(default, enum.Enum):
            return type(default)(str(raw).lower())
        if isinstance(default, Path):
            return Path(str(raw))
        if isinstance(default, int):
            if isinstance(raw, bool):
                raise ValueError(f"expected an integer, got {raw!r}")
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        return str(raw)
    except ValueError as e:
        raise ValueError(f"{origin}: invalid value for {f.name}: {e}") from None


def load_config(*, file: Path | None = None, env: Mapping[str, str] | None = None,
                overrides: Mapping[str, Any] | None = None) -> BrokerConfig:
    """Build the effective config. Raises ValueError with a one-line message on bad input."""
    env = os.environ if env is None else env
    by_name = {f.name: f for f in fields()}
    values: dict[str, Any] = {}
    if file is not None:
        try:
            with open(file, "rb") as fh:
                doc = tomllib.load(fh)
        except FileNotFoundError:
            raise ValueError(f"config file {file} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"config file {file} is not valid TOML: {e}") from None
        table = doc.get("broker", doc)
        for key, raw in table.items():
            name = key.replace("-", "_")
            if name not in by_name:
                raise ValueError(f"config file {file}: unknown setting {key!r}")
            values[name] = _convert(by_name[name], raw, f"config file {file}")
    for name, f in by_name.items():
        env_key = ENV_PREFIX + name.upper()
        raw = secret_from_env(env, env_key) if f.metadata.get("secret") else env.get(env_key, "")
        if raw != "":
            values[name] = _convert(f, raw, f"environment {env_key}")
    for name, raw in (overrides or {}).items():
        if raw is not None:
            values[name] = _convert(by_name[name], raw, f"--{name.replace('_', '-')}")
    return BrokerConfig(**values)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting; values stay None unless given, so lower layers show through."""
    for f in fields():
        flag = "--" + f.name.replace("_", "-")
        text = f.metadata["help"].replace("%", "%%")  # argparse formats help strings with %
        if isinstance(f.default, enum.Enum):
            parser.add_argument(flag, choices=[m.value for m in type(f.default)], default=None, help=text)
        elif isinstance(f.default, bool):
            parser.add_argument(flag, nargs="?", const="true", default=None, metavar="BOOL", help=text)
        else:
            parser.add_argument(flag, default=None, metavar=f.name.upper(), help=text)


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    return {f.name: getattr(args, f.name) for f in fields() if getattr(args, f.name, None) is not None}


def render(config: BrokerConfig) -> str:
    """The effective config as TOML (what `tidemark broker --print-config` prints)."""
    lines = ["[broker]"]
    for f in fields():
        value = getattr(config, f.name)
        if isinstance(value, enum.Enum):
            value = value.value
        if f.metadata.get("secret") and value:
            text = '"<hidden>"'  # --print-config never shows a secret
        elif isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int | float):
            text = str(value)
        else:
            text = '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
        lines.append(f"{f.name} = {text}")
    return "\n".join(lines) + "\n"


def reference_table(sequence: Sequence[dataclasses.Field] | None = None) -> str:
    """Markdown table of every setting: key, flag, environment variable, default, meaning."""
    rows = ["| setting | flag | environment | default | meaning |", "| --- | --- | --- | --- | --- |"]
    for f in sequence or fields():
        default = f.default.value if isinstance(f.default, enum.Enum) else f.default
        rows.append(f"| `{f.name}` | `--{f.name.replace('_', '-')}` | `{ENV_PREFIX}{f.name.upper()}` "
                    f"| `{default}` | {f.metadata['help']} |")
    return "\n".join(rows)
