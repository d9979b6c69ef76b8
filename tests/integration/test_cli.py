"""The `tidemark` command against a real broker: topic/send/consume round trip, group progress and
reset-offset, and the error contract (one line on stderr, exit 1; usage errors exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import forkserver
import pytest
from brokerproc import BrokerProcess, free_port

from tidemark.client import Admin, MessageQueue

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cli_broker(tmp_path_factory) -> BrokerProcess:
    b = BrokerProcess(tmp_path_factory.mktemp("cli") / "data").start()
    yield b
    b.kill()


def tidemark(*args: str, broker: str | None, timeout: float = 60,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tidemark.client.cli.main", *args]
    if broker is not None:
        cmd += ["--broker", broker]
    environ = {k: v for k, v in os.environ.items() if k != "TIDEMARK_BROKER"}
    return forkserver.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env={**environ, **(env or {})})


def ok(*args: str, broker: str) -> str:
    proc = tidemark(*args, broker=broker)
    assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stderr}"
    return proc.stdout


def fails(code: int, *args: str, broker: str | None) -> str:
    """Run a command that must fail; return its stderr."""
    proc = tidemark(*args, broker=broker)
    assert proc.returncode == code, f"{args}: exit {proc.returncode}, wanted {code}\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout == ""
    return proc.stderr


def table_rows(text: str) -> list[dict[str, str]]:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header = lines[0].split()
    return [dict(zip(header, ln.split(), strict=True)) for ln in lines[1:] if len(ln.split()) == len(header)]


def test_topic_create_send_consume_round_trip(cli_broker):
    addr = cli_broker.address
    created = table_rows(ok("topic", "create", "cli-rt", "--queues", "4", broker=addr))
    assert created == [{"TOPIC": "cli-rt", "BROKER": "broker-a", "READ_QUEUES": "4", "WRITE_QUEUES": "4",
                        "PERM": "RW"}]
    # TIDEMARK_BROKER stands in for --broker.
    listed = tidemark("topic", "list", "--json", broker=None, env={"TIDEMARK_BROKER": addr})
    assert listed.returncode == 0, listed.stderr
    assert {"topic": "cli-rt", "broker": "broker-a", "read_queues": 4, "write_queues": 4,
            "perm": "RW"} in json.loads(listed.stdout)

    summary = json.loads(ok("send", "cli-rt", "--count", "1000", "--size", "64", "--tag", "T1", "--keys", "k1 k2",
                            "--json", broker=addr))
    assert summary[0]["sent"] == 1000

    out = ok("consume", "cli-rt", "--from-offset", "earliest", "--count", "1000", broker=addr)
    docs = [json.loads(line) for line in out.splitlines()]
    assert len(docs) == 1000
    assert len({d["msg_id"] for d in docs}) == 1000
    by_queue: dict[int, list[int]] = defaultdict(list)
    for d in docs:
        assert {"topic", "queue_id", "queue_offset", "msg_id", "tags", "keys", "body", "store_timestamp"} <= set(d)
        assert (d["topic"], d["tags"], d["keys"], d["body_encoding"]) == ("cli-rt", "T1", "k1 k2", "utf-8")
        assert len(d["body"]) == 64 and d["store_timestamp"] > 0
        by_queue[d["queue_id"]].append(d["queue_offset"])
    # Every message once, each queue read in order from 0.
    assert sorted(by_queue) == [0, 1, 2, 3]
    for offsets in by_queue.values():
        assert offsets == list(range(len(offsets)))

    with Admin(brokers=addr) as admin:
        assert sum(admin.max_offset(MessageQueue("cli-rt", "broker-a", q)) for q in range(4)) == 1000

    # A single message with a UTF-8 body, then read from an explicit offset.
    sent = table_rows(ok("send", "cli-rt", "--body", "héllo", "--queue", "2", "--tag", "one", broker=addr))[0]
    assert sent["QUEUE"] == "2"
    offset = int(sent["OFFSET"])
    tail = [json.loads(line) for line in ok("consume", "cli-rt", "--from-offset", str(offset), "--count", "1",
                                             "--tag", "one", broker=addr).splitlines()]
    assert [(d["queue_id"], d["queue_offset"], d["body"], d["tags"]) for d in tail] == [(2, offset, "héllo", "one")]


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr}"
    return lines[0]


def test_errors_are_one_line_with_exit_1(cli_broker):
    addr = cli_broker.address
    ok("topic", "create", "cli-err", "--queues", "2", broker=addr)
    assert "'nope' does not exist" in _one_line(fails(1, "send", "nope", "--body", "x", broker=addr))
    assert "nope" in _one_line(fails(1, "consume", "nope", "--count", "1", broker=addr))
    assert "'cli-err' already exists" in _one_line(fails(1, "topic", "create", "cli-err", broker=addr))
    assert "reserved" in _one_line(fails(1, "topic", "create", "%DLQ%mine", broker=addr))
    assert "may only contain" in _one_line(fails(1, "topic", "create", "bad name", broker=addr))
    assert "--from-offset" in _one_line(fails(2, "consume", "cli-err", "--from-offset", "soon", "--count", "1",
                                             broker=addr))  # a usage error, as every bad value of an option
    assert "no writable queue 7" in _one_line(fails(1, "send", "cli-err", "--body", "x", "--queue", "7", broker=addr))
    assert "has no offsets" in _one_line(fails(1, "group", "progress", "nobody", broker=addr))
    dead = f"127.0.0.1:{free_port()}"
    assert dead in _one_line(fails(1, "topic", "list", broker=dead))
    # Nothing was sent by the failed commands.
    with Admin(brokers=addr) as admin:
        assert [admin.max_offset(MessageQueue("cli-err", "broker-a", q)) for q in (0, 1)] == [0, 0]


@pytest.mark.parametrize("args", [
    ("send",),
    ("send", "t", "--body", "x", "--count", "3"),
    ("topic", "create", "t", "--queues", "many"),
    ("topic", "frobnicate"),
    ("group", "reset-offset", "g", "--topic", "t"),
    ("group", "reset-offset", "g", "--topic", "t", "--to-earliest", "--to-latest"),
    ("consume", "t", "--no-such-flag"),
])
def test_usage_errors_exit_2(args):
    stderr = fails(2, *args, broker=None)
    assert stderr.strip().splitlines()[-1].startswith("tidemark")
    assert "error:" in stderr


# -- group progress and reset-offset ---------------------------------------------------


@pytest.fixture(scope="module")
def group_topic(cli_broker) -> str:
    """Topic cli-grp with 10 / 6 / 4 messages in queues 0 / 1 / 2; group cg committed 7 / 6 / none."""
    addr = cli_broker.address
    ok("topic", "create", "cli-grp", "--queues", "3", broker=addr)
    for q, n in enumerate((10, 6, 4)):
        ok("send", "cli-grp", "--count", str(n), "--batch", str(n), "--queue", str(q), "--size", "10", broker=addr)
    with Admin(brokers=addr) as admin:
        admin.commit("cg", {MessageQueue("cli-grp", "broker-a", 0): 7, MessageQueue("cli-grp", "broker-a", 1): 6})
    return "cli-grp"


def _committed(addr: str, group: str) -> list[int]:
    with Admin(brokers=addr) as admin:
        return [admin.committed(group, MessageQueue("cli-grp", "broker-a", q)) for q in range(3)]


def test_group_progress_table_and_json(cli_broker, group_topic):
    addr = cli_broker.address
    text = ok("group", "progress", "cg", "--topic", group_topic, broker=addr)
    assert text.splitlines()[0].split() == ["TOPIC", "BROKER", "QUEUE", "BROKER_OFFSET", "CONSUMER_OFFSET", "LAG",
                                            "LAG_S", "LAST_CONSUMED"]
    rows = [(r["TOPIC"], r["BROKER"], r["QUEUE"], r["BROKER_OFFSET"], r["CONSUMER_OFFSET"], r["LAG"])
            for r in table_rows(text)]
    assert rows == [("cli-grp", "broker-a", "0", "10", "7", "3"), ("cli-grp", "broker-a", "1", "6", "6", "0"),
                    ("cli-grp", "broker-a", "2", "4", "-1", "4")]
    assert text.splitlines()[-1] == "total lag 7"

    docs = json.loads(ok("group", "progress", "cg", "--json", broker=addr))  # no --topic: every topic of the group
    assert [(d["topic"], d["broker"], d["queue"], d["broker_offset"], d["consumer_offset"], d["lag"]) for d in docs] \
        == [("cli-grp", "broker-a", 0, 10, 7, 3), ("cli-grp", "broker-a", 1, 6, 6, 0),
            ("cli-grp", "broker-a", 2, 4, -1, 4)]
    assert docs[0]["last_consumed"] != "-" and docs[2]["last_consumed"] == "-"


def test_group_reset_offset_is_a_dry_run_until_execute(cli_broker, group_topic):
    addr = cli_broker.address
    g = "cg-reset"
    with Admin(brokers=addr) as admin:
        admin.commit(g, {MessageQueue(group_topic, "broker-a", q): 2 for q in range(3)})

    def reset(*target: str) -> list[tuple[int, int, int]]:
        docs = json.loads(ok("group", "reset-offset", g, "--topic", group_topic, *target, "--json", broker=addr))
        return [(d["queue"], d["current_offset"], d["new_offset"]) for d in docs]

    # Dry run (the default): before/after per queue, nothing changes.
    text = ok("group", "reset-offset", g, "--topic", group_topic, "--to-earliest", broker=addr)
    assert [(r["QUEUE"], r["CURRENT_OFFSET"], r["NEW_OFFSET"]) for r in table_rows(text)] == \
        [("0", "2", "0"), ("1", "2", "0"), ("2", "2", "0")]
    assert "dry run" in text.splitlines()[-1]
    assert reset("--to-latest") == [(0, 2, 10), (1, 2, 6), (2, 2, 4)]
    assert reset("--shift-by", "3") == [(0, 2, 5), (1, 2, 5), (2, 2, 4)]
    assert _committed(addr, g) == [2, 2, 2]

    assert reset("--to-latest", "--execute") == [(0, 2, 10), (1, 2, 6), (2, 2, 4)]
    assert _committed(addr, g) == [10, 6, 4]
    assert reset("--shift-by", "-5", "--execute") == [(0, 10, 5), (1, 6, 1), (2, 4, 0)]
    assert _committed(addr, g) == [5, 1, 0]
    # Every message is younger than 10 minutes: back to the start.
    assert reset("--by-duration", "PT10M", "--execute") == [(0, 5, 0), (1, 1, 0), (2, 0, 0)]
    future = datetime(2099, 1, 1, tzinfo=UTC).isoformat()
    assert reset("--to-datetime", future, "--execute") == [(0, 0, 10), (1, 0, 6), (2, 0, 4)]
    assert _committed(addr, g) == [10, 6, 4]
    out = ok("group", "reset-offset", g, "--topic", group_topic, "--to-offset", "3", "--queue", "1", "--execute",
             broker=addr)
    assert [(r["QUEUE"], r["CURRENT_OFFSET"], r["NEW_OFFSET"]) for r in table_rows(out)] == [("1", "6", "3")]
    assert "offsets reset" in out
    assert _committed(addr, g) == [10, 3, 4]

    # Bad targets fail without changing anything.
    assert "outside" in _one_line(fails(1, "group", "reset-offset", g, "--topic", group_topic, "--to-offset", "99",
                                        "--execute", broker=addr))
    assert "PT10M" in _one_line(fails(1, "group", "reset-offset", g, "--topic", group_topic, "--by-duration", "10m",
                                      "--execute", broker=addr))
    assert "ISO" in _one_line(fails(1, "group", "reset-offset", g, "--topic", group_topic, "--to-datetime",
                                    "yesterday", "--execute", broker=addr))
    assert _committed(addr, g) == [10, 3, 4]
