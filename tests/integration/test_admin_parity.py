"""Admin parity with RocketMQ's mqadmin and kafka-consumer-groups (issue 19, part 3), against real brokers:
`message get --msg-id`, `broker status`, `group update` and the enforcement of each setting by the broker
(consume_enable, retry_max_times, consume_broadcast_enable), `group reset-offset` with --all-topics,
--to-current, --export and --from-file, `group delete-offsets` and `group clone-offset`.

The CLI runs in-process (tidemark.client.cli.main.main) with its stdout and stderr captured."""

from __future__ import annotations

import json
import threading
import time

import grpc
import pytest
from brokerproc import BrokerProcess, BrokerStubs
from faults.proxy import FaultProxy
from workload import create_topic, produce, wait_until

from tidemark.client import (
    Admin,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    MessageQueue,
    NotFoundError,
    NotMasterError,
    Producer,
    PushConsumer,
    RequestTimeoutError,
)
from tidemark.client.cli import main as cli
from tidemark.client.message import MessageModel
from tidemark.common.protocol import MessageIdGenerator, dlq_topic
from tidemark.v1 import messaging_pb2

# Retries come back after 100 ms, 200 ms...: a message reaches the DLQ within seconds.
BROKER_ARGS = ("--delay-levels", " ".join(f"{n * 100}ms" for n in range(1, 19)))


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("admin-parity") / "data", args=BROKER_ARGS).start()
    yield b
    b.kill()


@pytest.fixture
def run(broker, monkeypatch, capsys):
    """run(*args) -> (exit code, stdout, stderr) of `tidemark ARGS --broker ADDRESS`."""
    monkeypatch.setattr("tidemark.client.cli.main.setup_logging", lambda *a, **k: None)
    monkeypatch.delenv("TIDEMARK_BROKER", raising=False)
    monkeypatch.delenv("TIDEMARK_NAMESRV", raising=False)

    def run_(*args: str) -> tuple[int, str, str]:
        try:
            code = cli.main([*args, "--broker", broker.address])
        except SystemExit as e:  # argparse's usage errors
            code = e.code
        out = capsys.readouterr()
        return code, out.out, out.err
    return run_


def ok(run, *args: str) -> str:
    code, out, err = run(*args)
    assert code == 0, (args, code, err)
    return out


def fails(run, code: int, *args: str) -> str:
    """A command that must fail with `code`, saying why in one line and printing nothing else."""
    got, out, err = run(*args)
    assert got == code, (args, got, out, err)
    assert out == "" and "Traceback" not in err, err
    lines = err.strip().splitlines()
    if code == 2:  # argparse: its usage, then one error line
        lines = [line for line in lines if line.startswith("tidemark") and "error" in line]
    assert len(lines) == 1, err
    return lines[0]


def committed(address: str, group: str, topic: str) -> dict[int, int]:
    with Admin(brokers=address) as admin:
        return {s.queue.queue_id: s.consumer_offset for s in admin.consume_stats(group, topic)}


def mq(topic: str, queue_id: int) -> MessageQueue:
    return MessageQueue(topic, "broker-a", queue_id)


class Received:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.messages = []

    def add(self, msgs) -> None:
        with self.lock:
            self.messages.extend(msgs)

    def keys(self) -> list[str]:
        with self.lock:
            return [m.keys for m in self.messages]


def consumer(address: str, group: str, topic: str, listener, **kw) -> PushConsumer:
    c = PushConsumer(group=group, brokers=address, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                     persist_consumer_offset_interval_s=0.2, **kw)
    c.subscribe(topic)
    c.register_message_listener(listener)
    return c.start()


def receiving(address: str, group: str, topic: str, **kw) -> tuple[PushConsumer, Received]:
    got = Received()

    def listener(msgs, ctx):
        got.add(msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
    return consumer(address, group, topic, listener, **kw), got


# -- message get --msg-id ---------------------------------------------------------------------------------


def test_message_get_by_msg_id_finds_the_message_and_refuses_unknown_or_malformed_ids(broker, run):
    create_topic(broker.address, "ById", 2)
    ids = produce(broker.address, "ById", 6, batch=3)
    for msg_id in (ids[1], ids[4]):
        (doc,) = [json.loads(line) for line in ok(run, "message", "get", "--msg-id", msg_id, "--json").splitlines()]
        assert (doc["msg_id"], doc["topic"], doc["stored_topic"]) == (msg_id, "ById", "ById")
        assert doc["keys"] == f"m{ids.index(msg_id)}"
    (doc,) = [json.loads(line) for line in
              ok(run, "message", "get", "--msg-id", ids[2].lower(), "--topic", "ById", "--json").splitlines()]
    assert doc["msg_id"] == ids[2]
    table = ok(run, "message", "get", "--msg-id", ids[0])
    assert "field" in table.splitlines()[0].lower() and ids[0] in table
    # Well formed, but no such message; malformed; a topic that does not exist.
    unknown = MessageIdGenerator().next()
    assert unknown in fails(run, 1, "message", "get", "--msg-id", unknown)
    assert "malformed" in fails(run, 1, "message", "get", "--msg-id", "not-an-id")
    assert "malformed" in fails(run, 1, "message", "get", "--msg-id", "0" * 32)
    assert "NoSuchTopic" in fails(run, 1, "message", "get", "--msg-id", ids[0], "--topic", "NoSuchTopic")
    assert "--msg-id" in fails(run, 1, "message", "get", "--topic", "ById")


# -- broker status ------------------------------------------------------------------------------------------


def test_broker_status_shows_version_uptime_store_role_clients_and_counts(broker, run):
    create_topic(broker.address, "Status", 1)
    produce(broker.address, "Status", 3)
    with Admin(brokers=broker.address) as admin:
        before = admin.broker_status()[0]
    c, got = receiving(broker.address, "status-group", "Status")
    try:
        wait_until(lambda: len(got.keys()) == 3, 30, "the consumer to read the topic")

        def status() -> dict:
            (row,) = json.loads(ok(run, "broker", "status", "--json"))
            return row
        wait_until(lambda: status()["consumer_clients"] == before.consumer_clients + 1, 30, "the client counted")
        row = status()
        table = ok(run, "broker", "status")
    finally:
        c.shutdown()
    assert (row["broker_name"], row["role"], row["broker_id"], row["flush_mode"]) == ("broker-a", "MASTER", 0, "async")
    assert row["broker_addr"] == broker.address and row["version"]
    assert row["uptime_ms"] > 0 and row["store_size_bytes"] > before.store_size_bytes - 1
    assert row["commit_log_max_offset"] > 0 and row["fetch_streams"] >= 1
    with Admin(brokers=broker.address) as admin:
        topics = admin.list_topics()
        groups = admin.list_groups()
    assert row["topics"] == len(topics) and row["groups"] == len(groups)
    header, line = table.splitlines()[:2]
    assert header.lower().split()[:5] == ["broker", "id", "address", "version", "uptime"]
    assert "master" in line and broker.address in line


def test_broker_status_shows_a_replica_with_its_master_and_whether_it_is_in_sync(broker_factory, monkeypatch,
                                                                                  capsys):
    master = broker_factory("broker-a", args=("--replication", "sync", "--replication-timeout-ms", "1000"))
    link = FaultProxy(master.address, name="replica-link")  # the replica's way to its master
    try:
        replica = broker_factory("broker-a", args=("--broker-id", "1", "--master", link.address))
        create_topic(master.address, "Replicated", 1)
        monkeypatch.setattr("tidemark.client.cli.main.setup_logging", lambda *a, **k: None)

        def status() -> dict[int, dict]:
            assert cli.main(["broker", "status", "--json", "--broker", f"{master.address},{replica.address}"]) == 0
            return {row["broker_id"]: row for row in json.loads(capsys.readouterr().out)}

        def role() -> str:  # the master's, as the table shows it
            assert cli.main(["broker", "status", "--broker", master.address]) == 0
            return capsys.readouterr().out.splitlines()[1]
        wait_until(lambda: status()[0]["in_sync_replicas"] == [1], 30, "the replica in sync with its master")
        produce(master.address, "Replicated", 3)  # (a sync master refuses sends before)
        rows = status()
        assert (rows[0]["role"], rows[0]["replication_mode"], rows[0]["master_addr"]) == ("MASTER", "sync", "")
        assert (rows[1]["role"], rows[1]["master_addr"], rows[1]["broker_addr"]) == ("REPLICA", link.address,
                                                                                     replica.address)
        assert (rows[0]["replicas"], rows[1]["in_sync_replicas"]) == (1, [])  # (a replica has none)
        wait_until(lambda: status()[1]["commit_log_max_offset"] == rows[0]["commit_log_max_offset"], 30,
                   "the replica to catch up")
        assert "master (sync, 1 replica(s), in sync: 1)" in role()

        # Connected is not in sync: a replica that acknowledges nothing leaves the set once it lags past
        # max(replication timeout, 2 s), and is back in it once it caught up.
        link.blackhole(True)
        try:
            with Producer(brokers=master.address, retry_times_when_send_failed=0) as producer, \
                    pytest.raises(RequestTimeoutError):  # stored on the master, not acknowledged
                producer.send(Message("Replicated", b"not-copied"))
            wait_until(lambda: (s := status()[0])["in_sync_replicas"] == [] and s["replicas"] == 1, 15,
                       "the silent replica out of sync, still connected")
            assert "master (sync, 1 replica(s), in sync: none)" in role()
        finally:
            link.heal()
        wait_until(lambda: status()[0]["in_sync_replicas"] == [1], 30, "the replica in sync again")
    finally:
        link.close()


# -- group update and its enforcement -------------------------------------------------------------------------


def test_group_update_is_a_dry_run_unless_execute_and_checks_its_values(broker, run):
    create_topic(broker.address, "Upd", 1)
    with Admin(brokers=broker.address) as admin:
        admin.update_group_config("upd", retry_max_times=5)
        out = ok(run, "group", "update", "upd", "--retry-max-times", "2", "--consume-enable", "false")
        assert "dry run" in out.splitlines()[-1]
        (row,) = json.loads(ok(run, "group", "update", "upd", "--retry-max-times", "2", "--json"))
        assert row["retry_max_times"] == 2
        assert admin.group_config("upd").retry_max_times == 5 and admin.group_config("upd").consume_enable
        (row,) = json.loads(ok(run, "group", "update", "upd", "--retry-max-times", "2", "--broadcast-enable", "no",
                               "--retry-queue-nums", "3", "--consume-orderly", "true", "--execute", "--json"))
        assert row == {"group": "upd", "consume_enable": True, "broadcast_enable": False, "retry_queue_nums": 3,
                       "retry_max_times": 2, "consume_orderly": True}
        config = admin.group_config("upd")
        assert (config.retry_max_times, config.consume_broadcast_enable, config.retry_queue_nums,
                config.consume_orderly) == (2, False, 3, True)
        fails(run, 2, "group", "update", "upd", "--retry-max-times", "-1", "--execute")
        fails(run, 2, "group", "update", "upd", "--retry-queue-nums", "65", "--execute")
        fails(run, 2, "group", "update", "upd", "--consume-enable", "maybe", "--execute")
        assert "nothing to update" in fails(run, 1, "group", "update", "upd", "--execute")
        assert "bad\\x01name" in fails(run, 1, "group", "update", "bad\x01name", "--retry-max-times", "1",
                                        "--execute")
        assert admin.group_config("upd").retry_max_times == 2


def test_consume_enable_false_stops_deliveries_until_enabled_again(broker, run):
    create_topic(broker.address, "Gate", 1)
    produce(broker.address, "Gate", 2, prefix="before")
    gated, got = receiving(broker.address, "gated", "Gate")
    control, control_got = receiving(broker.address, "control", "Gate")
    try:
        wait_until(lambda: len(got.keys()) == 2 and len(control_got.keys()) == 2, 30, "both groups reading")
        ok(run, "group", "update", "gated", "--consume-enable", "false", "--execute")
        with BrokerStubs(broker.address) as stubs:  # RocketMQ answers such pulls NO_PERMISSION
            with pytest.raises(grpc.RpcError) as e:
                stubs.messaging.PullMessage(messaging_pb2.PullMessageRequest(
                    group="gated", topic="Gate", queue_id=0, queue_offset=0, max_msg_nums=1), timeout=10)
            assert e.value.code() is grpc.StatusCode.PERMISSION_DENIED and "consume_enable" in e.value.details()
        produce(broker.address, "Gate", 5, prefix="during")
        # The control group's stream sees the same appends: once it has them, the gated one had its chance.
        wait_until(lambda: len(control_got.keys()) == 7, 30, "the control group to get the new messages")
        assert [k for k in got.keys() if k.startswith("during")] == []
        ok(run, "group", "update", "gated", "--consume-enable", "true", "--execute")
        wait_until(lambda: sorted(k for k in got.keys() if k.startswith("during")) ==
                   [f"during{i}" for i in range(5)], 60, "the gated group to get them once enabled")
    finally:
        gated.shutdown()
        control.shutdown()


@pytest.mark.parametrize("retry_max_times", [0, 2])
def test_retry_max_times_decides_when_a_message_goes_to_the_dlq(broker, run, retry_max_times):
    group, topic = f"retries{retry_max_times}", f"Retry{retry_max_times}"
    create_topic(broker.address, topic, 1)
    ok(run, "group", "update", group, "--retry-max-times", str(retry_max_times), "--execute")
    deliveries = Received()

    def always_fail(msgs, ctx):
        deliveries.add(msgs)
        return ConsumeConcurrentlyStatus.RECONSUME_LATER

    c = consumer(broker.address, group, topic, always_fail)  # max_reconsume_times -1: the group's setting
    try:
        (msg_id,) = produce(broker.address, topic, 1)

        def dead() -> list:
            with Admin(brokers=broker.address) as admin:
                try:
                    return admin.dead_letters(group)
                except NotFoundError:
                    return []
        wait_until(lambda: dead(), 60, "the message in the DLQ")
        assert [m.msg_id for m in dead()] == [msg_id]
        assert [m.reconsume_times for m in deliveries.messages] == list(range(retry_max_times + 1))
    finally:
        c.shutdown()
    # The msg id finds the original, its retry copies and the dead-letter copy.
    docs = [json.loads(line) for line in ok(run, "message", "get", "--msg-id", msg_id, "--json").splitlines()]
    assert {d["msg_id"] for d in docs} == {msg_id}
    assert docs[0]["stored_topic"] == topic and docs[-1]["stored_topic"] == dlq_topic(group)
    assert len(docs) == retry_max_times + 2


def test_broadcast_enable_false_refuses_broadcasting_consumers(broker, run):
    create_topic(broker.address, "Wide", 1)
    produce(broker.address, "Wide", 3, prefix="first")
    ok(run, "group", "update", "wide", "--broadcast-enable", "false", "--execute")
    control, control_got = receiving(broker.address, "wide-control", "Wide")
    refused, refused_got = receiving(broker.address, "wide", "Wide", message_model=MessageModel.BROADCASTING)
    try:
        wait_until(lambda: len(control_got.keys()) == 3, 30, "the control group to read the topic")
        produce(broker.address, "Wide", 2, prefix="second")
        wait_until(lambda: len(control_got.keys()) == 5, 30, "the control group to get the new messages")
        assert refused_got.keys() == []
        ok(run, "group", "update", "wide", "--broadcast-enable", "true", "--execute")
        wait_until(lambda: len(refused_got.keys()) == 5, 60, "the broadcasting consumer once allowed")
        # A broadcasting consumer already reading is cut off as soon as the setting changes.
        ok(run, "group", "update", "wide", "--broadcast-enable", "false", "--execute")
        produce(broker.address, "Wide", 2, prefix="third")
        wait_until(lambda: len(control_got.keys()) == 7, 30, "the control group to get the third batch")
        assert [k for k in refused_got.keys() if k.startswith("third")] == []
    finally:
        refused.shutdown()
        control.shutdown()


# -- reset-offset: --all-topics, --to-current, --export, --from-file ----------------------------------------------


def test_reset_offset_all_topics_export_and_from_file(broker, run, tmp_path):
    address = broker.address
    for topic in ("PlanA", "PlanB"):
        create_topic(address, topic, 2)
        produce(address, topic, 10, batch=5)
    with Admin(brokers=address) as admin:
        admin.commit("planner", {mq("PlanA", 0): 3, mq("PlanA", 1): 4, mq("PlanB", 0): 5})
    saved = ok(run, "group", "reset-offset", "planner", "--all-topics", "--to-current", "--export")
    assert saved == "PlanA,broker-a,0,3\nPlanA,broker-a,1,4\nPlanB,broker-a,0,5\n"
    rows = json.loads(ok(run, "group", "reset-offset", "planner", "--all-topics", "--to-current", "--json"))
    assert [(r["topic"], r["queue"], r["current_offset"], r["new_offset"]) for r in rows] == [
        ("PlanA", 0, 3, 3), ("PlanA", 1, 4, 4), ("PlanB", 0, 5, 5)]
    # Dry run across every topic: the plan, nothing changed.
    plan = ok(run, "group", "reset-offset", "planner", "--all-topics", "--to-earliest", "--export")
    assert plan == "PlanA,broker-a,0,0\nPlanA,broker-a,1,0\nPlanB,broker-a,0,0\nPlanB,broker-a,1,0\n"
    assert committed(address, "planner", "PlanA") == {0: 3, 1: 4}
    ok(run, "group", "reset-offset", "planner", "--all-topics", "--to-earliest", "--execute")
    assert committed(address, "planner", "PlanA") == {0: 0, 1: 0} and committed(address, "planner", "PlanB") == {
        0: 0, 1: 0}
    # The saved plan, dry run then applied.
    file = tmp_path / "plan.csv"
    file.write_text(saved)
    out = ok(run, "group", "reset-offset", "planner", "--from-file", str(file))
    assert "dry run" in out and committed(address, "planner", "PlanA") == {0: 0, 1: 0}
    ok(run, "group", "reset-offset", "planner", "--from-file", str(file), "--execute")
    assert committed(address, "planner", "PlanA") == {0: 3, 1: 4} and committed(address, "planner", "PlanB") == {
        0: 5, 1: 0}


@pytest.mark.parametrize(("content", "line", "why"), [
    ("PlanC,0,1\nPlanC,zero,1\n", 2, "integers"),
    ("PlanC,0,1\nPlanC,1\n", 2, "expected topic,queue,offset"),
    ("PlanC,0,1\n\nPlanC,7,1\n", 3, "no queue 7"),
    ("PlanC,0,1\nNoSuchTopic,0,1\n", 2, "NoSuchTopic"),
    ("PlanC,0,1\nPlanC,1,999\n", 2, "outside"),
    ("PlanC,0,1\nPlanC,0,2\n", 2, "already on line 1"),
])
def test_reset_offset_from_file_refuses_a_bad_row_by_line_and_changes_nothing(broker, run, tmp_path, content, line,
                                                                               why):
    with Admin(brokers=broker.address) as admin:
        if "PlanC" not in admin.list_topics():
            admin.create_topic("PlanC", 2)
            produce(broker.address, "PlanC", 10, batch=5)
        admin.commit("bad-plan", {mq("PlanC", 0): 4, mq("PlanC", 1): 4})
    file = tmp_path / "bad.csv"
    file.write_text(content)
    message = fails(run, 1, "group", "reset-offset", "bad-plan", "--from-file", str(file), "--execute")
    assert f"line {line}:" in message and why in message
    assert committed(broker.address, "bad-plan", "PlanC") == {0: 4, 1: 4}


def test_reset_offset_usage_errors(run):
    assert "--all-topics" in fails(run, 2, "group", "reset-offset", "g", "--to-earliest")
    fails(run, 2, "group", "reset-offset", "g", "--topic", "T", "--all-topics", "--to-earliest")
    assert "--from-file" in fails(run, 2, "group", "reset-offset", "g", "--topic", "T", "--from-file", "x.csv")
    assert "no offsets" in fails(run, 1, "group", "reset-offset", "no-such-group", "--all-topics", "--to-earliest")


# -- delete-offsets, clone-offset -----------------------------------------------------------------------------------


def test_delete_offsets_removes_one_topic_only_and_is_refused_while_members_subscribe(broker, run):
    address = broker.address
    for topic in ("DelA", "DelB"):
        create_topic(address, topic, 2)
        produce(address, topic, 4, batch=2)
    with Admin(brokers=address) as admin:
        admin.commit("deleter", {mq("DelA", 0): 1, mq("DelA", 1): 2, mq("DelB", 0): 1})
    rows = json.loads(ok(run, "group", "delete-offsets", "deleter", "--topic", "DelA", "--json"))
    assert [(r["queue"], r["current_offset"], r["new_offset"]) for r in rows] == [(0, 1, None), (1, 2, None)]
    assert committed(address, "deleter", "DelA") == {0: 1, 1: 2}
    # A live member subscribed to the topic: refused, nothing changed.
    c, _got = receiving(address, "deleter", "DelA")
    try:
        message = fails(run, 1, "group", "delete-offsets", "deleter", "--topic", "DelA", "--execute")
        assert "live member" in message
        assert committed(address, "deleter", "DelB") == {0: 1, 1: -1}
    finally:
        c.shutdown()
    with Admin(brokers=address) as admin:
        wait_until(lambda: admin.consumer_ids("deleter") == [], 30, "the member to leave")
        admin.commit("deleter", {mq("DelA", 0): 1, mq("DelA", 1): 2})  # whatever the consumer committed
    ok(run, "group", "delete-offsets", "deleter", "--topic", "DelA", "--execute")
    assert committed(address, "deleter", "DelA") == {0: -1, 1: -1}
    assert committed(address, "deleter", "DelB") == {0: 1, 1: -1}
    assert "no offsets" in fails(run, 1, "group", "delete-offsets", "deleter", "--topic", "DelA", "--execute")
    assert "NoSuchTopic" in fails(run, 1, "group", "delete-offsets", "deleter", "--topic", "NoSuchTopic")


def test_clone_offset_gives_the_destination_the_source_offsets(broker, run):
    address = broker.address
    create_topic(address, "Clone", 3)
    produce(address, "Clone", 9, batch=3)
    with Admin(brokers=address) as admin:
        admin.commit("src", {mq("Clone", 0): 2, mq("Clone", 1): 3})
        admin.commit("dest", {mq("Clone", 1): 1, mq("Clone", 2): 1})
    rows = json.loads(ok(run, "group", "clone-offset", "--src-group", "src", "--dest-group", "dest", "--topic",
                         "Clone", "--json"))
    assert [(r["queue"], r["current_offset"], r["new_offset"]) for r in rows] == [(0, -1, 2), (1, 1, 3), (2, 1, None)]
    assert committed(address, "dest", "Clone") == {0: -1, 1: 1, 2: 1}
    ok(run, "group", "clone-offset", "--src-group", "src", "--dest-group", "dest", "--topic", "Clone", "--execute")
    assert committed(address, "dest", "Clone") == {0: 2, 1: 3, 2: -1}
    assert committed(address, "src", "Clone") == {0: 2, 1: 3, 2: -1}
    assert "no offsets" in fails(run, 1, "group", "clone-offset", "--src-group", "nobody", "--dest-group", "dest",
                                 "--topic", "Clone", "--execute")
    assert "same group" in fails(run, 1, "group", "clone-offset", "--src-group", "src", "--dest-group", "src",
                                 "--topic", "Clone", "--execute")
    assert committed(address, "dest", "Clone") == {0: 2, 1: 3, 2: -1}


def test_deleted_and_cloned_offsets_survive_a_kill_9(broker_factory, monkeypatch, capsys):
    """Both changes reach the offset journal before they are answered: a broker killed before its next
    offsets snapshot comes back without the deleted offsets and with the cloned ones."""
    b = broker_factory(args=("--flush-consumer-offset-interval-ms", "3600000"))
    create_topic(b.address, "Durable", 2)
    produce(b.address, "Durable", 6, batch=3)
    with Admin(brokers=b.address) as admin:
        admin.commit("gone", {mq("Durable", 0): 2, mq("Durable", 1): 3})
        admin.commit("model", {mq("Durable", 0): 1})
        admin.commit("copy", {mq("Durable", 1): 1})
        admin.delete_group_offsets("gone", "Durable")
        admin.clone_group_offsets("model", "copy", "Durable")
    b.kill()
    b.start()
    assert committed(b.address, "gone", "Durable") == {0: -1, 1: -1}
    assert committed(b.address, "copy", "Durable") == {0: 1, 1: -1}
    assert committed(b.address, "model", "Durable") == {0: 1, 1: -1}


def test_msg_id_times_and_csv_plans_parse_as_documented():
    from tidemark.broker.delivery.queries import msg_id_time_ms
    from tidemark.broker.errors import InvalidArgumentError as BrokerInvalid
    from tidemark.client.errors import InvalidArgumentError
    from tidemark.client.offset_plan import read_plan

    msg_id = MessageIdGenerator().next()
    assert abs(msg_id_time_ms(msg_id) - time.time() * 1000) < 60_000
    # A RocketMQ 5 client's id: version 01, MAC, pid, seconds since 2021-01-01, sequence.
    assert msg_id_time_ms("01" + "AA" * 6 + "0001" + "00000E10" + "00000007") == 1609459200_000 + 3600_000
    for bad in ("", "xyz", "0" * 32, "02" + "0" * 32, "G" * 32):
        with pytest.raises(BrokerInvalid):
            msg_id_time_ms(bad)
    assert read_plan("T,0,5\n\n T , 1 , 6 \nT,broker-b,2,7\n", "p") == [(1, "T", "", 0, 5), (3, "T", "", 1, 6),
                                                                       (4, "T", "broker-b", 2, 7)]
    with pytest.raises(InvalidArgumentError, match="p line 2"):
        read_plan("T,0,5\nT,0,-1\n", "p")


def test_msg_id_lookup_without_a_topic_shows_only_topics_the_user_may_get(broker_factory):
    from tidemark.client import Admin, Message, NotFoundError, Producer
    from tidemark.common.auth import Credentials

    b = broker_factory(args=("--auth", "--init-user", "op:op-secret-001"))
    op = Credentials("op", "op-secret-001")
    with Admin(brokers=b.address, credentials=op) as admin:
        admin.create_topic("Public", 1)
        admin.create_topic("Secret", 1)
        admin.create_user("monitor", "monitor-secret-1")
        admin.create_acl("monitor", "Cluster", ["Get"], "Allow")
        admin.create_acl("monitor", "Topic:Public", ["Get"], "Allow")
    with Producer(brokers=b.address, credentials=op) as p:
        public = p.send(Message("Public", b"shown")).msg_id
        secret = p.send(Message("Secret", b"hidden")).msg_id
    with Admin(brokers=b.address, credentials=Credentials("monitor", "monitor-secret-1")) as monitor:
        assert [m.body for m in monitor.query_message_by_id(public)] == [b"shown"]
        with pytest.raises(NotFoundError):  # found on the broker, but not the monitor's to see
            monitor.query_message_by_id(secret)
    with Admin(brokers=b.address, credentials=op) as admin:
        assert [m.body for m in admin.query_message_by_id(secret)] == [b"hidden"]


def test_deleted_offsets_do_not_come_back_when_a_replica_reconnects(broker_factory):
    """A master takes back the commits a reconnecting replica holds (failover); offsets an admin deleted
    since must not be among them."""
    master = broker_factory("broker-a", args=("--replication", "sync"))
    replica = broker_factory("broker-a", args=("--broker-id", "1", "--master", master.address))
    create_topic(master.address, "Kept", 1)
    produce(master.address, "Kept", 4)

    def streaming() -> int:
        with Admin(brokers=master.address) as admin:
            return admin.broker_status_at(master.address).replicas

    def on_replica(group: str) -> dict[int, int]:
        try:
            return committed(replica.address, group, "Kept")
        except NotFoundError:
            return {}

    wait_until(lambda: streaming() == 1, 30, "the replica streaming from its master")
    with Admin(brokers=master.address) as admin:
        admin.commit("gone", {mq("Kept", 0): 3})
    wait_until(lambda: on_replica("gone") == {0: 3}, 30, "the commit copied to the replica")
    with Admin(brokers=master.address) as admin:
        admin.delete_group_offsets("gone", "Kept")
    replica.kill()
    wait_until(lambda: streaming() == 0, 30, "the master to see its replica gone")
    def hand_backs() -> int:
        return master.log_text().count("event=offsets_handed_back")

    before = hand_backs()  # (counted before the start: the replica hands its table back as it connects)
    replica.start()
    wait_until(lambda: streaming() == 1, 30, "the replica back")
    wait_until(lambda: hand_backs() > before, 30, "the replica's table handed back to the master")

    def copied() -> bool:  # (it answers offset queries once its first mirror copied the master's)
        try:
            on_replica("gone")
        except NotMasterError:
            return False
        return True

    wait_until(copied, 30, "the replica to answer offset queries")
    assert on_replica("gone") == {0: 3}, "the replica still held the deleted entry when it handed its table back"
    assert committed(master.address, "gone", "Kept") == {0: -1}
