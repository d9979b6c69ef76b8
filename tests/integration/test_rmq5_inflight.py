"""A pop group's deliveries under way (RocketMQ 5 clients over raw stubs): what the broker's group
description and `tidemark group progress/describe` say is in flight, how a stuck consumer (messages
coming back after their invisible time again and again) shows apart from a slow one, and a message's
journey through the pop retry topic."""

from __future__ import annotations

import json
import time
import urllib.request

import grpc
import pytest
from brokerproc import BrokerProcess, free_port
from google.protobuf.duration_pb2 import Duration
from rmq5lib import Rmq5Stub, resource
from workload import create_topic, metric, produce

from tidemark.client import Admin
from tidemark.client.cli.main import main as cli
from tidemark.client.console.server import Console, ConsoleSettings
from tidemark.client.journey import trace_message
from tidemark.client.settings import ClientSettings
from tidemark.rmq5.v2 import messaging_pb2 as pb


@pytest.fixture(scope="module")
def module_broker(tmp_path_factory):
    """One broker for the module, with its metrics endpoint (the pop in-flight gauges)."""
    port = free_port()
    b = BrokerProcess(tmp_path_factory.mktemp("inflight") / "data", args=("--metrics-port", str(port))).start()
    b.metrics_port = port
    yield b
    b.kill()


def pop_gauge(broker, name: str, group: str, topic: str) -> float:
    return metric(broker.metrics_port, f"tidemark_pop_{name}", group=group, topic=topic, queue="0")


@pytest.fixture(scope="module")
def stub(module_broker):
    channel = grpc.insecure_channel(module_broker.address)
    yield Rmq5Stub(channel)
    channel.close()


def receive(stub, group: str, topic: str, batch: int, *, poll_s: float = 0.1, invisible_s: int = 30) -> list:
    answers = stub.ReceiveMessage(pb.ReceiveMessageRequest(
        group=resource(group), message_queue=pb.MessageQueue(topic=resource(topic)), batch_size=batch,
        invisible_duration=Duration(seconds=invisible_s), long_polling_timeout=Duration(nanos=int(poll_s * 1e9))))
    return [a.message for a in answers if a.HasField("message")]


def ack(stub, group: str, topic: str, m) -> None:
    answer = stub.AckMessage(pb.AckMessageRequest(group=resource(group), topic=resource(topic), entries=[
        pb.AckMessageEntry(message_id=m.system_properties.message_id,
                           receipt_handle=m.system_properties.receipt_handle)]))
    assert answer.status.code == pb.OK, answer.status


def give_up(stub, group: str, topic: str, m) -> None:
    """What a stuck consumer amounts to, without waiting out 10 s of invisible time: visible again now."""
    answer = stub.ChangeInvisibleDuration(pb.ChangeInvisibleDurationRequest(
        group=resource(group), topic=resource(topic), receipt_handle=m.system_properties.receipt_handle,
        invisible_duration=Duration(seconds=0), message_id=m.system_properties.message_id))
    assert answer.status.code == pb.OK, answer.status


def receive_again(stub, group: str, topic: str) -> list:
    """The message given up, once the broker's revive scan made it visible again (every 0.5 s)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if got := receive(stub, group, topic, 1, poll_s=1):
            return got
    raise AssertionError("the message given up was not delivered again within 10 s")


def pop_queues(address: str, group: str) -> dict[str, object]:
    with Admin(brokers=address) as admin:
        return {f"{p.queue.topic}/{p.queue.queue_id}": p for p in admin.describe_group(group).pop_queues}


def console_group(address: str, group: str) -> dict:
    """The console's view of a group (its /api/groups/NAME document)."""
    console = Console(ClientSettings(brokers=address), ConsoleSettings(port=0, sample_interval_s=60)).start()
    try:
        host, port = console.address
        with urllib.request.urlopen(f"http://{host}:{port}/api/groups/{group}", timeout=10) as resp:
            return json.loads(resp.read())
    finally:
        console.shutdown()


def run_cli(capsys, *args: str) -> str:
    capsys.readouterr()
    assert cli(list(args)) == 0
    return capsys.readouterr().out


def test_received_messages_are_in_flight_until_acked(module_broker, stub, capsys):
    create_topic(module_broker.address, "V2Inflight", 1)
    produce(module_broker.address, "V2Inflight", 5)
    before = int(time.time() * 1000)
    got = receive(stub, "v2-inflight", "V2Inflight", 3)
    assert len(got) == 3
    p = pop_queues(module_broker.address, "v2-inflight")["V2Inflight/0"]
    assert (p.inflight, p.redelivered, p.max_attempt, p.overdue, p.pending_redelivery) == (3, 0, 1, 0, 0)
    assert before <= p.oldest_received_ms <= int(time.time() * 1000)
    assert p.oldest_received_ms + 30_000 == p.earliest_invisible_until_ms <= p.latest_invisible_until_ms
    assert pop_gauge(module_broker, "inflight_messages", "v2-inflight", "V2Inflight") == 3
    assert 0 <= pop_gauge(module_broker, "inflight_oldest_age_seconds", "v2-inflight", "V2Inflight") < 30
    doc = console_group(module_broker.address, "v2-inflight")
    assert doc["pop_state"] == "slow"
    assert [(r["topic"], r["queue"], r["inflight"], r["redelivered"], r["waiting"]) for r in doc["pop"]] == [
        ("V2Inflight", 0, 3, 0, 2)]

    # Nothing acked yet, so no committed offset: progress still shows the queue, with what is in flight.
    [row] = json.loads(run_cli(capsys, "group", "progress", "v2-inflight", "--broker", module_broker.address,
                               "--json"))
    assert (row["topic"], row["inflight"], row["redelivered"], row["max_attempt"]) == ("V2Inflight", 3, 0, 1)
    assert (row["waiting"], row["pop"]) == (2, "slow") and 25 <= row["next_visible_s"] <= 30

    ack(stub, "v2-inflight", "V2Inflight", got[0])  # the oldest: the committed offset moves past it
    table = run_cli(capsys, "group", "progress", "v2-inflight", "--broker", module_broker.address)
    assert "INFLIGHT" in table and "in flight 2 (0 redelivered, 0 past their invisible time): slow" in table
    [row] = json.loads(run_cli(capsys, "group", "progress", "v2-inflight", "--broker", module_broker.address,
                               "--json"))
    assert (row["consumer_offset"], row["lag"], row["inflight"], row["pop"]) == (1, 4, 2, "slow")

    for m in got[1:]:
        ack(stub, "v2-inflight", "V2Inflight", m)
    p = pop_queues(module_broker.address, "v2-inflight")["V2Inflight/0"]
    assert (p.inflight, p.oldest_received_ms, p.earliest_invisible_until_ms) == (0, 0, 0)
    assert pop_gauge(module_broker, "inflight_messages", "v2-inflight", "V2Inflight") == 0
    described = json.loads(run_cli(capsys, "group", "describe", "v2-inflight", "--broker", module_broker.address,
                                   "--json"))[0]
    assert described["pop"] == "idle" and described["queues"][0]["inflight"] == 0


def test_a_consumer_that_never_acks_shows_stuck_by_its_redeliveries(module_broker, stub, capsys):
    group, topic = "v2-stuck", "V2Stuck"
    retry = f"%RETRY%{group}_{topic}"
    create_topic(module_broker.address, topic, 1)
    produce(module_broker.address, topic, 1)
    [m] = receive(stub, group, topic, 1)
    for attempt in (2, 3):
        give_up(stub, group, topic, m)  # past its invisible time: the broker delivers it again
        [m] = receive_again(stub, group, topic)
        assert m.system_properties.delivery_attempt == attempt
        p = pop_queues(module_broker.address, group)[f"{retry}/0"]
        assert (p.inflight, p.redelivered, p.max_attempt) == (1, 1, attempt)
        assert pop_gauge(module_broker, "redelivered_messages", group, retry) == 1
    out = json.loads(run_cli(capsys, "group", "progress", group, "--topic", topic, "--broker",
                             module_broker.address, "--json"))
    by_topic = {r["topic"]: r for r in out}
    assert by_topic[retry]["pop"] == "stuck" and by_topic[retry]["max_attempt"] == 3
    assert by_topic[topic]["inflight"] == 0  # the original is done: it moved to the retry topic
    table = run_cli(capsys, "group", "describe", group, "--broker", module_broker.address)
    assert "in flight 1 (1 redelivered, 0 past their invisible time): stuck" in table

    ack(stub, group, topic, m)
    assert all(p.inflight == 0 for p in pop_queues(module_broker.address, group).values())


def test_the_journey_of_a_pop_message_shows_its_retry_and_where_it_is(module_broker, stub, capsys):
    """A delivery left past its invisible time goes back through the pop retry topic (%RETRY%GROUP_TOPIC):
    the message's journey shows it as a retried step with its delivery, searched with --topic too."""
    group, topic = "v2-journey", "V2Journey"
    retry = f"%RETRY%{group}_{topic}"
    create_topic(module_broker.address, topic, 1)
    [msg_id] = produce(module_broker.address, topic, 1)
    [m] = receive(stub, group, topic, 1)
    give_up(stub, group, topic, m)
    [m] = receive_again(stub, group, topic)
    with Admin(brokers=module_broker.address) as admin:
        held = trace_message(admin, msg_id, topic)
        ack(stub, group, topic, m)
        done = trace_message(admin, msg_id)  # every topic searched
    assert [(s.step, s.topic) for s in held.steps] == [
        ("sent", topic), ("stored", topic), ("delivered", topic), ("failed", topic),
        ("retried", retry), ("delivered", retry), ("in-flight", retry)]
    assert held.steps[4].detail == "attempt 2" and held.steps[4].group == group
    assert {s.client for s in held.steps if s.step in ("delivered", "failed")} == {stub.client_id}
    assert [s.step for s in done.steps][-1] == "consumed" and done.steps[-1].topic == retry
    out = run_cli(capsys, "message", "trace", msg_id, "--topic", topic, "--broker", module_broker.address)
    assert [line.split()[0] for line in out.splitlines()[2:]] == [
        "sent", "stored", "delivered", "failed", "retried", "delivered", "consumed"], out
