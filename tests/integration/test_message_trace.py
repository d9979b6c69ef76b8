"""Message traces: a message's send and consume spans share one trace through its traceparent property
(OpenTelemetry's in-memory exporter), and `tidemark message trace` shows its journey from what the broker
recorded: sent, stored, consumed, and for a message that keeps failing retried and dead-lettered."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from brokerproc import BrokerProcess
from opentelemetry.trace import SpanKind
from recorded_spans import recording_provider
from test_admin_parity import consumer
from workload import create_topic, queue, wait_until

from tidemark.client import (
    Admin,
    ConsumeConcurrentlyStatus,
    InvalidArgumentError,
    Message,
    NotFoundError,
    Producer,
    tracing,
)
from tidemark.client.cli.main import main
from tidemark.client.console.server import Console, ConsoleSettings
from tidemark.client.journey import trace_message
from tidemark.client.settings import ClientSettings

# Level n waits n * 100 ms: a retry comes 300 ms after the failure.
LEVELS = " ".join(f"{n * 100}ms" for n in range(1, 19))


@pytest.fixture(scope="module")
def trace_broker(tmp_path_factory):
    # Store spans as JSON in the broker's log, exported within 50 ms.
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    b = BrokerProcess(tmp_path_factory.mktemp("trace-broker") / "data", args=("--delay-levels", LEVELS),
                      env=env).start()
    yield b
    b.kill()


@pytest.fixture
def exporter():
    spans, provider = recording_provider()
    tracing.enable(provider)
    yield spans, provider
    tracing.disable()


@pytest.fixture
def cli(monkeypatch, capsys):
    """cli(address, *args) -> (exit code, stdout, stderr) of `tidemark ARGS --broker ADDRESS`, in this process."""
    monkeypatch.setattr("tidemark.client.cli.main.setup_logging", lambda *a, **k: None)
    for name in ("TIDEMARK_BROKER", "TIDEMARK_NAMESRV", "TIDEMARK_ACCESS_KEY", "TIDEMARK_SECRET_KEY"):
        monkeypatch.delenv(name, raising=False)

    def run(address: str, *args: str) -> tuple[int, str, str]:
        code = main([*args, "--broker", address])
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


def test_spans_share_one_trace_and_the_journey_shows_consumed_retried_and_dead_lettered(trace_broker, exporter, cli):
    spans, provider = exporter
    address = trace_broker.address
    create_topic(address, "Jobs", 1)

    def listener(msgs, ctx):
        return (ConsumeConcurrentlyStatus.RECONSUME_LATER if msgs[0].body == b"poison"
                else ConsumeConcurrentlyStatus.CONSUME_SUCCESS)

    c = consumer(address, "jobs", "Jobs", listener, max_reconsume_times=1)
    try:
        with Producer(brokers=address) as p:
            with provider.get_tracer("app").start_as_current_span("checkout") as checkout:
                traced = p.send(Message("Jobs", b"order-1", tags="paid"))
            wait_until(lambda: any(s.name == "Jobs process" for s in spans.get_finished_spans()), 20,
                       "the consumer's process span")
            tracing.disable()  # from here on nothing is traced: no property, no span
            poison = p.send(Message("Jobs", b"poison")).msg_id
            good = p.send(Message("Jobs", b"fine", keys="k1")).msg_id
        with Admin(brokers=address) as admin:
            wait_until(lambda: _dead(admin, "jobs") == [poison], 20, "the poison message in the DLQ")
            wait_until(lambda: [s.consumer_offset for s in admin.consume_stats("jobs", "Jobs")] == [3], 10,
                       "the group's offset past all three")
            assert [("traceparent" in admin.view_message(queue("Jobs", 0), i).properties) for i in range(3)] == [
                True, False, False]
            poison_journey = trace_message(admin, poison, "Jobs")
            traced_journey = trace_message(admin, traced.msg_id, "Jobs")
            with pytest.raises(InvalidArgumentError, match="give the topic the message was sent to"):
                trace_message(admin, poison, "%DLQ%jobs")
            with pytest.raises(NotFoundError, match="no message with msg id"):
                trace_message(admin, traced.msg_id[:28] + "FFFF", "Jobs")  # no such message
        table = cli(address, "message", "trace", good)  # without --topic: every topic is searched
        bad = cli(address, "message", "trace", "nonsense", "--topic", "Jobs")
        client_id = c.client_id
    finally:
        c.shutdown()

    # The send (under the caller's span) and the consumption are one trace; the broker's journey names it.
    by_name = {s.name: s for s in spans.get_finished_spans()}
    assert set(by_name) == {"checkout", "Jobs publish", "Jobs process"}, by_name  # nothing after disable()
    publish, process = by_name["Jobs publish"], by_name["Jobs process"]
    trace_id = checkout.get_span_context().trace_id
    assert {publish.context.trace_id, process.context.trace_id} == {trace_id}
    assert publish.kind is SpanKind.PRODUCER and publish.parent.span_id == checkout.get_span_context().span_id
    assert process.kind is SpanKind.CONSUMER and process.parent.span_id == publish.context.span_id
    assert publish.attributes["messaging.system"] == "rocketmq"
    assert publish.attributes["messaging.message.id"] == process.attributes["messaging.message.id"] == traced.msg_id
    assert process.attributes["messaging.rocketmq.client_group"] == "jobs"
    # The broker's store span (OTEL_TRACES_EXPORTER=console) is a child of the publish span: the same trace.
    wait_until(lambda: '"name": "Jobs store"' in trace_broker.log_text(), 10, "the broker's store span")
    store = _exported(trace_broker.log_text(), "Jobs store")
    assert store["context"]["trace_id"] == f"0x{trace_id:032x}"
    assert store["parent_id"] == f"0x{publish.context.span_id:016x}"
    assert store["attributes"]["messaging.message.id"] == traced.msg_id
    assert tracing.parse_traceparent(traced_journey.traceparent) == (
        f"{trace_id:032x}", f"{publish.context.span_id:016x}")
    assert traced_journey.trace_id == f"{trace_id:032x}" and poison_journey.trace_id == ""

    steps = poison_journey.steps
    assert [(s.step, s.topic, s.group) for s in steps] == [
        ("sent", "Jobs", ""), ("stored", "Jobs", ""), ("delivered", "Jobs", "jobs"), ("failed", "Jobs", "jobs"),
        ("retried", "%RETRY%jobs", "jobs"), ("delivered", "%RETRY%jobs", "jobs"), ("failed", "%RETRY%jobs", "jobs"),
        ("dead-lettered", "%DLQ%jobs", "jobs")]
    assert steps[4].detail == "attempt 2" and steps[4].at_ms > 0
    assert steps[7].detail == "after 2 failed deliveries"
    # The broker recorded each delivery: to this consumer, after the store, in order.
    assert [s.client for s in steps if s.step == "delivered"] == [client_id, client_id]
    assert steps[1].at_ms <= steps[2].at_ms <= steps[4].at_ms <= steps[5].at_ms

    code, out, err = table
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"msg id {good}  topic Jobs  trace id - (no traceparent)"
    assert [line.split()[0] for line in lines[2:]] == ["sent", "stored", "delivered", "consumed"], out
    assert client_id in lines[-1] and "keys=k1" in out  # the client holding the queue
    code, out, err = bad
    assert code == 1 and out == "" and len(err.splitlines()) == 1 and "malformed" in err, bad

    # The console's message page asks for the same journey.
    console = Console(ClientSettings(brokers=address), ConsoleSettings(port=0, sample_interval_s=60)).start()
    try:
        doc = _get(console, f"/api/messages/trace?msg_id={poison}&topic=Jobs")
        assert [s["step"] for s in doc["steps"]] == [s.step for s in poison_journey.steps]
        with pytest.raises(urllib.error.HTTPError) as refused:
            _get(console, "/api/messages/trace?topic=Jobs")
        assert refused.value.code == 400 and json.loads(refused.value.read()) == {"error": "a msg id is required"}
    finally:
        console.shutdown()


def _exported(log: str, name: str) -> dict:
    """The span `name` among the JSON objects a console exporter wrote into a log."""
    decoder = json.JSONDecoder()
    at = log.index(f'"name": "{name}"')
    start = log.rindex("{", 0, at)
    return decoder.raw_decode(log, start)[0]


def _get(console: Console, path: str) -> dict:
    host, port = console.address
    with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=10) as resp:
        return json.loads(resp.read())


def _dead(admin: Admin, group: str) -> list[str]:
    try:
        return [m.msg_id for m in admin.dead_letters(group, 10)]
    except NotFoundError:
        return []
