"""Generated requests through RocketMQ 5's protocol: every one gets a specific answer (a gRPC refusal,
or a status code in the response), the broker logs no error for any, and a refused one changes nothing.

The requests are built from Tidemark's declaration of the protocol's messages (rpc_fuzzlib's strategies),
with names from the seeded broker mixed with names that break the rules."""

from __future__ import annotations

import os

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rpc_fuzzlib import TOPICS, request_strategy, snapshot
from test_rpc_fuzz import BROKER_ARGS, seed

from tests.brokerproc import BrokerProcess, BrokerStubs
from tidemark.broker.services.rmq5.service import METHODS
from tidemark.rmq5.v2 import messaging_pb2 as pb

# A gRPC status the protocol uses for what it cannot answer in a response.
REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED}
STILL_OPEN = {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
METADATA = (("x-mq-client-id", "127.0.0.1@fz-v2"), ("x-mq-language", "PYTHON"))
HUNT = os.environ.get("TIDEMARK_FUZZ_EXAMPLES")


def _identity(b: bytes) -> bytes:
    return b


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("fuzz-v2") / "data", args=BROKER_ARGS).start()
    with BrokerStubs(broker.address) as stubs:
        seed(stubs)
        yield broker, stubs
    broker.stop()


def _tame(request) -> None:
    """Keep receives and pulls from waiting past the test's deadline."""
    for name in ("long_polling_timeout",):
        if name in request.DESCRIPTOR.fields_by_name:
            request.ClearField(name)
            getattr(request, name).nanos = 100_000_000


@st.composite
def v2_call(draw):
    method = draw(st.sampled_from(METHODS))
    if method.request_streaming:
        requests = draw(st.lists(request_strategy(method.request.DESCRIPTOR), min_size=1, max_size=3))
    else:
        requests = [draw(request_strategy(method.request.DESCRIPTOR))]
    for r in requests:
        _tame(r)
    return method, [r.SerializeToString() for r in requests]


def _answer(channel: grpc.Channel, method, payloads: list[bytes]) -> tuple[grpc.StatusCode, int | None]:
    """The gRPC status, and the protocol's own code of the (first) answer."""
    try:
        if method.request_streaming:
            call = channel.stream_stream(method.path, request_serializer=_identity, response_deserializer=_identity)
            answers = list(call(iter(payloads), timeout=1.0, metadata=METADATA))
        elif method.response_streaming:
            call = channel.unary_stream(method.path, request_serializer=_identity, response_deserializer=_identity)
            answers = list(call(payloads[0], timeout=3.0, metadata=METADATA))
        else:
            call = channel.unary_unary(method.path, request_serializer=_identity, response_deserializer=_identity)
            answers = [call(payloads[0], timeout=3.0, metadata=METADATA)]
    except grpc.RpcError as e:
        return e.code(), None
    first = method.response.FromString(answers[0]) if answers else None
    code = first.status.code if first is not None and first.HasField("status") else None
    return grpc.StatusCode.OK, code


def _log_problems(broker: BrokerProcess) -> list[str]:
    return [line for line in broker.log_text().splitlines()
            if "Traceback" in line or "event=rpc_error" in line or "event=stream_request_failed" in line]


@settings(max_examples=int(HUNT or 250), deadline=None, suppress_health_check=list(HealthCheck),
          derandomize=not HUNT)
@given(case=v2_call())
def test_generated_v2_requests_get_specific_answers_and_refusals_change_nothing(fuzz_broker, case):
    broker, stubs = fuzz_broker
    method, payloads = case
    before = snapshot(stubs)
    status, code = _answer(stubs.channel, method, payloads)
    assert status is grpc.StatusCode.OK or status in REFUSALS or status in STILL_OPEN, (method.name, status)
    assert code != pb.INTERNAL_ERROR, (method.name, payloads)
    refused = status in REFUSALS or (code is not None and code not in (pb.OK, pb.MESSAGE_NOT_FOUND))
    if refused:
        after = snapshot(stubs)
        changed = {k: (before.get(k), after.get(k)) for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
        assert changed == {}, (method.name, status, code, payloads)
    else:
        seed(stubs)
    assert _log_problems(broker) == []


@pytest.mark.parametrize("payload", [b"\x0a\x05\x61\x62", b"\xff\xff\xff\xff\xff"], ids=repr)
def test_undecodable_v2_bytes_get_invalid_argument(fuzz_broker, payload):
    broker, stubs = fuzz_broker
    before = snapshot(stubs)
    codes = {m.name: _answer(stubs.channel, m, [payload])[0] for m in METHODS}
    assert {n: c for n, c in codes.items() if c is not grpc.StatusCode.INVALID_ARGUMENT} == {}
    assert snapshot(stubs) == before
    assert _log_problems(broker) == []


def test_the_seeded_topics_are_served(fuzz_broker):
    _, stubs = fuzz_broker
    status, code = _answer(stubs.channel, METHODS[0], [pb.QueryRouteRequest(
        topic=pb.Resource(name=TOPICS[0])).SerializeToString()])
    assert (status, code) == (grpc.StatusCode.OK, pb.OK)
