"""The client's exceptions: one root, a `retriable` flag, a table from gRPC status.

Only `client/remoting` translates gRPC errors (via `from_rpc_error`); the rest of
the library and applications catch these classes.
"""

from __future__ import annotations

import grpc

from tidemark.common.protocol import ERROR_CLASS_KEY


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


class OutOfOrderSequenceError(FailedPreconditionError):
    """An idempotent producer's batch did not follow the last one the broker stored; nothing was stored."""


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


class TlsHandshakeError(UnavailableError):
    """The TLS handshake with a broker failed for a reason retrying cannot fix (an untrusted, expired or
    misnamed certificate, TLS against a plaintext broker); the message says which and what to check."""

    retriable = False


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
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: RequestTimeoutError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: UnavailableError,
    grpc.StatusCode.CANCELLED: UnavailableError,
}
_BY_BROKER_CLASS: dict[str, type[TidemarkError]] = {
    "FencedError": FencedError,
    "StaleResetGenerationError": StaleResetGenerationError,
    "OutOfOrderSequenceError": OutOfOrderSequenceError,
    "ProducerFencedError": ProducerFencedError,
    "UnknownProducerError": UnknownProducerError,
}


_BY_CODE_VALUE: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}


def from_status(code: int, message: str, *, error_class: str = "", address: str = "") -> TidemarkError:
    """The exception for a status carried inside a stream message (a batch or a queue of a stream)."""
    status = _BY_CODE_VALUE.get(code, grpc.StatusCode.UNKNOWN)
    cls = _BY_BROKER_CLASS.get(error_class) or _BY_STATUS.get(status, InternalError)
    if cls is UnavailableError and address:
        message = f"broker {address}: {message}"
    return cls(message, code=status)


# gRPC reports a failed connection as UNAVAILABLE and puts the handshake's reason in the details;
# (marker in the details, what to tell the user) in order of precedence.
_TLS_FAILURES = (
    ("certificate has expired", "the broker's certificate has expired (renew it on the broker)"),
    ("CERTIFICATE_VERIFY_FAILED", "certificate not trusted (check tls ca_file / --tls-ca-file: it must hold the "
                                  "CA that signed the broker's certificate)"),
    ("Hostname Verification Check failed", "the broker's certificate does not name the host dialled (connect "
                                           "by a name the certificate holds, or set tls server_name)"),
    ("Peer name", "the broker's certificate does not name the host dialled (connect by a name the certificate "
                  "holds, or set tls server_name)"),
    ("WRONG_VERSION_NUMBER", "the broker does not speak TLS (connect without tls, or start the broker with "
                             "--tls-cert/--tls-key)"),
)
_HANDSHAKE_MARKERS = ("Tls handshake failed", "Ssl handshake failed", "SSL_ERROR_SSL", "Handshake failed")
_CLOSED_MARKERS = ("Socket closed", "Connection reset", "Broken pipe", "connection closed", "End of TCP stream")
# A connection cut, not refused: a reset, or a close before the TLS handshake completed ("Handshake read
# failed (Socket closed)"). A broker refusing a plaintext client or a client certificate never does that:
# it lets the handshake finish (a TLS 1.3 client's side ends before the server checks its certificate),
# then closes in order (a bare "Socket closed"). A dying or restarting broker, or a middlebox resetting
# connections, does.
_CUT_MARKERS = ("Connection reset", "Broken pipe", "Handshake read failed", "Handshake write failed")


def _connect_failure(details: str, address: str, tls: bool | None, client_cert: bool,
                     peer: str = "broker") -> TidemarkError | None:
    """A one-line error for a connection that failed during setup, or None for any other failure."""
    where = f"{peer} {address}" if address else f"the {peer}"
    handshake_with = address if address and peer == "broker" else where  # brokers' messages name the address only
    for marker, reason in _TLS_FAILURES:
        if marker in details:
            reason = reason.replace("the broker", f"the {peer}")
            return TlsHandshakeError(f"TLS handshake with {handshake_with} failed: {reason}",
                                     code=grpc.StatusCode.UNAVAILABLE)
    if any(m in details for m in _HANDSHAKE_MARKERS):
        reason = details.split("last error: ", 1)[-1]
        return TlsHandshakeError(f"TLS handshake with {handshake_with} failed: {reason}",
                                 code=grpc.StatusCode.UNAVAILABLE)
    if "failed to connect" not in details or not any(m in details for m in _CLOSED_MARKERS):
        return None
    if any(m in details for m in _CUT_MARKERS):
        how = ("reset" if "reset" in details else "closed before the handshake completed" if "Handshake" in details
               else "closed")
        return BrokerUnreachableError(f"{where} closed the connection during setup ({how}): it may be down or "
                                      f"restarting", code=grpc.StatusCode.UNAVAILABLE)
    # The broker hung up in order before any answer: what a broker refusing a plaintext client or a
    # client certificate does, though a broker going down may too, so these stay retriable
    # UnavailableErrors; the hint says which setting to look at.
    if tls is False:
        hint = f"the {peer} may require TLS (set tls, or --tls / --tls-ca-file)"
    elif tls and not client_cert:
        hint = (f"the {peer} may require a client certificate (mutual TLS: set tls cert_file/key_file, or "
                "--tls-cert-file/--tls-key-file)")
    elif tls:
        hint = f"the {peer} may not trust this client's certificate (mutual TLS)"
    else:
        hint = "it may require TLS or a client certificate"
    return BrokerUnreachableError(f"{where} closed the connection during setup: {hint}",
                                  code=grpc.StatusCode.UNAVAILABLE)


def from_rpc_error(error: grpc.RpcError, *, address: str = "", tls: bool | None = None,
                   client_cert: bool = False, peer: str = "broker") -> TidemarkError:
    """The client exception for a failed call. `tls`/`client_cert` say how the connection dials, so a
    connection the broker hung up on gets a hint about which setting to check."""
    code = error.code() if hasattr(error, "code") else None
    details = (error.details() if hasattr(error, "details") else None) or str(code)
    if code is grpc.StatusCode.UNAVAILABLE:
        failure = _connect_failure(details, address, tls, client_cert, peer)
        if failure is not None:
            return failure
    cls = _BY_STATUS.get(code, InternalError)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details:
        # gRPC's own size check (the broker's max_request_bytes): sending it again cannot help.
        cls = InvalidArgumentError
    trailing = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == ERROR_CLASS_KEY and value in _BY_BROKER_CLASS:
            cls = _BY_BROKER_CLASS[value]
    if cls is UnavailableError and "failed to connect" in details:
        cls = BrokerUnreachableError  # e.g. "Connection refused": the call never left
    if issubclass(cls, UnavailableError) and address:
        details = f"{peer} {address}: {details}"
    return cls(details, code=code)
