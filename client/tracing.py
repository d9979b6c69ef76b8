"""Message traces with OpenTelemetry: W3C Trace Context carried in a message's `traceparent` property,
a PRODUCER span per send and a CONSUMER span per delivery, linked through it.

Off by default, and then free: nothing here imports OpenTelemetry, and the clients test one module-level
flag (`ENABLED`) before doing anything else. `enable()` turns it on for every client of the process (it
needs the `otel` extra: `pip install 'tidemark[otel]'`); spans go to the tracer provider given, or to the
global one the application configured (`opentelemetry.trace.set_tracer_provider`):

    from tidemark.client import tracing
    tracing.enable()              # before producers send and push consumers register their listeners

- A send (`Producer.send`, `send_batch`, `send_async`, `send_oneway`) is a PRODUCER span `TOPIC publish`,
  child of the caller's active span if there is one; every message of it carries the span's context as a
  `traceparent` property (and `tracestate` when there is one), which retried and dead-lettered copies keep.
- A push consumer's listener call is a CONSUMER span `TOPIC process`, child of the message's context (for a
  batch of several messages: a new trace, linked to each message's context); its status is ERROR when the
  listener fails (RECONSUME_LATER, SUSPEND_CURRENT_QUEUE_A_MOMENT, an exception).
- A lite pull consumer's poll() marks each message it hands over with a CONSUMER span `TOPIC receive`
  (child of the message's context): the application processes it after poll() returns, out of our sight.

Attributes follow OpenTelemetry's semantic conventions for messaging with `messaging.system` =
"rocketmq": Tidemark speaks RocketMQ's model and protocol, official RocketMQ clients' spans sit in the same
traces, and the conventions' `messaging.rocketmq.*` attributes (client_group, message.tag, message.keys,
message.type, consumption_model, namespace) apply only under that system name.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tidemark.client.errors import ClientStateError
from tidemark.client.message import Message, MessageExt
from tidemark.common.protocol import PropertyKey

__all__ = ["ENABLED", "TRACEPARENT", "TRACESTATE", "disable", "enable", "parse_traceparent"]

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
SYSTEM = "rocketmq"

# The one flag the clients test: False until enable(), and then nothing below runs.
ENABLED = False
_otel: _Otel | None = None
_FAILED = frozenset({"RECONSUME_LATER", "SUSPEND_CURRENT_QUEUE_A_MOMENT"})


class _Otel:
    """OpenTelemetry's pieces, imported by enable() only."""

    def __init__(self, tracer_provider: Any) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import Link, SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.trace = trace
        self.Link, self.SpanKind, self.Status, self.StatusCode = Link, SpanKind, Status, StatusCode
        # W3C Trace Context only: the application's global propagators may add baggage and more, which
        # would become message properties too.
        self.propagator = TraceContextTextMapPropagator()
        self.tracer = trace.get_tracer("tidemark.client", _version(), tracer_provider=tracer_provider)

    def carrier(self, ctx: Any = None) -> dict[str, str]:
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, context=ctx)
        return carrier

    def extract(self, properties: Mapping[str, str]) -> Any:
        """The context a message carries, or None when it carries none (or a malformed one)."""
        if TRACEPARENT not in properties:
            return None
        ctx = self.propagator.extract({k: properties[k] for k in (TRACEPARENT, TRACESTATE) if k in properties})
        span = self.trace.get_current_span(ctx)
        return ctx if span.get_span_context().is_valid else None


def _version() -> str:
    import importlib.metadata
    try:
        return importlib.metadata.version("tidemark")
    except importlib.metadata.PackageNotFoundError:
        return ""


def enable(tracer_provider: Any = None) -> None:
    """Trace every client's sends and deliveries from now on (see the module's docstring); spans go to
    `tracer_provider`, or to OpenTelemetry's global provider when None. ClientStateError when the
    `otel` extra is not installed."""
    global ENABLED, _otel
    try:
        _otel = _Otel(tracer_provider)
    except ImportError as e:
        raise ClientStateError(f"message traces need OpenTelemetry: pip install 'tidemark[otel]' ({e})") from None
    ENABLED = True


def disable() -> None:
    """Stop tracing: messages sent from now on carry no traceparent and no span is made."""
    global ENABLED, _otel
    ENABLED, _otel = False, None


def parse_traceparent(value: str) -> tuple[str, str] | None:
    """(trace id, parent span id) of a W3C traceparent value (version 00 and later), None when malformed.
    Pure, without OpenTelemetry: the CLI and the console show a message's trace id with it."""
    m = _TRACEPARENT.fullmatch(value.strip().lower())
    if m is None or m["version"] == "ff" or (m["version"] == "00" and m["rest"]):
        return None
    if m["trace"] == "0" * 32 or m["span"] == "0" * 16:
        return None
    return m["trace"], m["span"]


_TRACEPARENT = re.compile(r"(?P<version>[0-9a-f]{2})-(?P<trace>[0-9a-f]{32})-(?P<span>[0-9a-f]{16})-[0-9a-f]{2}"
                          r"(?P<rest>-.*)?")


# -- producers ---------------------------------------------------------------------------------------

def _publish_attributes(message: Message, count: int, settings: Any) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.destination.name": message.topic,
        "messaging.client.id": settings.client_id,
        "messaging.rocketmq.message.type": _message_type(message),
    }
    if count > 1:
        attributes["messaging.batch.message_count"] = count
    else:
        attributes["messaging.message.body.size"] = len(message.body)
        if message.tags:
            attributes["messaging.rocketmq.message.tag"] = message.tags
        if message.keys:
            attributes["messaging.rocketmq.message.keys"] = message.keys.split()
    if message.delay_level:
        attributes["messaging.rocketmq.message.delay_time_level"] = message.delay_level
    if getattr(settings, "producer_group", ""):
        attributes["messaging.rocketmq.client_group"] = settings.producer_group
    if settings.namespace:
        attributes["messaging.rocketmq.namespace"] = settings.namespace
    return attributes


def _message_type(message: Message) -> str:
    if PropertyKey.TRANSACTION_PREPARED in message.properties:
        return "transaction"
    if message.delay_level or PropertyKey.DELIVER_TIMESTAMP in message.properties:
        return "delay"
    return "normal"


def _carrying(message: Message, carrier: Mapping[str, str]) -> Message:
    return dataclasses.replace(message, properties={**message.properties, **carrier})  # every other field kept


def send_traced(send: Callable[..., list[Any]], messages: Sequence[Message], settings: Any, **kw: Any) -> list[Any]:
    """send(messages, **kw) inside a PRODUCER span, each message carrying the span's context."""
    otel = _otel
    if otel is None or not messages or not all(isinstance(m, Message) for m in messages):
        return send(messages, **kw)  # (which refuses what is not a Message)
    first = messages[0]
    with otel.tracer.start_as_current_span(f"{first.topic} publish", kind=otel.SpanKind.PRODUCER,
                                           attributes=_publish_attributes(first, len(messages), settings)) as span:
        carrier = otel.carrier()
        if carrier:  # a no-op span (an API without an SDK) has no context to carry
            messages = [_carrying(m, carrier) for m in messages]
        results = send(messages, **kw)
        if len(results) == 1:
            _sent_attributes(span, results[0])
        return results


def send_async_traced(send: Callable[..., concurrent.futures.Future], message: Message, callback: Any,
                      settings: Any, **kw: Any) -> concurrent.futures.Future:
    """send(message, callback, **kw) with a PRODUCER span that ends when the future does."""
    otel = _otel
    if otel is None or not isinstance(message, Message):
        return send(message, callback, **kw)
    span = otel.tracer.start_span(f"{message.topic} publish", kind=otel.SpanKind.PRODUCER,
                                  attributes=_publish_attributes(message, 1, settings))
    carrier = otel.carrier(otel.trace.set_span_in_context(span))
    try:
        future = send(_carrying(message, carrier) if carrier else message, callback, **kw)
    except BaseException as e:
        _failed(otel, span, e)
        span.end()
        raise

    def finished(f: concurrent.futures.Future) -> None:
        error = f.exception()
        if error is not None:
            _failed(otel, span, error)
        else:
            _sent_attributes(span, f.result())
        span.end()
    future.add_done_callback(finished)
    return future


def _sent_attributes(span: Any, result: Any) -> None:
    mq = result.message_queue
    span.set_attributes({"messaging.message.id": result.msg_id, "messaging.destination.partition.id": str(mq.queue_id),
                         "tidemark.broker.name": mq.broker_name, "tidemark.queue.offset": result.queue_offset})


def _failed(otel: _Otel, span: Any, error: BaseException) -> None:
    span.record_exception(error)
    span.set_status(otel.Status(otel.StatusCode.ERROR, f"{type(error).__name__}: {error}"))


# -- consumers ---------------------------------------------------------------------------------------

def _consume_attributes(operation: str, msgs: Sequence[MessageExt], settings: Any) -> dict[str, Any]:
    first = msgs[0]
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": operation,
        "messaging.operation.name": operation,
        "messaging.destination.name": first.topic,
        "messaging.destination.partition.id": str(first.queue_id),
        "messaging.consumer.group.name": settings.group,
        "messaging.rocketmq.client_group": settings.group,
        "messaging.client.id": settings.client_id,
        "messaging.rocketmq.consumption_model": settings.message_model.value.lower(),
        "tidemark.broker.name": first.broker_name,
    }
    if settings.namespace:
        attributes["messaging.rocketmq.namespace"] = settings.namespace
    if len(msgs) > 1:
        attributes["messaging.batch.message_count"] = len(msgs)
        return attributes
    attributes["messaging.message.id"] = first.msg_id
    attributes["tidemark.queue.offset"] = first.queue_offset
    attributes["tidemark.message.reconsume_times"] = first.reconsume_times
    if first.tags:
        attributes["messaging.rocketmq.message.tag"] = first.tags
    if first.keys:
        attributes["messaging.rocketmq.message.keys"] = first.keys.split()
    return attributes


def traced_listener(listener: Callable, settings: Any) -> Callable:
    """A push consumer's listener wrapped in a CONSUMER span `TOPIC process` per call (while enabled)."""
    if _otel is None:
        return listener

    def traced(msgs: Sequence[MessageExt], context: Any) -> Any:
        otel = _otel
        if otel is None or not msgs:
            return listener(msgs, context)
        parent, links = None, ()
        if len(msgs) == 1:
            parent = otel.extract(msgs[0].properties)
        else:
            links = [otel.Link(otel.trace.get_current_span(ctx).get_span_context())
                     for m in msgs if (ctx := otel.extract(m.properties)) is not None]
        with otel.tracer.start_as_current_span(
                f"{msgs[0].topic} process", context=parent, kind=otel.SpanKind.CONSUMER, links=links,
                attributes=_consume_attributes("process", msgs, settings)) as span:
            result = listener(msgs, context)
            name = getattr(result, "name", None)
            if name in _FAILED or result is None:
                span.set_status(otel.Status(otel.StatusCode.ERROR, name or "the listener returned None"))
            return result
    return traced


def received(msgs: Sequence[MessageExt], settings: Any) -> None:
    """A CONSUMER span `TOPIC receive` per message a lite pull consumer's poll() hands over."""
    otel = _otel
    if otel is None:
        return
    for m in msgs:
        otel.tracer.start_span(f"{m.topic} receive", context=otel.extract(m.properties),
                               kind=otel.SpanKind.CONSUMER,
                               attributes=_consume_attributes("receive", [m], settings)).end()
