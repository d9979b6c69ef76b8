"""The broker's part of a message's trace: a `TOPIC store` span, child of the context the message carries in
its W3C `traceparent` property (tidemark.client.tracing puts it there), for each stored batch of messages
that carries one.

Opt-in, with OpenTelemetry's standard environment: OTEL_TRACES_EXPORTER=otlp (the OTLP/gRPC exporter, which
reads OTEL_EXPORTER_OTLP_ENDPOINT and the rest of its OTEL_EXPORTER_OTLP_* settings) or console (JSON on
stdout), OTEL_SERVICE_NAME (default tidemark-broker), OTEL_BSP_* for the batch processor. Without
OTEL_TRACES_EXPORTER, or with it set to none, or without the `otel` extra installed, nothing is imported and
the store path tests one module-level flag. Spans are made after the store answered, from the records as
they were stored (their properties are read only when tracing is on), and exported by the SDK's batch
processor on its own thread, which `shutdown()` flushes and stops when the broker stops.

The rest of a message's journey (where it was stored, which group consumed it, its retry and dead-letter
copies) needs no tracing: the broker records it anyway (tidemark.client.journey reads it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from tidemark.common.logs import get_logger
from tidemark.common.records import RawProperties, RecordError, record_spans, variable_fields

log = get_logger("tidemark.broker")

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

# The one flag the store path tests: False unless configure() found an exporter to use.
ENABLED = False
_spans: _StoreSpans | None = None


class _StoreSpans:
    def __init__(self, provider: Any, broker_name: str) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider, self.broker_name = provider, broker_name
        self.trace, self.kind = trace, SpanKind.SERVER
        self.propagator = TraceContextTextMapPropagator()
        self.tracer = provider.get_tracer("tidemark.broker")

    def span(self, topic: str, queue_id: int, carrier: Mapping[str, str], offsets: Sequence[int],
             msg_ids: Sequence[str], start_ns: int, end_ns: int) -> None:
        ctx = self.propagator.extract(carrier)
        if not self.trace.get_current_span(ctx).get_span_context().is_valid:
            return  # a malformed traceparent: no trace to join
        attributes: dict[str, Any] = {
            "messaging.system": "rocketmq",
            "messaging.operation.type": "store",
            "messaging.destination.name": topic,
            "messaging.destination.partition.id": str(queue_id),
            "tidemark.broker.name": self.broker_name,
            "tidemark.queue.offset": offsets[0],
        }
        if len(offsets) == 1:
            attributes["messaging.message.id"] = msg_ids[0]
        else:
            attributes["messaging.batch.message_count"] = len(offsets)
        self.tracer.start_span(f"{topic} store", context=ctx, kind=self.kind, attributes=attributes,
                               start_time=start_ns).end(end_time=end_ns)


def configure(broker_name: str, env: Mapping[str, str] = os.environ) -> bool:
    """Turn store spans on when OTEL_TRACES_EXPORTER names an exporter (otlp, console); False when it does
    not, or when OpenTelemetry is not installed (logged: the operator asked for spans)."""
    global ENABLED, _spans
    names = [n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip() and n.strip() != "none"]
    if not names:
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as e:
        log.warning("OTEL_TRACES_EXPORTER is set but OpenTelemetry is not installed: no store spans "
                    "(pip install 'tidemark[otel]')", event="otel_unavailable", error=str(e))
        return False
    service = env.get("OTEL_SERVICE_NAME") or "tidemark-broker"
    provider = TracerProvider(resource=Resource.create({"service.name": service, "service.instance.id": broker_name}))
    exporting = []
    for name in names:
        if name == "console":
            exporter = ConsoleSpanExporter()
        elif name == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            except ImportError as e:
                log.warning("the OTLP exporter is not installed", event="otel_unavailable", error=str(e))
                continue
            exporter = OTLPSpanExporter()
        else:
            log.warning("unknown OTEL_TRACES_EXPORTER entry ignored (otlp, console or none)",
                        event="otel_exporter_unknown", exporter=name)
            continue
        provider.add_span_processor(BatchSpanProcessor(exporter))
        exporting.append(name)
    if not exporting:
        return False
    _spans, ENABLED = _StoreSpans(provider, broker_name), True
    log.info("store spans on", event="otel_store_spans", exporters=",".join(exporting), service=service)
    return True


def shutdown() -> None:
    """Export what is left and stop the exporter's thread (the broker is stopping)."""
    global ENABLED, _spans
    spans, _spans, ENABLED = _spans, None, False
    if spans is not None:
        spans.provider.shutdown()


def stored_records(topic: str, queue_id: int, records: bytes, count: int, first_offset: int, msg_ids: Sequence[str],
                   start_ns: int, end_ns: int) -> None:
    """Store spans for a producer's record batch, stored at first_offset..: one per traceparent it carries (a
    traced producer's batch shares its publish span's)."""
    spans = _spans
    if spans is None or first_offset < 0:
        return
    groups: dict[tuple[str, str], list[int]] = {}
    try:
        for i, (start, _size) in enumerate(record_spans(records, count)):
            _, _, _, _, props_at, props_len, _, _ = variable_fields(records, start)
            props = RawProperties(bytes(records[props_at:props_at + props_len]))
            parent = props.get(TRACEPARENT)
            if parent:
                groups.setdefault((parent, props.get(TRACESTATE) or ""), []).append(i)
    except (RecordError, ValueError) as e:  # stored already, so checked: only a bug gets here
        log.warning("store spans skipped: the batch could not be read", event="otel_store_spans_failed", error=str(e))
        return
    for (parent, state), indexes in groups.items():
        carrier = {TRACEPARENT: parent, **({TRACESTATE: state} if state else {})}
        spans.span(topic, queue_id, carrier, [first_offset + i for i in indexes],
                   [msg_ids[i] if i < len(msg_ids) else "" for i in indexes], start_ns, end_ns)


def stored_messages(topic: str, stored: Sequence[tuple[Mapping[str, str], int, int, str]], start_ns: int,
                    end_ns: int) -> None:
    """Store spans for messages sent one by one (properties, queue id, queue offset, msg id each)."""
    spans = _spans
    if spans is None:
        return
    for properties, queue_id, offset, msg_id in stored:
        parent = properties.get(TRACEPARENT)
        if parent:
            carrier = {TRACEPARENT: parent, **({TRACESTATE: properties[TRACESTATE]}
                                               if TRACESTATE in properties else {})}
            spans.span(topic, queue_id, carrier, [offset], [msg_id], start_ns, end_ns)
