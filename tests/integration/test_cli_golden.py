"""Golden tests of the `tidemark` command's output: every subcommand, as a table and as --json.

Volatile values (msg ids, timestamps, ports, pids, hosts) are normalised before comparing with
tests/golden/cli/<name>.txt. Regenerate after an intended change with:
    TIDEMARK_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/integration/test_cli_golden.py
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import forkserver
import pytest
from workload import create_topic, wait_until

from tidemark.client import (
    Admin,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    MessageQueue,
    Producer,
    PushConsumer,
)

GOLDEN = Path(__file__).parent.parent / "golden" / "cli"
UPDATE = os.environ.get("TIDEMARK_UPDATE_GOLDEN") == "1"

# (pattern, placeholder, pad): a match becomes the placeholder, padded to the match's width where
# tables need it to stay aligned; placeholder None marks the per-second rate after a duration.
_NORMALISE = [
    (re.compile(r"\b[0-9A-F]{32}\b"), "<MSG_ID>", True),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?"), "<TIME>", True),
    (re.compile(r"\b1\d{12}\b"), "<MS>", True),
    (re.compile(r"(?<=127\.0\.0\.1:)\d{2,5}"), "<PORT>", True),
    (re.compile(r'(?<="seconds": )[\d.]+'), "<S>", False),
    (re.compile(r'(?<="msgs_per_s": )\d+'), "<N>", False),
    # A right-aligned duration: its width varies (0.02 / 0.012), the column's does not.
    (re.compile(r"\s+\d+\.\d+(?=\s+\d+$)", re.M), "<S>", "right"),
    (re.compile(r"(?<=<S>)(\s+)\d+$", re.M), None, True),
    (re.compile(r"\b1\d{15}\b"), "<EPOCH>", True),
]


def _replace(placeholder: str | None, pad: bool):
    def repl(m: re.Match) -> str:
        if placeholder is None:  # a right-aligned rate: the column's right edge stays, whatever its digits
            return "<N>".rjust(len(m.group(0)))
        if pad == "right":
            return placeholder.rjust(len(m.group(0)))
        return placeholder.ljust(len(m.group(0))) if pad else placeholder
    return repl


def normalise(text: str) -> str:
    for pattern, placeholder, pad in _NORMALISE:
        text = pattern.sub(_replace(placeholder, pad), text)
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


def tidemark(address: str, *args: str, expect: int = 0, env: dict[str, str] | None = None) -> str:
    out = forkserver.run([sys.executable, "-m", "tidemark.client.cli.main", *args, "--broker", address],
                         capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})
    assert out.returncode == expect, f"tidemark {' '.join(args)} exited {out.returncode}: {out.stderr}"
    return out.stdout


def check(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    got = normalise(text)
    if UPDATE or not path.exists():
        if not UPDATE:
            pytest.fail(f"no golden file {path}; run with TIDEMARK_UPDATE_GOLDEN=1 to create it")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
    assert got == path.read_text(), f"output of {name} differs from {path}"


@pytest.fixture(scope="module")
def cli_broker(tmp_path_factory):
    from brokerproc import BrokerProcess

    broker = BrokerProcess(tmp_path_factory.mktemp("cli") / "data",
                           args=("--delay-levels", "100ms 200ms 300ms", "--max-reconsume-times", "1")).start()
    address = broker.address
    create_topic(address, "Golden", 2)
    with Producer(brokers=address) as p:
        for i in range(6):
            p.send(Message("Golden", b"golden-%d" % i, tags="t", keys=f"k{i}"),
                   queue=p.fetch_publish_message_queues("Golden")[i % 2])
    # A group with progress and one dead-lettered message.
    done = []

    def listener(msgs, ctx):
        done.extend(msgs)
        return (ConsumeConcurrentlyStatus.RECONSUME_LATER if msgs[0].body == b"golden-0"
                else ConsumeConcurrentlyStatus.CONSUME_SUCCESS)

    consumer = PushConsumer(group="golden-group", brokers=address, instance_name="golden",
                            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                            persist_consumer_offset_interval_s=0.2)
    consumer.subscribe("Golden")
    consumer.register_message_listener(listener)
    consumer.start()
    with Admin(brokers=address) as admin:
        wait_until(lambda: admin.list_topics(include_system=True).get("%DLQ%golden-group"), 30, "a DLQ message")
        wait_until(lambda: sum(s.lag for s in admin.consume_stats("golden-group", "Golden")) == 0, 30, "lag 0")
    yield broker, consumer
    consumer.shutdown()
    broker.kill()


REQUEUES: list[str] = []  # the requeues test_changing_commands executed (module-scoped broker)

CASES = [
    ("topic-list", ("topic", "list")),
    ("topic-list-system", ("topic", "list", "--system")),
    ("topic-describe", ("topic", "describe", "Golden")),
    ("message-get", ("message", "get", "--topic", "Golden", "--queue", "0", "--offset", "1")),
    ("message-search", ("message", "search", "--topic", "Golden", "--key", "k3")),
    ("consume-plain", ("consume", "Golden", "--from-offset", "earliest", "--count", "2")),
    ("group-list", ("group", "list")),
    ("group-progress", ("group", "progress", "golden-group", "--topic", "Golden")),
    ("group-describe", ("group", "describe", "golden-group")),
    ("group-reset-dry-run", ("group", "reset-offset", "golden-group", "--topic", "Golden", "--to-earliest")),
    ("dlq-list", ("dlq", "list", "golden-group")),
    ("health", ("health",)),
]


# consume prints JSON lines in either mode, so it has no table form.
READ_ONLY = [(name, args, as_json) for name, args in CASES for as_json in (False, True)
             if as_json or name != "consume-plain"]


@pytest.mark.parametrize("name, args, as_json", READ_ONLY,
                         ids=[f"{'json' if j else 'table'}-{n}" for n, _, j in READ_ONLY])
def test_read_only_commands(cli_broker, name, args, as_json):
    broker, _consumer = cli_broker
    extra = ("--json",) if as_json else ()
    check(f"{name}{'-json' if as_json else ''}", tidemark(broker.address, *args, *extra))


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_changing_commands(cli_broker, as_json):
    broker, _ = cli_broker
    suffix = "-json" if as_json else ""
    extra = ("--json",) if as_json else ()
    topic = f"Scratch{suffix.replace('-', '')}"
    check(f"topic-create{suffix}", tidemark(broker.address, "topic", "create", topic, "--queues", "3", *extra))
    # Every changing command: its plan (nothing changed), then --execute.
    check(f"topic-update-dry-run{suffix}", tidemark(broker.address, "topic", "update", topic, "--perm", "R", *extra))
    check(f"topic-update{suffix}",
          tidemark(broker.address, "topic", "update", topic, "--perm", "R", "--execute", *extra))
    tidemark(broker.address, "topic", "update", topic, "--perm", "RW", "--execute")
    check(f"send-body{suffix}", tidemark(broker.address, "send", topic, "--body", "hi", "--queue", "1", *extra))
    check(f"send-count{suffix}", tidemark(broker.address, "send", topic, "--count", "10", "--size", "8", *extra))
    check(f"group-reset-execute{suffix}",
          tidemark(broker.address, "group", "reset-offset", f"g{suffix}", "--topic", topic, "--to-offset", "1",
                   "--queue", "1", "--execute", *extra))
    check(f"group-delete-dry-run{suffix}", tidemark(broker.address, "group", "delete", f"g{suffix}", *extra))
    check(f"group-delete{suffix}", tidemark(broker.address, "group", "delete", f"g{suffix}", "--execute", *extra))
    # Each requeue sends golden-0 back to a listener that fails it: it is dead-lettered again (the next case's
    # plan shows that copy), after its retries, which take longer on a busy machine.
    dlq = MessageQueue("%DLQ%golden-group", "broker-a", 0)
    with Admin(brokers=broker.address) as admin:
        wait_until(lambda: admin.max_offset(dlq) > len(REQUEUES), 30, "golden-0 back in the DLQ")
    check(f"dlq-requeue-dry-run{suffix}",
          tidemark(broker.address, "dlq", "requeue", "golden-group", "--all", *extra))
    check(f"dlq-requeue{suffix}",
          tidemark(broker.address, "dlq", "requeue", "golden-group", "--all", "--execute", *extra))
    REQUEUES.append(suffix)
    check(f"topic-delete-dry-run{suffix}", tidemark(broker.address, "topic", "delete", topic, *extra))
    check(f"topic-delete{suffix}", tidemark(broker.address, "topic", "delete", topic, "--execute", *extra))


@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory):
    """Users and ACLs are managed only with --auth; golden-admin is the lasting super user, so `golden`
    may be demoted."""
    from brokerproc import BrokerProcess

    broker = BrokerProcess(tmp_path_factory.mktemp("cli-auth") / "data",
                           args=("--auth", "--init-user", "golden-admin:golden-admin-secret")).start()
    yield broker
    broker.stop()


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_user_and_acl_commands(auth_broker, as_json):
    suffix = "-json" if as_json else ""
    extra = ("--json",) if as_json else ()
    user = f"golden{suffix.replace('-', '')}"
    env = {"TIDEMARK_ACCESS_KEY": "golden-admin", "TIDEMARK_SECRET_KEY": "golden-admin-secret"}

    def run(*args: str) -> str:
        return tidemark(auth_broker.address, *args, *extra, env=env)

    check(f"user-create{suffix}", run("user", "create", user, "--secret-key", "golden-secret", "--super"))
    check(f"user-update-dry-run{suffix}", run("user", "update", user, "--no-super"))
    check(f"user-update{suffix}", run("user", "update", user, "--no-super", "--execute"))
    check(f"acl-create{suffix}", run("acl", "create", user, "--resource", "Topic:Golden*", "--actions", "Pub,Sub",
                                     "--decision", "Allow", "--source-ip", "10.0.0.0/8"))
    check(f"user-list{suffix}", run("user", "list"))
    check(f"acl-list{suffix}", run("acl", "list", "--user", user))
    check(f"acl-delete-dry-run{suffix}", run("acl", "delete", user, "--resource", "Topic:Golden*"))
    check(f"acl-delete{suffix}", run("acl", "delete", user, "--resource", "Topic:Golden*", "--execute"))
    check(f"user-delete-dry-run{suffix}", run("user", "delete", user))
    check(f"user-delete{suffix}", run("user", "delete", user, "--execute"))


BAD_USAGE = [
    ("topic", "create"),                          # missing name
    ("topic", "create", "X", "--queues", "many"),  # not a number
    ("group", "reset-offset", "g", "--topic", "T"),  # no target
    ("send", "T", "--body", "a", "--count", "2"),  # mutually exclusive
    ("frobnicate",),
]


@pytest.mark.parametrize("args", BAD_USAGE, ids=[" ".join(a) for a in BAD_USAGE])
def test_bad_usage_is_one_line_and_exit_2(args):
    out = forkserver.run([sys.executable, "-m", "tidemark.client.cli.main", *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    error_lines = [line for line in out.stderr.splitlines() if line.startswith("tidemark") and "error" in line]
    assert len(error_lines) == 1, out.stderr
