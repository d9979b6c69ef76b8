"""Consumer defects found in review, each reproduced against a real broker (and the real CLI)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading

import forkserver
import grpc
import pytest
from brokerproc import BrokerStubs, orphan_safe
from workload import create_topic, produce, wait_until

from tidemark.client import (
    Admin,
    ConsumeConcurrentlyStatus,
    Message,
    MessageQueue,
    Producer,
    PushConsumer,
)
from tidemark.v1 import common_pb2, membership_pb2, messaging_pb2


def lag(address: str, group: str, topic: str) -> tuple[int, int]:
    with Admin(brokers=address) as admin:
        stats = admin.consume_stats(group, topic)
    return sum(s.lag for s in stats), sum(max(s.consumer_offset, 0) for s in stats)


def cli(address: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return forkserver.run([sys.executable, "-m", "tidemark.client.cli.main", *args, "--broker", address],
                          capture_output=True, text=True, timeout=timeout)


def test_a_group_that_filters_by_tag_reaches_lag_zero(broker):
    create_topic(broker.address, "Orders", 1)
    with Producer(brokers=broker.address) as p:
        for tag in ("paid", "shipped", "shipped"):
            p.send(Message("Orders", tag.encode(), tags=tag))
    seen = []
    c = PushConsumer(group="payments", brokers=broker.address, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     persist_consumer_offset_interval_s=0.2)
    c.subscribe("Orders", "paid")
    c.register_message_listener(lambda msgs, ctx: (seen.extend(msgs), ConsumeConcurrentlyStatus.CONSUME_SUCCESS)[1])
    c.start()
    try:
        wait_until(lambda: lag(broker.address, "payments", "Orders") == (0, 3), 15,
                   "the group's offset past the filtered messages")
    finally:
        c.shutdown()
    assert [m.tags for m in seen] == ["paid"]
    assert lag(broker.address, "payments", "Orders") == (0, 3)  # and it stays there after shutdown


def test_consume_into_head_stops_cleanly_and_commits_only_what_was_printed(broker):
    create_topic(broker.address, "Orders", 1)
    produce(broker.address, "Orders", 1000, batch=100)
    command = (f"{sys.executable} -m tidemark.client.cli.main consume Orders --group g --from-where first --count 1000 "
               f"--broker {broker.address} | head -2")
    out = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == 2
    assert "Traceback" not in out.stderr and "BrokenPipeError" not in out.stderr, out.stderr
    with Admin(brokers=broker.address) as admin:
        committed = admin.committed("g", MessageQueue("Orders", "broker-a", 0))
        retry = [t for t in admin.list_topics(include_system=True) if t == "%RETRY%g"]
        retried = sum(h - lo for lo, h in admin.offsets(admin.fetch_message_queues("%RETRY%g")).values()) \
            if retry else 0
    assert 2 <= committed < 1000, committed  # what reached the pipe, not the whole topic
    assert retried == 0


def test_consume_count_one_prints_exactly_one_message_every_time(broker):
    create_topic(broker.address, "Orders", 4)
    produce(broker.address, "Orders", 400, batch=20)
    for i in range(5):
        out = cli(broker.address, "consume", "Orders", "--group", f"fresh-{i}", "--from-where", "first",
                  "--count", "1")
        assert out.returncode == 0, out.stderr
        assert len(out.stdout.splitlines()) == 1, out.stdout
        assert "Traceback" not in out.stderr, out.stderr
        assert lag(broker.address, f"fresh-{i}", "Orders")[1] == 1  # exactly the printed one is committed


def test_port_zero_advertises_the_port_it_picked(tmp_path):
    log = tmp_path / "broker.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(orphan_safe([sys.executable, "-m", "tidemark.broker.app", "--data-dir", str(tmp_path / "d"),
                                             "--port", "0"]), stdout=f, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "event=broker_ready" in log.read_text(), 30, "the broker to start")
        port = int(re.search(r"event=broker_ready .*port=(\d+)", log.read_text()).group(1))
        address = f"127.0.0.1:{port}"
        create_topic(address, "T", 1)
        with Admin(brokers=address) as admin:
            assert admin.route("T").queue_datas[0].broker_addr == address
            assert admin.brokers()[0].broker_addr == address
    finally:
        proc.kill()
        proc.wait()


def test_consume_enable_and_broadcast_enable_are_enforced(broker):
    create_topic(broker.address, "Orders", 1)
    produce(broker.address, "Orders", 3)
    with Admin(brokers=broker.address) as admin:
        admin.commit("closed", {MessageQueue("Orders", "broker-a", 0): 0})  # the group exists
        admin.update_group_config("closed", consume_enable=False, consume_broadcast_enable=False)
    with BrokerStubs(broker.address) as stubs:
        with pytest.raises(grpc.RpcError) as e:
            stubs.messaging.PullMessage(messaging_pb2.PullMessageRequest(group="closed", topic="Orders", queue_id=0,
                                                                         queue_offset=0), timeout=10)
        assert e.value.code() is grpc.StatusCode.PERMISSION_DENIED and "consume_enable" in e.value.details()
        call = stubs.messaging.Fetch(iter([messaging_pb2.FetchRequest(open=messaging_pb2.FetchOpen(
            handle=1, group="closed", topic="Orders", queue_id=0, credit_messages=5, credit_bytes=10**6))]),
            timeout=10)
        ended = next(call).ended[0]
        call.cancel()
        assert ended.code == grpc.StatusCode.PERMISSION_DENIED.value[0] and "consume_enable" in ended.error
        with pytest.raises(grpc.RpcError) as e:
            stubs.membership.Heartbeat(membership_pb2.HeartbeatRequest(
                client_id="c1", group="closed", message_model=common_pb2.BROADCASTING), timeout=10)
        assert e.value.code() is grpc.StatusCode.PERMISSION_DENIED and "BROADCASTING" in e.value.details()


def test_settings_given_as_names_start_and_consume(broker):
    create_topic(broker.address, "Orders", 2)
    produce(broker.address, "Orders", 10)
    got = threading.Event()
    c = PushConsumer(group="named", brokers=broker.address, message_model="CLUSTERING",
                     allocate_strategy="AVG_BY_CIRCLE", consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    c.subscribe("Orders")
    c.register_message_listener(lambda msgs, ctx: (got.set(), ConsumeConcurrentlyStatus.CONSUME_SUCCESS)[1])
    c.start()
    try:
        assert got.wait(15)
    finally:
        c.shutdown()


def test_cli_consume_has_no_python_warnings_about_closed_pipes(broker):
    """`| head -1` on a plain (group-less) consume exits quietly too."""
    create_topic(broker.address, "Orders", 1)
    produce(broker.address, "Orders", 50)
    env = {**os.environ}
    out = subprocess.run(["bash", "-c", f"{sys.executable} -m tidemark.client.cli.main consume Orders --count 50 "
                                        f"--broker {broker.address} | head -1"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0 and len(out.stdout.splitlines()) == 1
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr
