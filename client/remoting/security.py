"""TLS channels and signed calls: the gRPC side of `tidemark.client.security`.

Every call on a connection with credentials carries a fresh signature
(`tidemark.common.auth.signed_metadata`: x-mq-date-time and authorization). It is added
by one interceptor for all four call kinds, so no RPC, stream or future method
can forget it, and a long-lived client never sends a stale time: a stream is
signed when it opens, which is when the broker checks it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from tidemark.client.security import TlsSettings
from tidemark.common.auth import Credentials, signed_metadata

ChannelOption = tuple[str, Any]


class _Signer:
    """Adds signed_metadata(credentials) to a call's details, computed when the call starts."""

    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials

    def __repr__(self) -> str:
        return f"{type(self).__name__}(access_key={self._credentials.access_key!r})"

    def _signed(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        signed = signed_metadata(self._credentials)
        names = {key for key, _ in signed}
        # A caller's own entries stay; a signature it set by hand is replaced, not sent twice.
        kept = [(k, v) for k, v in (details.metadata or ()) if k not in names]
        return details._replace(metadata=grpc.aio.Metadata(*kept, *signed))


# One class per call kind: a grpc.aio channel files each interceptor under the first kind it is an
# instance of, so a single class deriving from all four would sign unary-unary calls only.
class SignUnaryUnary(_Signer, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._signed(client_call_details), request)


class SignUnaryStream(_Signer, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._signed(client_call_details), request)


class SignStreamUnary(_Signer, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return await continuation(self._signed(client_call_details), request_iterator)


class SignStreamStream(_Signer, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return await continuation(self._signed(client_call_details), request_iterator)


def signing_interceptors(credentials: Credentials) -> list[grpc.aio.ClientInterceptor]:
    """The interceptors that sign every call kind with `credentials`."""
    return [kind(credentials) for kind in (SignUnaryUnary, SignUnaryStream, SignStreamUnary, SignStreamStream)]


def channel_credentials(tls: TlsSettings) -> grpc.ChannelCredentials:
    """TLS credentials from the settings' PEM files (InvalidArgumentError naming an unreadable one)."""
    return grpc.ssl_channel_credentials(root_certificates=tls.read("ca_file"), private_key=tls.read("key_file"),
                                        certificate_chain=tls.read("cert_file"))


def tls_options(tls: TlsSettings | None) -> tuple[ChannelOption, ...]:
    """Channel options TLS needs: the expected certificate name, only when it differs from the host."""
    if tls is None or not tls.server_name:
        return ()
    return (("grpc.ssl_target_name_override", tls.server_name),)


def open_channel(address: str, *, options: Sequence[ChannelOption], credentials: Credentials | None,
                 tls: TlsSettings | None) -> grpc.aio.Channel:
    """A grpc.aio channel to `address`: TLS when `tls` is set, every call signed when `credentials` are.

    Without credentials no interceptor is installed: plain calls keep grpc's fast path."""
    interceptors = signing_interceptors(credentials) if credentials is not None else None
    if tls is None:
        return grpc.aio.insecure_channel(address, options=list(options), interceptors=interceptors)
    return grpc.aio.secure_channel(address, channel_credentials(tls), options=[*options, *tls_options(tls)],
                                   interceptors=interceptors)


def open_sync_channel(address: str, *, tls: TlsSettings | None) -> grpc.Channel:
    """A blocking channel (the CLI's health check); callers sign with signed_metadata themselves."""
    if tls is None:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, channel_credentials(tls), options=list(tls_options(tls)))
