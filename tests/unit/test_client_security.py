"""Client security without a broker: signed metadata on every call kind (a tiny in-process grpc.aio
server records what arrives), settings that never show a secret, the one-line TLS errors, and the
broker's TLS config checks and exposure warning."""

from __future__ import annotations

import asyncio
import itertools

import grpc
import pytest

from tidemark.broker.config import BrokerConfig
from tidemark.broker.tls import exposure_warning, is_loopback
from tidemark.client import Admin, ProducerSettings, PushConsumerSettings, TlsSettings
from tidemark.client.errors import (
    InvalidArgumentError,
    TlsHandshakeError,
    UnavailableError,
)
from tidemark.client.remoting import security
from tidemark.client.remoting.rpc_errors import from_rpc_error
from tidemark.client.settings import ClientSettings
from tidemark.common import auth
from tidemark.common.auth import Credentials

SECRET = "s3cret-value-never-shown"
CREDS = Credentials("alice", SECRET)


class _Recorder:
    """A generic service with one method per call kind; keeps the metadata of every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, str]]] = []

    def _record(self, kind: str, context: grpc.aio.ServicerContext) -> None:
        self.calls.append((kind, {k: v for k, v in context.invocation_metadata()}))

    async def unary_unary(self, request: bytes, context) -> bytes:
        self._record("unary_unary", context)
        return request

    async def unary_stream(self, request: bytes, context):
        self._record("unary_stream", context)
        for _ in range(2):
            yield request

    async def stream_unary(self, requests, context) -> bytes:
        self._record("stream_unary", context)
        return b"".join([r async for r in requests])

    async def stream_stream(self, requests, context):
        self._record("stream_stream", context)
        async for r in requests:
            yield r

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler("t.Recorder", {
            "UU": grpc.unary_unary_rpc_method_handler(self.unary_unary),
            "US": grpc.unary_stream_rpc_method_handler(self.unary_stream),
            "SU": grpc.stream_unary_rpc_method_handler(self.stream_unary),
            "SS": grpc.stream_stream_rpc_method_handler(self.stream_stream),
        })


async def _every_call_kind(channel: grpc.aio.Channel) -> None:
    assert await channel.unary_unary("/t.Recorder/UU")(b"a", timeout=5) == b"a"
    assert [r async for r in channel.unary_stream("/t.Recorder/US")(b"b", timeout=5)] == [b"b", b"b"]

    async def two():
        yield b"c"
        yield b"d"

    assert await channel.stream_unary("/t.Recorder/SU")(two(), timeout=5) == b"cd"
    # The client's Produce and Fetch streams write to the call, with no request iterator.
    call = channel.stream_stream("/t.Recorder/SS")(timeout=5)
    await call.write(b"e")
    assert await call.read() == b"e"
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF


async def _record_calls(credentials: Credentials | None, *, metadata_calls: int = 1) -> list[tuple[str, dict]]:
    recorder = _Recorder()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((recorder.handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = security.open_channel(f"127.0.0.1:{port}", options=(), credentials=credentials, tls=None)
    try:
        for _ in range(metadata_calls):
            await _every_call_kind(channel)
    finally:
        await channel.close()
        await server.stop(None)
    return recorder.calls


def test_every_call_kind_carries_a_fresh_valid_signature(monkeypatch):
    clock = itertools.count(1_800_000_000, 61)  # each call a minute later than the one before
    times: list[float] = []

    def signed_at_next_tick(credentials):
        times.append(next(clock))
        return auth.signed_metadata(credentials, now=times[-1])

    monkeypatch.setattr(security, "signed_metadata", signed_at_next_tick)
    calls = asyncio.run(_record_calls(CREDS, metadata_calls=2))
    assert [kind for kind, _ in calls] == ["unary_unary", "unary_stream", "stream_unary", "stream_stream"] * 2
    stamps = []
    for (kind, metadata), now in zip(calls, times, strict=True):
        claim = auth.parse(metadata)
        assert claim.access_key == "alice", kind
        auth.verify(claim, SECRET, now=now)  # raises if the signature or its time were wrong
        stamps.append(claim.date_time)
        assert SECRET not in str(metadata)
    assert len(set(stamps)) == len(stamps), "every call must be signed when it starts, not once per channel"


def test_no_credentials_no_signature():
    calls = asyncio.run(_record_calls(None))
    assert len(calls) == 4
    for _, metadata in calls:
        assert auth.AUTHORIZATION_KEY not in metadata and auth.DATE_TIME_KEY not in metadata


def test_settings_never_show_the_secret(monkeypatch):
    monkeypatch.delenv("TIDEMARK_ACCESS_KEY", raising=False)
    monkeypatch.delenv("TIDEMARK_SECRET_KEY", raising=False)
    for settings in (ClientSettings(credentials=("alice", SECRET)), ProducerSettings(credentials=CREDS),
                     PushConsumerSettings(group="g", credentials=("alice", SECRET), tls=True)):
        assert settings.credentials == CREDS
        assert SECRET not in repr(settings) and "alice" in repr(settings)
    assert all(SECRET not in repr(i) for i in security.signing_interceptors(CREDS))
    with pytest.raises(InvalidArgumentError) as e:
        ClientSettings(credentials=["alice", SECRET, "extra"])
    assert SECRET not in str(e.value)


def test_credentials_and_tls_default_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TIDEMARK_ACCESS_KEY", "bob")
    monkeypatch.setenv("TIDEMARK_SECRET_KEY", SECRET)
    monkeypatch.setenv("TIDEMARK_TLS_CA_FILE", str(tmp_path / "ca.pem"))
    s = ClientSettings()
    assert s.credentials == Credentials("bob", SECRET)
    assert s.tls == TlsSettings(ca_file=str(tmp_path / "ca.pem"))
    # Explicit settings win over the environment.
    explicit = ClientSettings(credentials=None, tls=False)
    assert explicit.credentials is None and explicit.tls is None
    monkeypatch.delenv("TIDEMARK_SECRET_KEY")
    monkeypatch.delenv("TIDEMARK_TLS_CA_FILE")
    half = ClientSettings()
    assert half.credentials is None and half.tls is None


def test_tls_settings_shapes(tmp_path):
    assert ClientSettings(tls=True).tls == TlsSettings()
    assert ClientSettings(tls=None).tls is None
    assert ClientSettings(tls=TlsSettings(ca_file=tmp_path / "ca.pem")).tls.ca_file == str(tmp_path / "ca.pem")
    with pytest.raises(InvalidArgumentError, match="cert_file and key_file"):
        TlsSettings(cert_file="c.pem")
    with pytest.raises(InvalidArgumentError, match="tls must be"):
        ClientSettings(tls="yes")
    with pytest.raises(InvalidArgumentError, match=r"tls ca_file .*missing\.pem: cannot read it"):
        TlsSettings(ca_file=str(tmp_path / "missing.pem")).read("ca_file")


def test_unreadable_ca_file_fails_at_start_with_its_name(tmp_path):
    admin = Admin(brokers="127.0.0.1:1", tls=TlsSettings(ca_file=str(tmp_path / "nope.pem")))
    with pytest.raises(InvalidArgumentError, match="nope.pem"):
        admin.start()


class _Failed(grpc.RpcError):
    def __init__(self, details: str) -> None:
        self._details = details

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return self._details


_PREFIX = "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:9: "


@pytest.mark.parametrize(("details", "expected"), [
    (_PREFIX + "Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL routines:"
               "OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate: OK",
     "certificate not trusted (check tls ca_file"),
    (_PREFIX + "Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL routines:"
               "OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: certificate has expired: OK",
     "certificate has expired"),
    (_PREFIX + "Custom verification check failed with error: UNAUTHENTICATED: Hostname Verification Check failed.",
     "does not name the host dialled"),
    (_PREFIX + "Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:100000f7:SSL routines:"
               "OPENSSL_internal:WRONG_VERSION_NUMBER: Invalid certificate verification context: OK",
     "does not speak TLS"),
])
def test_handshake_failures_become_one_line_non_retriable_errors(details, expected):
    error = from_rpc_error(_Failed(details), address="127.0.0.1:9", tls=True)
    assert isinstance(error, TlsHandshakeError) and not error.retriable
    assert str(error).startswith("TLS handshake with 127.0.0.1:9 failed: ") and expected in str(error)
    assert "\n" not in str(error)


def test_a_hang_up_during_setup_gets_a_hint_but_stays_retriable():
    closed = "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:9: Socket closed"
    plain = from_rpc_error(_Failed(closed), address="127.0.0.1:9", tls=False)
    assert isinstance(plain, UnavailableError) and not isinstance(plain, TlsHandshakeError) and plain.retriable and "may require TLS" in str(plain)
    no_cert = from_rpc_error(_Failed(closed), address="127.0.0.1:9", tls=True, client_cert=False)
    assert "client certificate" in str(no_cert)
    refused = from_rpc_error(_Failed("failed to connect to all addresses; last error: UNAVAILABLE: "
                                     "ipv4:127.0.0.1:9: Connection refused"), address="127.0.0.1:9", tls=False)
    assert "TLS" not in str(refused)


def test_broker_tls_config_is_checked(tmp_path):
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("x")
    with pytest.raises(ValueError, match="tls_cert and tls_key must be given together"):
        BrokerConfig(tls_cert=str(cert))
    with pytest.raises(ValueError, match="tls_client_ca .* needs tls_cert"):
        BrokerConfig(tls_client_ca=str(cert))
    with pytest.raises(ValueError, match="tls_key .*missing.pem is not a readable file"):
        BrokerConfig(tls_cert=str(cert), tls_key=str(tmp_path / "missing.pem"))
    assert BrokerConfig(tls_cert=str(cert), tls_key=str(key), tls_client_ca=str(cert)).tls_client_ca == str(cert)


def test_exposure_warning(tmp_path):
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.5"):
        assert is_loopback(host)
        assert exposure_warning(BrokerConfig(host=host), auth_enabled=False) is None
    exposed = exposure_warning(BrokerConfig(host="0.0.0.0", port=10911), auth_enabled=True)
    assert "0.0.0.0:10911" in exposed and "without TLS" in exposed and "auth" not in exposed.split(":")[2]
    both = exposure_warning(BrokerConfig(host="0.0.0.0"), auth_enabled=False)
    assert "without TLS or auth" in both and "--auth" in both
    tls_on = BrokerConfig(host="10.0.0.1", tls_cert=str(cert), tls_key=str(cert))
    assert exposure_warning(tls_on, auth_enabled=True) is None
    assert "without auth" in exposure_warning(tls_on, auth_enabled=False)


def test_cli_connection_flags(monkeypatch):
    import argparse

    from tidemark.client.cli import connect

    for key in ("TIDEMARK_ACCESS_KEY", "TIDEMARK_SECRET_KEY", "TIDEMARK_TLS_CA_FILE", "TIDEMARK_TLS_CERT_FILE",
                "TIDEMARK_TLS_KEY_FILE"):
        monkeypatch.delenv(key, raising=False)
    parser = argparse.ArgumentParser()
    connect.add_arguments(parser)

    def resolved(*argv: str) -> argparse.Namespace:
        args = parser.parse_args(argv)
        connect.resolve(args)
        return args

    plain = resolved()
    assert plain.credentials is None and plain.tls is None
    assert resolved("--tls").tls == TlsSettings()
    full = resolved("--access-key", "alice", "--secret-key", SECRET, "--tls-ca-file", "ca.pem",
                    "--tls-cert-file", "c.pem", "--tls-key-file", "c.key")
    assert full.credentials == CREDS
    assert full.tls == TlsSettings(ca_file="ca.pem", cert_file="c.pem", key_file="c.key")
    with pytest.raises(InvalidArgumentError, match="--secret-key .* is missing"):
        resolved("--access-key", "alice")
    monkeypatch.setenv("TIDEMARK_SECRET_KEY", SECRET)
    monkeypatch.setenv("TIDEMARK_TLS_CA_FILE", "env-ca.pem")
    from_env = resolved("--access-key", "alice")
    assert from_env.credentials == CREDS and from_env.tls.ca_file == "env-ca.pem"
