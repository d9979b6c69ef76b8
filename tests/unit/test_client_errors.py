"""The client's errors carry a protocol-neutral Status: gRPC's codes by name and number, equal to
`grpc.StatusCode` of the same name (code written against 0.2's `error.code` keeps working), and one table
from (status, broker error class) to an exception class for every transport."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemark.client.errors import (
    FencedError,
    InternalError,
    InvalidArgumentError,
    RequestTimeoutError,
    Status,
    UnavailableError,
    from_status,
)
from tidemark.client.remoting.rpc_errors import from_rpc_error, status_of
from tidemark.common.protocol import ERROR_CLASS_KEY


@pytest.mark.parametrize("code", list(grpc.StatusCode))
def test_each_grpc_code_has_the_status_of_its_name_and_number(code):
    status = status_of(code)
    assert status.name == code.name and int(status) == code.value[0]
    assert status == code and code == status  # both ways round
    assert all(status != other for other in grpc.StatusCode if other is not code)
    assert {status: 1}[Status[code.name]] == 1 and status == code.value[0]


@given(st.integers(-(2**31), 2**31 - 1))
def test_a_number_grpc_does_not_define_is_unknown(number):
    status = Status.of(number)
    assert status is (Status(number) if 0 <= number <= 16 else Status.UNKNOWN)


def test_a_stream_status_becomes_the_same_exception_as_a_call_failure():
    class Failed(grpc.RpcError):
        def __init__(self, code, details, trailing=()):
            self._code, self._details, self._trailing = code, details, trailing

        def code(self):
            return self._code

        def details(self):
            return self._details

        def trailing_metadata(self):
            return self._trailing

    for code, cls in [(grpc.StatusCode.INVALID_ARGUMENT, InvalidArgumentError),
                      (grpc.StatusCode.DEADLINE_EXCEEDED, RequestTimeoutError),
                      (grpc.StatusCode.RESOURCE_EXHAUSTED, UnavailableError),
                      (grpc.StatusCode.DATA_LOSS, InternalError)]:
        by_call = from_rpc_error(Failed(code, "no"))
        by_stream = from_status(code.value[0], "no")
        assert type(by_call) is type(by_stream) is cls and by_call.code is by_stream.code is Status[code.name]
    fenced = from_rpc_error(Failed(grpc.StatusCode.FAILED_PRECONDITION, "old epoch",
                                   ((ERROR_CLASS_KEY, "FencedError"),)))
    assert type(fenced) is type(from_status(9, "old epoch", error_class="FencedError")) is FencedError
    # gRPC's own size check is final, not an overloaded broker.
    assert type(from_rpc_error(Failed(grpc.StatusCode.RESOURCE_EXHAUSTED, "Sent message larger than max"))) \
        is InvalidArgumentError
