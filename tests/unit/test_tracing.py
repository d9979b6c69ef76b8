"""Message traces without a broker: the traceparent parser, the spans of sends and deliveries (OpenTelemetry's
in-memory exporter), the journey built from a message's copies and its groups' offsets, and that nothing
imports OpenTelemetry unless tracing is enabled."""

from __future__ import annotations

import ast
import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
from opentelemetry.trace import SpanKind, StatusCode
from recorded_spans import recording_provider

from tidemark.broker.config import BrokerConfig
from tidemark.broker.controller import BrokerController
from tidemark.broker.observe import traces
from tidemark.broker.observe.journey import DeliveryLog
from tidemark.broker.operations import OutgoingMessage
from tidemark.broker.services.rmq5 import convert
from tidemark.broker.store import StoredMessage
from tidemark.client import (
    ConsumeConcurrentlyStatus,
    Message,
    MessageExt,
    MessageQueue,
    PushConsumerSettings,
    SendResult,
    tracing,
)
from tidemark.client.journey import GroupFacts, journey
from tidemark.client.types import Delivery
from tidemark.common.records import RecordBatchBuilder, encode_properties
from tidemark.rmq5.v2 import messaging_pb2 as rmq5

ROOT = Path(__file__).resolve().parents[2]
TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def spans():
    exporter, provider = recording_provider()
    tracing.enable(provider)
    yield exporter
    tracing.disable()


def ext(topic: str, offset: int, *, props: dict | None = None, reconsume: int = 0, stored: int = 1000,
        msg_id: str = "AB" * 16) -> MessageExt:
    return MessageExt(topic, "broker-a", 0, offset, msg_id, b"x", properties=props or {}, born_timestamp=stored - 1,
                      store_timestamp=stored, reconsume_times=reconsume, born_host="10.0.0.1")


SETTINGS = PushConsumerSettings(group="billing", brokers="127.0.0.1:1", instance_name="7")


@pytest.mark.parametrize("value, parsed", [
    (TP, ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")),
    (TP.upper(), ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")),
    ("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-later", ("0af7651916cd43dd8448eb211c80319c",
                                                                      "b7ad6b7169203331")),
    ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra", None),  # version 00 has 4 parts
    ("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None),
    ("00-00000000000000000000000000000000-b7ad6b7169203331-01", None),
    ("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", None),
    ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01", None),
    ("00-0af7651916cd43dd8448eb211c8031_c-b7ad6b7169203331-01", None),
    ("00-zzf7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None),
    ("", None),
])
def test_parse_traceparent(value, parsed):
    assert tracing.parse_traceparent(value) == parsed


def test_a_send_carries_its_publish_spans_context_and_a_failed_send_is_an_error(spans):
    sent = []

    def send(messages, **kw):
        sent.extend(messages)
        return [SendResult("ID1", MessageQueue("Orders", "broker-a", 2), 41)]

    tracing.send_traced(send, [Message("Orders", b"x", tags="paid", properties={"a": "1"})], SETTINGS)
    [span] = spans.get_finished_spans()
    assert span.name == "Orders publish" and span.kind is SpanKind.PRODUCER
    assert tracing.parse_traceparent(sent[0].properties["traceparent"]) == (
        f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}")
    assert sent[0].properties["a"] == "1" and sent[0].tags == "paid"
    assert span.attributes["messaging.message.id"] == "ID1"
    assert span.attributes["messaging.destination.partition.id"] == "2"
    assert span.attributes["messaging.rocketmq.message.tag"] == "paid"

    def refuse(messages, **kw):
        raise RuntimeError("refused")

    with pytest.raises(RuntimeError):
        tracing.send_traced(refuse, [Message("Orders", b"x")], SETTINGS)
    assert spans.get_finished_spans()[-1].status.status_code is StatusCode.ERROR


def test_a_batch_listener_call_links_every_message_and_a_failure_is_an_error(spans):
    other = "00-1af7651916cd43dd8448eb211c80319c-c7ad6b7169203331-01"
    listener = tracing.traced_listener(lambda msgs, ctx: ConsumeConcurrentlyStatus.RECONSUME_LATER, SETTINGS)
    assert listener([ext("Orders", 1, props={"traceparent": TP}), ext("Orders", 2, props={"traceparent": other}),
                     ext("Orders", 3)], None) is ConsumeConcurrentlyStatus.RECONSUME_LATER
    [span] = spans.get_finished_spans()
    assert span.name == "Orders process" and span.kind is SpanKind.CONSUMER and span.parent is None
    assert sorted(f"{link.context.trace_id:032x}" for link in span.links) == [
        "0af7651916cd43dd8448eb211c80319c", "1af7651916cd43dd8448eb211c80319c"]
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["messaging.batch.message_count"] == 3


def test_a_polled_message_gets_a_receive_span_in_its_trace(spans):
    tracing.received([ext("Orders", 5, props={"traceparent": TP}), ext("Orders", 6, props={"traceparent": "junk"})],
                     SETTINGS)
    first, second = spans.get_finished_spans()
    assert first.name == "Orders receive" and first.kind is SpanKind.CONSUMER
    assert f"{first.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert first.parent.span_id == 0xb7ad6b7169203331
    assert second.parent is None  # a malformed traceparent starts a trace of its own
    assert first.attributes["tidemark.queue.offset"] == 5


def test_journey_of_a_message_retried_then_dead_lettered_by_one_group_and_pending_for_another():
    original = ext("Orders", 7, props={"traceparent": TP, "PGROUP": "shop"}, stored=1000)
    retry = ext("%RETRY%billing", 0, reconsume=1, stored=2000)
    dead = ext("%DLQ%billing", 0, reconsume=2, stored=3000)
    q = ("Orders", "broker-a", 0)
    billing = GroupFacts("billing", {q: 8, ("%RETRY%billing", "broker-a", 0): 1}, {q: "10.0.0.2@1"},
                         copies=(retry, dead))
    audit = GroupFacts("audit", {q: 7}, {}, {q: 3})
    late = GroupFacts("late", {}, {})
    steps = journey(original, [billing, audit, late]).steps
    assert [(s.step, s.topic, s.group, s.at_ms) for s in steps] == [
        ("sent", "Orders", "", 999), ("stored", "Orders", "", 1000),
        ("failed", "Orders", "billing", 0), ("retried", "%RETRY%billing", "billing", 2000),
        ("failed", "%RETRY%billing", "billing", 0), ("dead-lettered", "%DLQ%billing", "billing", 3000),
        ("in-flight", "Orders", "audit", 0), ("pending", "Orders", "late", 0)]
    assert steps[0].detail == "producer group shop" and steps[2].client == "10.0.0.2@1"
    assert steps[3].detail == "attempt 2" and steps[3].queue == "broker-a:0@0"
    assert steps[-1].detail == "not consumed yet: the group's committed offset is none"
    assert journey(original, []).trace_id == "0af7651916cd43dd8448eb211c80319c"
    requeued = journey(original, [], [ext("Orders", 9, stored=5000)]).steps[-1]
    assert (requeued.step, requeued.queue, requeued.at_ms) == ("requeued", "broker-a:0@9", 5000)
    consumed = journey(original, [GroupFacts("audit", {q: 8}, {q: "c1"})]).steps[-1]
    assert (consumed.step, consumed.client) == ("consumed", "c1")
    reads = {(*q, 7): [Delivery("other", "c9", 1500, 0, 10), Delivery("audit", "c2", 1600, 5, 8)]}
    *_, delivered, consumed = journey(original, [GroupFacts("audit", {q: 8}, {q: "c1"})], deliveries=reads).steps
    assert (delivered.step, delivered.client, delivered.at_ms, delivered.detail) == (
        "delivered", "c2", 1600, "read of offsets 5..7")
    assert (consumed.step, consumed.client) == ("consumed", "c2")  # who got it, not who holds the queue now


def test_the_broker_keeps_the_recent_deliveries_of_each_queue():
    log = DeliveryLog(recent=3)
    log.record("T", 0, "g", "c1", 0, 4, 100)
    log.record("T", 0, "", "c1", 0, 4, 100)  # a group-less read is no delivery
    log.record("T", 0, "g", "c1", 4, 4, 100)  # nor one that handed nothing out
    log.record("T", 1, "g", "c2", 0, 9, 110)
    log.record("T", 0, "h", "c3", 2, 6, 120)
    assert [(d.group, d.client_id) for d in log.of("T", 0, 3)] == [("g", "c1"), ("h", "c3")]
    assert log.of("T", 0, 6) == [] and log.of("U", 0, 0) == []
    for i in range(3):
        log.record("T", 0, "g", "c4", 10 + i, 11 + i, 200 + i)
    assert log.of("T", 0, 3) == []  # the oldest went


def test_no_module_imports_opentelemetry_when_it_is_imported():
    """OpenTelemetry is an optional extra: only enable() (and the broker's opt-in store spans) import it, inside
    a function; a module-level import anywhere would make every client need it."""
    offenders = []
    for folder in ("client", "common", "broker", "spark_connector"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text("utf-8")
            if "opentelemetry" not in text:
                continue
            for node in ast.parse(text).body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    continue
                for inner in ast.walk(node):
                    names = ([a.name for a in inner.names] if isinstance(inner, ast.Import)
                             else [inner.module or ""] if isinstance(inner, ast.ImportFrom) else [])
                    if any(n.split(".")[0] == "opentelemetry" for n in names):
                        offenders.append(f"{path.relative_to(ROOT)}:{inner.lineno}")
    assert offenders == []
    assert tracing.ENABLED is False  # until enable()


def test_broker_store_spans_join_the_trace_each_record_carries(monkeypatch):
    exporter, provider = recording_provider()
    monkeypatch.setattr(traces, "_spans", traces._StoreSpans(provider, "broker-b"))
    builder = RecordBatchBuilder("Orders")
    for props in ({"traceparent": TP}, {}, {"traceparent": TP}, {"traceparent": "junk"}):
        builder.append(b"x", encode_properties({"UNIQ_KEY": "ID", **props}))
    traces.stored_records("Orders", 1, bytes(builder.buffer), 4, 40, ["A", "B", "C", "D"], 1, 2)
    [span] = exporter.get_finished_spans()  # one per traceparent; none for a malformed one
    assert span.name == "Orders store" and span.parent.span_id == 0xb7ad6b7169203331
    assert f"{span.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert (span.attributes["tidemark.queue.offset"], span.attributes["messaging.batch.message_count"]) == (40, 2)
    traces.stored_messages("Orders", [({"traceparent": TP}, 2, 7, "E"), ({}, 2, 8, "F")], 3, 4)
    assert exporter.get_finished_spans()[-1].attributes["messaging.message.id"] == "E"
    assert len(exporter.get_finished_spans()) == 2


@pytest.mark.parametrize("value, on", [("", False), ("none", False), ("zipkin", False), ("none,console", True)])
def test_broker_store_spans_are_on_only_when_an_exporter_is_named(value, on):
    try:
        assert traces.configure("broker-a", env={"OTEL_TRACES_EXPORTER": value}) is on
        assert traces.ENABLED is on
    finally:
        traces.shutdown()
    assert traces.ENABLED is False


def test_rocketmq5_clients_trace_context_is_the_traceparent_property():
    sent = rmq5.Message(topic=rmq5.Resource(name="Orders"), body=b"x", system_properties=rmq5.SystemProperties(
        message_id="01" + "A" * 32, message_type=rmq5.NORMAL, trace_context=TP))
    message, _group = convert.outgoing(sent, 1024)
    assert message.properties["traceparent"] == TP
    stored = StoredMessage("Orders", 0, 3, 0, 0, b"x", {"UNIQ_KEY": "ID", "traceparent": TP}, 0, 1, 2, "h", 0, 0, 0)
    assert convert.received(stored, store_host="h").system_properties.trace_context == TP
    assert not convert.received(replace(stored, properties={"UNIQ_KEY": "ID"}), store_host="h").system_properties \
        .HasField("trace_context")


def test_every_send_path_of_the_broker_makes_store_spans(tmp_path, monkeypatch):
    exporter, provider = recording_provider()
    monkeypatch.setattr(traces, "_spans", traces._StoreSpans(provider, "broker-a"))
    monkeypatch.setattr(traces, "ENABLED", True)

    def traced(msg_id: str) -> OutgoingMessage:
        return OutgoingMessage(body=b"x", properties={"UNIQ_KEY": msg_id, "traceparent": TP})

    async def main():
        b = BrokerController(BrokerConfig(data_dir=tmp_path, flush_interval_ms=3_600_000))
        b.load()
        await b.start()
        b.topics.create("T", 2)
        try:
            ops = b.operations
            await ops.send("T", 0, [traced("A")])
            await ops.send_groups("T", [("g1", [traced("B")]), ("g2", [traced("C")])])
            builder = RecordBatchBuilder("T")
            builder.append(b"x", encode_properties({"UNIQ_KEY": "D", "traceparent": TP}))
            ops.append("T", 1, bytes(builder.buffer), 1, None)
        finally:
            await b.shutdown()
    asyncio.run(main())
    spans = exporter.get_finished_spans()
    assert sorted(s.attributes["messaging.message.id"] for s in spans) == ["A", "B", "C", "D"]
    assert {s.parent.span_id for s in spans} == {0xb7ad6b7169203331}
