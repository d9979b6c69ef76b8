"""The client's exceptions: one root, a `retriable` flag, a table from gRPC status.

Only `client/remoting` translates gRPC errors (via `from_rpc_error`); the rest of
the library and applications catch these classes.
"""

from __future__ import annotations

import grpc

ERROR_CLASS_KEY = "tidemark-error"


class TidemarkError(Exception):
    """Root of every error the client library raises."""

    retriable: bool = False

    def __init__(self, message: str, *, code: grpc.StatusCode | None = None) -> None:
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


class PermissionDeniedError(TidemarkError):
    """The broker or topic is closed for writing or reading."""


class UnavailableError(TidemarkError):
    """The broker cannot be reached or is shutting down."""

    retriable = True


class RequestTimeoutError(TidemarkError):
    """The broker did not answer in time."""

    retriable = True


class InternalError(TidemarkError):
    """The broker failed unexpectedly; its log has details."""


class ClientStateError(TidemarkError):
    """The client object is in the wrong state (not started, already shut down...)."""


_BY_STATUS: dict[grpc.StatusCode, type[TidemarkError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: RequestTimeoutError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: UnavailableError,
    grpc.StatusCode.CANCELLED: UnavailableError,
}
_BY_BROKER_CLASS: dict[str, type[TidemarkError]] = {
    "FencedError": FencedError,
    "StaleResetGenerationError": StaleResetGenerationError,
}


_BY_CODE_VALUE: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}


def from_status(code: int, message: str, *, error_class: str = "", address: str = "") -> TidemarkError:
    """The exception for a status carried inside a stream message (a batch or a queue of a stream)."""
    status = _BY_CODE_VALUE.get(code, grpc.StatusCode.UNKNOWN)
    cls = _BY_BROKER_CLASS.get(error_class) or _BY_STATUS.get(status, InternalError)
    if cls is UnavailableError and address:
        message = f"broker {address}: {message}"
    return cls(message, code=status)


def from_rpc_error(error: grpc.RpcError, *, address: str = "") -> TidemarkError:
    code = error.code() if hasattr(error, "code") else None
    details = (error.details() if hasattr(error, "details") else None) or str(code)
    cls = _BY_STATUS.get(code, InternalError)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details:
        # gRPC's own size check (the broker's max_request_bytes): sending it again cannot help.
        cls = InvalidArgumentError
    trailing = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == ERROR_CLASS_KEY and value in _BY_BROKER_CLASS:
            cls = _BY_BROKER_CLASS[value]
    if cls is UnavailableError and address:
        details = f"broker {address}: {details}"
    return cls(details, code=code)
