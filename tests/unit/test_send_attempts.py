"""client/producer/attempts.py: which failures say nothing was stored, and what a send finally raises."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tidemark.client.errors import (
    FencedError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfOrderSequenceError,
    PermissionDeniedError,
    RequestTimeoutError,
    SequenceGapError,
    UnavailableError,
)
from tidemark.client.producer.attempts import Doubt, Outcome, outcome_of


@pytest.mark.parametrize("error", [InvalidArgumentError("bad queue"), NotFoundError("no topic"),
                                   PermissionDeniedError("read-only"), FencedError("fenced"),
                                   OutOfOrderSequenceError("overlap"), SequenceGapError("gap")])
def test_an_answer_of_the_broker_that_refuses_stored_nothing(error):
    assert outcome_of(error) is Outcome.REFUSED


@pytest.mark.parametrize("error", [RequestTimeoutError("timed out"), UnavailableError("Socket closed"),
                                   InternalError("Internal error from Core"), asyncio.CancelledError(),
                                   RuntimeError("anything else")])
def test_anything_else_leaves_the_outcome_unknown(error):
    assert outcome_of(error) is Outcome.UNKNOWN


def test_a_refusal_alone_is_raised_as_it_is():
    doubt = Doubt()
    refusal = PermissionDeniedError("read-only")
    doubt.saw(refusal)
    with pytest.raises(PermissionDeniedError) as caught:
        doubt.raise_final(refusal)
    assert caught.value is refusal


def test_a_refusal_after_an_attempt_in_doubt_raises_the_doubt():
    doubt = Doubt()
    first = RequestTimeoutError("no answer in 3 s", code=grpc.StatusCode.DEADLINE_EXCEEDED)
    doubt.saw(first)
    doubt.saw(UnavailableError("later doubt: the first one is kept"))
    refusal = InvalidArgumentError("queue id 3 is out of range")
    doubt.saw(refusal)
    with pytest.raises(RequestTimeoutError, match="may have been stored") as caught:
        doubt.raise_final(refusal)
    assert caught.value.retriable and caught.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert caught.value.__cause__ is refusal and "queue id 3" in str(caught.value)


def test_an_unknown_last_error_is_raised_as_it_is():
    doubt = Doubt()
    doubt.saw(UnavailableError("first"))
    last = RequestTimeoutError("last")
    with pytest.raises(RequestTimeoutError) as caught:
        doubt.raise_final(last)
    assert caught.value is last
