"""The `tidemark` command as an operator meets it with two brokers (issue 31, items 3-5), against real broker
processes: offset plans that name the broker, one rule for every changing command (a plan unless --execute,
and a delete refused while live clients use what it deletes), and the CLI gaps (lag in seconds, group
states, one-line usage errors, readable `message get`, a consumer of a disabled group).

Most commands run in-process (tidemark.client.cli.main.main); those that could hang run as processes
with a timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import forkserver
import pytest
from brokerproc import BrokerProcess
from workload import produce, wait_until

from tidemark.client import (
    Admin,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    MessageQueue,
    NotFoundError,
    Producer,
    PushConsumer,
)
from tidemark.client.cli import main as cli
from tidemark.client.cli.output import DRY_RUN
from tidemark.common.auth import Credentials

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> str:
    """Two brokers, broker-a and broker-b, as one `--broker` list."""
    root = tmp_path_factory.mktemp("operator")
    brokers = [BrokerProcess(root / name, broker_name=name).start() for name in ("broker-a", "broker-b")]
    yield ",".join(b.address for b in brokers)
    for b in brokers:
        b.kill()


@pytest.fixture
def run(two, monkeypatch, capsys):
    """run(*args) -> (exit code, stdout, stderr) of `tidemark ARGS --broker A,B`, in this process."""
    monkeypatch.setattr("tidemark.client.cli.main.setup_logging", lambda *a, **k: None)
    for name in ("TIDEMARK_BROKER", "TIDEMARK_NAMESRV", "TIDEMARK_ACCESS_KEY", "TIDEMARK_SECRET_KEY"):
        monkeypatch.delenv(name, raising=False)

    def run_(*args: str, broker: str | None = None) -> tuple[int, str, str]:
        try:
            code = cli.main([*args, "--broker", broker or two])
        except SystemExit as e:  # argparse
            code = e.code
        out = capsys.readouterr()
        return code, out.out, out.err
    return run_


def ok(run, *args: str, **kw) -> str:
    code, out, err = run(*args, **kw)
    assert code == 0, (args, code, err)
    return out


def fails(run, code: int, *args: str, **kw) -> str:
    """A command that must fail with `code`, saying why in exactly one line and printing nothing else."""
    got, out, err = run(*args, **kw)
    assert got == code, (args, got, out, err)
    assert out == "", out
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def process(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """`tidemark ARGS` as a process (TimeoutExpired when it hangs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")}
    return forkserver.run([sys.executable, "-m", "tidemark.client.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


def mq(topic: str, broker: str, queue_id: int) -> MessageQueue:
    return MessageQueue(topic, broker, queue_id)


def committed(address: str, group: str, topic: str) -> dict[tuple[str, int], int]:
    with Admin(brokers=address.split(",")) as admin:
        return {(s.queue.broker_name, s.queue.queue_id): s.consumer_offset for s in admin.consume_stats(group, topic)}


def spread_topic(address: str, topic: str, per_queue: int = 10) -> None:
    """`topic` with 2 queues on each broker and `per_queue` messages in each."""
    with Admin(brokers=address.split(",")) as admin:
        if topic in admin.list_topics():
            return
        admin.create_topic(topic, 2)
    produce(address, topic, 4 * per_queue, batch=per_queue)


def live_consumer(address: str, group: str, topic: str) -> PushConsumer:
    c = PushConsumer(group=group, brokers=address.split(","),
                     consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    c.subscribe(topic)
    c.register_message_listener(lambda msgs, ctx: ConsumeConcurrentlyStatus.CONSUME_SUCCESS)
    c.start()
    with Admin(brokers=address.split(",")) as admin:
        wait_until(lambda: admin.describe_group(group).members, 30, f"{group}'s member to register")
    return c


# -- item 3: offset plans across brokers ---------------------------------------------------------------------


def test_reset_offset_plans_export_and_import_across_two_brokers(two, run, tmp_path):
    spread_topic(two, "Spread")
    with Admin(brokers=two.split(",")) as admin:
        admin.commit("spreader", {mq("Spread", "broker-a", 0): 3, mq("Spread", "broker-a", 1): 4,
                                  mq("Spread", "broker-b", 0): 5, mq("Spread", "broker-b", 1): 6})
    saved = ok(run, "group", "reset-offset", "spreader", "--topic", "Spread", "--to-current", "--export")
    assert saved == "Spread,broker-a,0,3\nSpread,broker-a,1,4\nSpread,broker-b,0,5\nSpread,broker-b,1,6\n"
    assert ok(run, "group", "reset-offset", "spreader", "--all-topics", "--to-earliest", "--export") == \
        "Spread,broker-a,0,0\nSpread,broker-a,1,0\nSpread,broker-b,0,0\nSpread,broker-b,1,0\n"
    ok(run, "group", "reset-offset", "spreader", "--topic", "Spread", "--to-earliest", "--execute")
    assert set(committed(two, "spreader", "Spread").values()) == {0}

    plan = tmp_path / "plan.csv"
    plan.write_text(saved)
    out = ok(run, "group", "reset-offset", "spreader", "--from-file", str(plan))
    assert "dry run" in out and set(committed(two, "spreader", "Spread").values()) == {0}
    ok(run, "group", "reset-offset", "spreader", "--from-file", str(plan), "--execute")
    assert committed(two, "spreader", "Spread") == {("broker-a", 0): 3, ("broker-a", 1): 4, ("broker-b", 0): 5,
                                                    ("broker-b", 1): 6}

    # The old form (no broker) is read where it is unambiguous only: this topic is on two brokers.
    plan.write_text("Spread,0,1\n")
    message = fails(run, 1, "group", "reset-offset", "spreader", "--from-file", str(plan), "--execute")
    assert "line 1:" in message and "broker-a" in message and "broker-b" in message
    plan.write_text("Spread,broker-c,0,1\n")
    assert "broker-c" in fails(run, 1, "group", "reset-offset", "spreader", "--from-file", str(plan), "--execute")
    assert committed(two, "spreader", "Spread")[("broker-a", 0)] == 3
    # ... and still taken for a topic on one broker.
    with Admin(brokers=two.split(",")) as admin:
        admin.create_topic("Solo", 1, brokers=["broker-b"])
    produce(two, "Solo", 5)
    plan.write_text("Solo,0,2\n")
    ok(run, "group", "reset-offset", "spreader", "--from-file", str(plan), "--execute")
    assert committed(two, "spreader", "Solo") == {("broker-b", 0): 2}


def test_one_queue_of_a_topic_on_two_brokers_is_named_with_its_broker(two, run):
    spread_topic(two, "Spread")
    with Admin(brokers=two.split(",")) as admin:
        admin.commit("picker", {mq("Spread", b, q): 5 for b in ("broker-a", "broker-b") for q in (0, 1)})
    message = fails(run, 1, "group", "reset-offset", "picker", "--topic", "Spread", "--queue", "0", "--to-offset", "1")
    assert "broker-a" in message and "broker-b" in message and "--broker-name" in message
    rows = json.loads(ok(run, "group", "reset-offset", "picker", "--topic", "Spread", "--queue", "0", "--broker-name",
                         "broker-b", "--to-offset", "1", "--execute", "--json"))
    assert [(r["broker"], r["queue"], r["current_offset"], r["new_offset"]) for r in rows] == [("broker-b", 0, 5, 1)]
    assert committed(two, "picker", "Spread") == {("broker-a", 0): 5, ("broker-a", 1): 5, ("broker-b", 0): 1,
                                                  ("broker-b", 1): 5}
    assert ok(run, "group", "reset-offset", "picker", "--topic", "Spread", "--queue", "0", "--broker-name",
              "broker-b", "--to-current", "--export") == "Spread,broker-b,0,1\n"
    assert "broker-c" in fails(run, 1, "group", "reset-offset", "picker", "--topic", "Spread", "--queue", "0",
                               "--broker-name", "broker-c", "--to-offset", "1")


# -- item 4: a plan unless --execute; deletes refused while live clients use what they delete ------------------


def _perms(address: str, topic: str) -> list[str]:
    with Admin(brokers=address.split(",")) as admin:
        return [t.perm for _b, t in admin.list_topics().get(topic, [])]


def test_changing_commands_show_their_plan_unless_execute(two, run):
    spread_topic(two, "Doomed", per_queue=2)
    # topic update
    out = ok(run, "topic", "update", "Doomed", "--perm", "R")
    assert "dry run" in out.splitlines()[-1] and "R-" in out and _perms(two, "Doomed") == ["RW", "RW"]
    code, out, err = run("topic", "update", "Doomed", "--perm", "R", "--json")  # JSON on stdout, the note on stderr
    assert code == 0 and json.loads(out) and err.strip() == DRY_RUN and _perms(two, "Doomed") == ["RW", "RW"]
    ok(run, "topic", "update", "Doomed", "--perm", "R", "--execute")
    assert _perms(two, "Doomed") == ["R-", "R-"]
    ok(run, "topic", "update", "Doomed", "--perm", "RW", "--execute")

    # dlq requeue: one dead letter, made by sending a message back with delay level -1
    with Admin(brokers=two.split(",")) as admin:
        (first,) = admin.pull(mq("Doomed", "broker-a", 0), 0, max_nums=1).messages
        admin.send_back("dlq-doomed", first, delay_level=-1)
        wait_until(lambda: len(admin.dead_letters("dlq-doomed")) == 1, 30, "the dead letter")
        stored = sum(hi for hi in (h for _lo, h in admin.offsets(admin.fetch_message_queues("Doomed")).values()))
    planned = json.loads(ok(run, "dlq", "requeue", "dlq-doomed", "--all", "--json"))
    assert [r["msg_id"] for r in planned] == [first.msg_id]
    assert "dry run" in ok(run, "dlq", "requeue", "dlq-doomed", "--all").splitlines()[-1]
    with Admin(brokers=two.split(",")) as admin:
        assert sum(h for _lo, h in admin.offsets(admin.fetch_message_queues("Doomed")).values()) == stored
    requeued = json.loads(ok(run, "dlq", "requeue", "dlq-doomed", "--all", "--execute", "--json"))
    assert [r["msg_id"] for r in requeued] == [first.msg_id]
    assert json.loads(ok(run, "dlq", "requeue", "dlq-doomed", "--all", "--json")) == []

    # group delete
    with Admin(brokers=two.split(",")) as admin:
        admin.commit("doomed-group", {mq("Doomed", "broker-a", 0): 1, mq("Doomed", "broker-b", 1): 1})
    out = ok(run, "group", "delete", "doomed-group")
    assert "dry run" in out.splitlines()[-1] and "Doomed" in out
    assert committed(two, "doomed-group", "Doomed")[("broker-a", 0)] == 1
    ok(run, "group", "delete", "doomed-group", "--execute")
    assert set(committed(two, "doomed-group", "Doomed").values()) == {-1}
    with Admin(brokers=two.split(",")) as admin, pytest.raises(NotFoundError):
        admin.describe_group("doomed-group")

    # topic delete
    (row,) = json.loads(ok(run, "topic", "delete", "Doomed", "--json"))
    assert row["deleted"] is False and row["brokers"] == ["broker-a", "broker-b"] and row["live_consumers"] == []
    assert _perms(two, "Doomed") == ["RW", "RW"]
    assert ok(run, "topic", "delete", "Doomed", "--execute").splitlines()[-1] == "topic Doomed deleted"
    assert _perms(two, "Doomed") == []


def test_deletes_are_refused_while_live_clients_use_what_they_delete(two, run):
    spread_topic(two, "Watched", per_queue=1)
    consumer = live_consumer(two, "watcher", "Watched")
    try:
        with Admin(brokers=two.split(",")) as admin:
            (member,) = admin.describe_group("watcher").members
        plan = ok(run, "topic", "delete", "Watched")
        assert member.client_id in plan
        message = fails(run, 1, "topic", "delete", "Watched", "--execute")
        assert "watcher" in message and member.client_id in message and "--force" in message
        message = fails(run, 1, "group", "delete", "watcher", "--execute")
        assert member.client_id in message
        assert _perms(two, "Watched") == ["RW", "RW"]
        ok(run, "topic", "delete", "Watched", "--execute", "--force")
        assert _perms(two, "Watched") == []
    finally:
        consumer.shutdown()


def test_user_and_acl_changes_show_their_plan_unless_execute(broker_factory, run, monkeypatch):
    b = broker_factory(args=("--auth", "--init-user", "root:root-secret-01"))
    monkeypatch.setenv("TIDEMARK_ACCESS_KEY", "root")
    monkeypatch.setenv("TIDEMARK_SECRET_KEY", "root-secret-01")
    with Admin(brokers=b.address, credentials=_root()) as admin:
        admin.create_user("ops", "ops-secret-01")
        admin.create_acl("ops", "Topic:Orders", ["Pub"], "Allow")
    out = ok(run, "user", "update", "ops", "--super", broker=b.address)
    assert "dry run" in out.splitlines()[-1]
    out = ok(run, "acl", "delete", "ops", broker=b.address)
    assert "dry run" in out.splitlines()[-1] and "Topic:Orders" in out
    out = ok(run, "user", "delete", "ops", broker=b.address)
    assert "dry run" in out.splitlines()[-1]
    with Admin(brokers=b.address, credentials=_root()) as admin:
        assert [(u.name, u.super_user) for u in admin.list_users()] == [("ops", False), ("root", True)]
        assert len(admin.list_acls("ops")) == 1
    ok(run, "user", "update", "ops", "--super", "--execute", broker=b.address)
    ok(run, "acl", "delete", "ops", "--execute", broker=b.address)
    ok(run, "user", "delete", "ops", "--execute", broker=b.address)
    with Admin(brokers=b.address, credentials=_root()) as admin:
        assert [u.name for u in admin.list_users()] == ["root"]


def _root() -> Credentials:
    return Credentials("root", "root-secret-01")


# -- item 5: CLI gaps --------------------------------------------------------------------------------------------


def test_group_progress_and_describe_show_lag_in_seconds(two, run):
    with Admin(brokers=two.split(",")) as admin:
        admin.create_topic("Aged", 1, brokers=["broker-a"])
    with Producer(brokers=two.split(",")) as p:
        for i in range(3):
            p.send(Message("Aged", b"old-%d" % i), queue=mq("Aged", "broker-a", 0))
    time.sleep(1.5)  # the oldest unconsumed message is at least this old
    with Admin(brokers=two.split(",")) as admin:
        admin.commit("ager", {mq("Aged", "broker-a", 0): 1})
        admin.commit("caught-up", {mq("Aged", "broker-a", 0): 3})
    (row,) = json.loads(ok(run, "group", "progress", "ager", "--json"))
    assert row["lag"] == 2 and 1.5 <= row["lag_s"] < 120, row
    (row,) = json.loads(ok(run, "group", "progress", "caught-up", "--json"))
    assert (row["lag"], row["lag_s"]) == (0, 0.0)
    table = ok(run, "group", "progress", "ager").splitlines()
    assert table[0].split() == ["TOPIC", "BROKER", "QUEUE", "BROKER_OFFSET", "CONSUMER_OFFSET", "LAG", "LAG_S",
                                "LAST_CONSUMED"], table[0]
    (doc,) = json.loads(ok(run, "group", "describe", "ager", "--json"))
    assert doc["queues"][0]["lag_s"] >= 1.5 and doc["lag_s"] == doc["queues"][0]["lag_s"]
    assert "LAG_S" in ok(run, "group", "describe", "ager")


def test_group_list_shows_each_groups_state_and_filters_by_it(two, run):
    spread_topic(two, "Listed", per_queue=1)
    with Admin(brokers=two.split(",")) as admin:
        admin.commit("list-empty", {mq("Listed", "broker-a", 0): 1})
    consumer = live_consumer(two, "list-stable", "Listed")
    try:
        with Admin(brokers=two.split(",")) as admin:
            # Each broker knows the owners of its own queues: Stable needs both brokers' answers merged.
            wait_until(lambda: len([lk for lk in admin.describe_group("list-stable").locks
                                    if lk.queue.topic == "Listed"]) == 4, 30, "the member to own every queue")
        states = {r["group"]: r["state"] for r in json.loads(ok(run, "group", "list", "--json"))}
        assert states["list-empty"] == "Empty" and states["list-stable"] == "Stable"
        table = ok(run, "group", "list").splitlines()
        assert "STATE" in table[0].split()
        empty = {r["group"] for r in json.loads(ok(run, "group", "list", "--state", "Empty", "--json"))}
        assert "list-empty" in empty and "list-stable" not in empty
        both = {r["group"] for r in json.loads(ok(run, "group", "list", "--state", "stable,empty", "--json"))}
        assert {"list-empty", "list-stable"} <= both
        assert "Bored" in fails(run, 2, "group", "list", "--state", "Bored")
    finally:
        consumer.shutdown()


def test_consume_refuses_offsets_past_int64_and_an_empty_group(two):
    spread_topic(two, "Bounded", per_queue=1)
    for args in (("--from-offset", "9223372036854775808"), ("--from-offset", "-1"), ("--group", "")):
        proc = process("consume", "Bounded", *args, "--count", "1", "--broker", two)
        assert proc.returncode == 2, (args, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert ("--from-offset" if args[0] == "--from-offset" else "--group") in lines[0]


def test_usage_errors_are_one_line(run):
    for args in (("topic", "create", "X", "--queues", "0"), ("group", "reset-offset", "g", "--topic", "T"),
                 ("dlq", "list", "g", "--max", "0"), ("topic", "update", "X", "--nonsense")):
        line = fails(run, 2, *args)
        assert line.startswith("tidemark") and "error:" in line, line
    code, _out, err = run("--nonsense")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "unknown option --nonsense" in err and "required" not in err, err


def test_to_datetime_takes_epoch_milliseconds(two, run):
    spread_topic(two, "Timed", per_queue=3)

    def plan(when: str) -> list[int]:
        rows = json.loads(ok(run, "group", "reset-offset", "timer", "--topic", "Timed", "--to-datetime", when,
                             "--json"))
        return [r["new_offset"] for r in rows]
    future_ms = int(time.time() * 1000) + 86_400_000
    assert plan(str(future_ms)) == plan(datetime.fromtimestamp(future_ms / 1000).isoformat()) == [3, 3, 3, 3]
    assert plan("0") == [0, 0, 0, 0]
    assert "--to-datetime" in fails(run, 1, "group", "reset-offset", "timer", "--topic", "Timed", "--to-datetime",
                                    "9" * 30)


def test_topic_update_queues_sets_read_and_write_queues(two, run):
    spread_topic(two, "Resized", per_queue=1)
    rows = json.loads(ok(run, "topic", "update", "Resized", "--queues", "3", "--execute", "--json"))
    assert [(r["broker"], r["read_queues"], r["write_queues"]) for r in rows] == [("broker-a", 3, 3),
                                                                                 ("broker-b", 3, 3)]


def test_dlq_requeue_help_shows_the_dlq_topic_once_escaped(run):
    code, out, _err = run("dlq", "requeue", "--help")
    assert code == 0 and "%DLQ%GROUP" in out and "%%" not in out, out


def test_message_get_shows_times_and_properties_readably_and_raw_in_json(two, run):
    with Admin(brokers=two.split(",")) as admin:
        admin.create_topic("Shown", 1, brokers=["broker-b"])
    with Producer(brokers=two.split(",")) as p:
        p.send(Message("Shown", b"hello", tags="paid", keys="order-1", properties={"region": "eu"}))
    args = ("message", "get", "--topic", "Shown", "--queue", "0", "--offset", "0", "--broker-name", "broker-b")
    (doc,) = [json.loads(line) for line in ok(run, *args, "--json").splitlines()]
    assert isinstance(doc["store_timestamp"], int) and doc["properties"]["region"] == "eu"
    text = ok(run, *args)
    assert str(doc["store_timestamp"]) not in text and "{" not in text, text
    stamp = datetime.fromtimestamp(doc["store_timestamp"] / 1000).isoformat(timespec="milliseconds")
    assert any(line.split()[:2] == ["store_timestamp", stamp] for line in text.splitlines()), text
    assert any(line.strip().endswith("region=eu") for line in text.splitlines()), text


def test_consume_as_a_group_that_may_not_consume_says_so(two, run):
    spread_topic(two, "Gated", per_queue=1)
    ok(run, "group", "update", "gated", "--consume-enable", "false", "--execute")
    proc = process("consume", "Gated", "--group", "gated", "--from-where", "first", "--count", "1", "--broker", two)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert "consume_enable" in lines[0] and "gated" in lines[0]
    ok(run, "group", "update", "gated", "--consume-enable", "true", "--execute")
    proc = process("consume", "Gated", "--group", "gated", "--from-where", "first", "--count", "1", "--broker", two,
                   timeout=60)
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 1, proc.stderr

