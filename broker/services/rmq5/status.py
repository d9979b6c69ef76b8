"""Result codes: every unary answer of RocketMQ 5's protocol carries a `Status{code, message}`.

The official clients read the code, not the gRPC status (their MessagingResultChecker turns
TOPIC_NOT_FOUND into a not-found exception, INVALID_RECEIPT_HANDLE into a bad request that is not
retried, ...), so domain errors are answered in the response as the RocketMQ proxy answers them,
and a gRPC error status is kept for what the protocol itself cannot carry (a broken stream).
"""

from __future__ import annotations

from tidemark.broker.errors import (
    BrokerError,
    DeliveryTimeError,
    FailedPreconditionError,
    InvalidArgumentError,
    InvalidReceiptHandleError,
    InvisibleTimeError,
    NotEnoughReplicasError,
    NotFoundError,
    PermissionDeniedError,
    ReplicationTimeoutError,
    StoreError,
    TopicNotFoundError,
    UnauthenticatedError,
)
from tidemark.rmq5.v2 import messaging_pb2 as pb

Code = pb.Code


class ProtocolError(InvalidArgumentError):
    """A request the protocol refuses with a specific code (an empty body: MESSAGE_BODY_EMPTY)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# Most specific first: the first class an error is an instance of gives its code.
_CODES: tuple[tuple[type[BrokerError], int], ...] = (
    (TopicNotFoundError, Code.TOPIC_NOT_FOUND),
    (InvalidReceiptHandleError, Code.INVALID_RECEIPT_HANDLE),
    (InvisibleTimeError, Code.ILLEGAL_INVISIBLE_TIME),
    (DeliveryTimeError, Code.ILLEGAL_DELIVERY_TIME),
    # Sync replication: refused before storing (the proxy's HA_NOT_AVAILABLE), or stored here and not
    # acknowledged by a replica in time, an unknown outcome (SLAVE_PERSISTENCE_TIMEOUT).
    (NotEnoughReplicasError, Code.HA_NOT_AVAILABLE),
    (ReplicationTimeoutError, Code.SLAVE_PERSISTENCE_TIMEOUT),
    (UnauthenticatedError, Code.UNAUTHORIZED),
    (PermissionDeniedError, Code.FORBIDDEN),
    (InvalidArgumentError, Code.BAD_REQUEST),
    (NotFoundError, Code.NOT_FOUND),
    (FailedPreconditionError, Code.PRECONDITION_FAILED),
    (StoreError, Code.INTERNAL_SERVER_ERROR),
)


def code_for(error: BrokerError) -> int:
    if isinstance(error, ProtocolError):
        return error.code
    for cls, code in _CODES:
        if isinstance(error, cls):
            return code
    return Code.INTERNAL_ERROR


def ok() -> pb.Status:
    return pb.Status(code=Code.OK, message="OK")


def status_of(error: BrokerError) -> pb.Status:
    return pb.Status(code=code_for(error), message=str(error))
