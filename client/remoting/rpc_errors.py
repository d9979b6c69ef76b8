"""gRPC failures as the client's exceptions (errors.py): the one place that reads a `grpc.RpcError`.

A failed call carries a status, details and trailing metadata; the broker
names its error class in the metadata for the refusals a client acts on. A
connection that failed during setup gets a message saying what to check
(TLS, a client certificate, a broker that is down or restarting).
"""

from __future__ import annotations

import grpc

from tidemark.client.errors import (
    BrokerUnreachableError,
    Status,
    TidemarkError,
    TlsHandshakeError,
    UnavailableError,
    error_class_for,
)
from tidemark.common.protocol import ERROR_CLASS_KEY

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
                                     code=Status.UNAVAILABLE)
    if any(m in details for m in _HANDSHAKE_MARKERS):
        reason = details.split("last error: ", 1)[-1]
        return TlsHandshakeError(f"TLS handshake with {handshake_with} failed: {reason}",
                                 code=Status.UNAVAILABLE)
    if "failed to connect" not in details or not any(m in details for m in _CLOSED_MARKERS):
        return None
    if any(m in details for m in _CUT_MARKERS):
        how = ("reset" if "reset" in details else "closed before the handshake completed" if "Handshake" in details
               else "closed")
        return BrokerUnreachableError(f"{where} closed the connection during setup ({how}): it may be down or "
                                      f"restarting", code=Status.UNAVAILABLE)
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
                                  code=Status.UNAVAILABLE)


def from_rpc_error(error: grpc.RpcError, *, address: str = "", tls: bool | None = None,
                   client_cert: bool = False, peer: str = "broker") -> TidemarkError:
    """The client exception for a failed call. `tls`/`client_cert` say how the connection dials, so a
    connection the broker hung up on gets a hint about which setting to check."""
    grpc_code = error.code() if hasattr(error, "code") else None
    code = status_of(grpc_code)
    details = (error.details() if hasattr(error, "details") else None) or str(grpc_code)
    if code is Status.UNAVAILABLE:
        failure = _connect_failure(details, address, tls, client_cert, peer)
        if failure is not None:
            return failure
    trailing = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    broker_class = next((value for key, value in trailing or () if key == ERROR_CLASS_KEY), "")
    # gRPC's own size check (the broker's max_request_bytes) is final: sending it again cannot help.
    too_large = code is Status.RESOURCE_EXHAUSTED and "larger than max" in details
    cls = error_class_for(Status.INVALID_ARGUMENT if too_large else code, broker_class)
    if cls is UnavailableError and "failed to connect" in details:
        cls = BrokerUnreachableError  # e.g. "Connection refused": the call never left
    if issubclass(cls, UnavailableError) and address:
        details = f"{peer} {address}: {details}"
    return cls(details, code=code)


def status_of(code: grpc.StatusCode | None) -> Status | None:
    """The neutral status of a gRPC status code."""
    return None if code is None else Status.of(code.value[0])
