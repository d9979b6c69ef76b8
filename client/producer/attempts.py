"""What a send's attempts tell: how many were made, whether one may have stored the message, when to retry.

A failed attempt either was **refused** (the broker answered that it stored
nothing: a bad request, a permission, an unknown topic, a failed
precondition) or its outcome is **unknown** (a timeout, an unreachable or
overloaded broker, a connection reset mid-call, an internal error, a
cancelled call): stored or not. Two rules follow, for every send path:

- an idempotent producer never lends a sequence that may carry a stored
  batch to another batch (sequences.py);
- a send that ends with a refusal after an attempt in doubt raises the
  doubt, not the refusal: the refusal would tell the application that
  nothing was stored, which it cannot know (`Doubt`).
"""

from __future__ import annotations

import asyncio
import enum
from typing import NoReturn

from tidemark.client.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    OutOfOrderSequenceError,
    PermissionDeniedError,
    Status,
    TidemarkError,
    UnauthenticatedError,
)
from tidemark.common.backoff import Backoff

# Errors that mean the broker looked at the request and stored none of it.
_REFUSALS = (InvalidArgumentError, NotFoundError, AlreadyExistsError, FailedPreconditionError,
             PermissionDeniedError, UnauthenticatedError)


class Outcome(enum.Enum):
    """What a failed attempt says about its message."""

    REFUSED = "refused"  # nothing was stored
    UNKNOWN = "unknown"  # stored or not


def outcome_of(error: BaseException) -> Outcome:
    """REFUSED only for an answer that says nothing was stored; UNKNOWN for anything else."""
    if isinstance(error, OutOfOrderSequenceError):
        return Outcome.REFUSED  # a sequence check, retriable or not (a gap), refused the batch as a whole
    if isinstance(error, _REFUSALS) and getattr(error, "retriable", False) is False:
        return Outcome.REFUSED
    return Outcome.UNKNOWN


class Tries:
    """Attempts of one send, across the queues it tries: `attempts` in all (1 + retry_times_when_send_failed)."""

    __slots__ = ("attempts", "made")

    def __init__(self, attempts: int) -> None:
        self.attempts = attempts
        self.made = 0

    @property
    def spent(self) -> bool:
        return self.made >= self.attempts


class Doubt:
    """The first attempt of a send whose outcome is unknown; `raise_final` raises the send's last error,
    or, when that is a refusal after such an attempt, the doubt ("... may have been stored")."""

    def __init__(self) -> None:
        self.first: TidemarkError | None = None

    def saw(self, error: TidemarkError) -> None:
        if self.first is None and outcome_of(error) is Outcome.UNKNOWN:
            self.first = error

    def raise_final(self, error: TidemarkError) -> NoReturn:
        if self.first is None or outcome_of(error) is Outcome.UNKNOWN:
            raise error
        doubt = self.first
        raise type(doubt)(f"{doubt}; a retry was then refused ({type(error).__name__}: {error}): the message may "
                          f"have been stored", code=doubt.code) from error


# Between a producer's send attempts.
RETRY = Backoff(first_s=0.05, max_s=1.0, jitter=True)


async def pause(attempt: int) -> None:
    """The wait before retry number `attempt`: 50 ms, 100 ms, ... up to 1 s, with jitter."""
    await asyncio.sleep(RETRY.delay(attempt))


async def back_off(error: TidemarkError, attempt: int) -> None:
    """An overloaded broker (RESOURCE_EXHAUSTED: request bytes in flight at its limit) gets a pause
    before the retry on another queue; other failures are retried there at once."""
    if error.code is Status.RESOURCE_EXHAUSTED:
        await pause(attempt)
