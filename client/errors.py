"""The client's exceptions: one root, a `retriable` flag, a protocol-neutral status.

The broker answers with a status (gRPC's codes, by name and number, whichever
protocol carried them) and, for the refusals a client acts on, the name of
the broker's error class. `error_for` turns the two into one of the classes
below; only `client/remoting` sees transport errors and translates them
(rpc_errors.py), so the rest of the library and applications catch these.
"""

from __future__ import annotations

import enum


class Status(enum.IntEnum):
    """A broker's answer: gRPC's status codes, by the same names and numbers. Compares equal to
    `grpc.StatusCode` of the same name too, so code written against `grpc.StatusCode` keeps working."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16

    @classmethod
    def of(cls, code: int) -> Status:
        """The status of a number carried in a message; UNKNOWN for a number gRPC does not define."""
        try:
            return cls(code)
        except ValueError:
            return cls.UNKNOWN

    def __eq__(self, other: object) -> bool:
        value = getattr(other, "value", None)
        if isinstance(value, tuple) and not isinstance(other, int):  # grpc.StatusCode: (number, "name")
            return bool(value) and value[0] == int(self)
        return int.__eq__(self, other)  # type: ignore[no-any-return]

    __hash__ = int.__hash__


class TidemarkError(Exception):
    """Root of every error the client library raises. `code` is the broker's status when there was one."""

    retriable: bool = False

    def __init__(self, message: str, *, code: Status | None = None) -> None:
        super().__init__(message)
        self.code = code


class InvalidArgumentError(TidemarkError, ValueError):
    """The request was malformed (bad name, out-of-range offset, oversize message...)."""


class InvalidTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong type (also a TypeError, as Python code expects)."""


class NotFoundError(TidemarkError):
    """Unknown topic, group or message."""


class AlreadyExistsError(TidemarkError):
    pass


class FailedPreconditionError(TidemarkError):
    """The broker's state forbids the request now."""


class FencedError(FailedPreconditionError):
    """This client no longer owns the queue: its owner epoch is older than the broker's."""


class StaleResetGenerationError(FailedPreconditionError):
    """An admin reset happened that this client had not seen; its commit was refused."""


class OutOfOrderSequenceError(FailedPreconditionError):
    """An idempotent producer's batch did not follow the last one the broker stored; nothing was stored."""


class SequenceGapError(OutOfOrderSequenceError):
    """An idempotent producer's batch arrived before the batch ahead of it (several in flight to a queue, an
    earlier one cut off on its way): nothing was stored. The producer sends it again after the earlier one."""

    retriable = True


class ProducerFencedError(FailedPreconditionError):
    """An idempotent producer's batch carried an older epoch than the broker holds for its queue."""


class UnknownProducerError(NotFoundError):
    """The broker does not know (or has forgotten) the idempotent producer's id; nothing was stored."""


class UnauthenticatedError(TidemarkError):
    """The broker refused the credentials: none, a wrong secret, or a clock too far from the broker's."""


class PermissionDeniedError(TidemarkError):
    """The broker or topic is closed for writing or reading."""


class UnavailableError(TidemarkError):
    """The broker cannot be reached or is shutting down."""

    retriable = True


class BrokerUnreachableError(UnavailableError):
    """No connection to the broker could be set up (refused, reset or closed during setup; a master failed
    over to its replica): unlike a call cut off mid-way, nothing of the request can have reached it."""


class NotMasterError(UnavailableError):
    """The broker may no longer be the master of its name (fenced by a newer one, or unsure of its lease in
    controller mode): nothing was stored or changed. Retriable: the client asks the name server where the
    master is now (Kafka's NOT_LEADER_OR_FOLLOWER)."""


class TlsHandshakeError(UnavailableError):
    """The TLS handshake with a broker failed for a reason retrying cannot fix (an untrusted, expired or
    misnamed certificate, TLS against a plaintext broker); the message says which and what to check."""

    retriable = False


class RequestTimeoutError(TidemarkError):
    """The broker did not answer in time."""

    retriable = True


class InternalError(TidemarkError):
    """The broker failed unexpectedly; its log has details."""


class QueueInDoubtError(TidemarkError):
    """A keyed idempotent producer (producer_key: its epochs belong to its owner, e.g. a Spark task attempt)
    gave up on a batch whose outcome is unknown, so the batches after it on that queue are not sent: their
    numbers would have to move to a new epoch, which would fence the owner's replay. Replay from the first
    batch under the same key and epoch; the broker answers what it stored as duplicates."""


class ClientStateError(TidemarkError):
    """The client object is in the wrong state (not started, already shut down...)."""


_BY_STATUS: dict[Status, type[TidemarkError]] = {
    Status.INVALID_ARGUMENT: InvalidArgumentError,
    Status.OUT_OF_RANGE: InvalidArgumentError,
    Status.NOT_FOUND: NotFoundError,
    Status.ALREADY_EXISTS: AlreadyExistsError,
    Status.FAILED_PRECONDITION: FailedPreconditionError,
    Status.PERMISSION_DENIED: PermissionDeniedError,
    Status.UNAUTHENTICATED: UnauthenticatedError,
    Status.UNAVAILABLE: UnavailableError,
    Status.DEADLINE_EXCEEDED: RequestTimeoutError,
    Status.RESOURCE_EXHAUSTED: UnavailableError,
    Status.CANCELLED: UnavailableError,
}
_BY_BROKER_CLASS: dict[str, type[TidemarkError]] = {
    "FencedError": FencedError,
    "StaleResetGenerationError": StaleResetGenerationError,
    "OutOfOrderSequenceError": OutOfOrderSequenceError,
    "SequenceGapError": SequenceGapError,
    "ProducerFencedError": ProducerFencedError,
    "UnknownProducerError": UnknownProducerError,
    "NotCurrentError": NotMasterError,
}


def error_class_for(status: Status | None, error_class: str = "") -> type[TidemarkError]:
    """The exception class for a broker's status and the name of its error class ("" if none was sent)."""
    return _BY_BROKER_CLASS.get(error_class) or _BY_STATUS.get(status, InternalError)  # type: ignore[arg-type]


def from_status(code: int, message: str, *, error_class: str = "", address: str = "") -> TidemarkError:
    """The exception for a status carried inside a stream message (a batch or a queue of a stream)."""
    status = Status.of(code)
    cls = error_class_for(status, error_class)
    if cls is UnavailableError and address:
        message = f"broker {address}: {message}"
    return cls(message, code=status)
