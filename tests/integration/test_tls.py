"""TLS on the broker's gRPC port against real broker processes, with certificates made at test time
(tests/tlslib.py): the library and the CLI work over TLS and mutual TLS, and every misconfiguration
(plaintext against TLS, TLS against plaintext, an untrusted, expired or misnamed certificate, a
missing client certificate) ends quickly in one clear line instead of a hang."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import forkserver
import pytest
from brokerproc import BrokerProcess
from tlslib import SECURITY_ENV_KEYS, Pki, without_security_env

from tidemark.client import (
    Admin,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    Producer,
    PullConsumer,
    PushConsumer,
    TlsHandshakeError,
    TlsSettings,
    UnavailableError,
)

REPO = Path(__file__).resolve().parents[2]
FAST_S = 5.0  # a refused handshake must be reported well within this
@pytest.fixture(autouse=True)
def _no_security_env(monkeypatch):
    """Each test says how it connects; a developer's TIDEMARK_TLS_* must not change that."""
    for key in SECURITY_ENV_KEYS:
        monkeypatch.delenv(key, raising=False)


def _broker(tmp_path_factory, name: str, *args: str) -> BrokerProcess:
    return BrokerProcess(tmp_path_factory.mktemp(name) / "data", args=args).start()


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory, pki):
    # 0.0.0.0: also shows the start-up warning (no auth) on a TLS broker.
    b = _broker(tmp_path_factory, "tls", "--host", "0.0.0.0", "--tls-cert", str(pki.server_cert),
                "--tls-key", str(pki.server_key))
    yield b
    b.kill()


@pytest.fixture(scope="module")
def plain_broker(tmp_path_factory):
    b = _broker(tmp_path_factory, "plain", "--host", "0.0.0.0")
    yield b
    b.kill()


@pytest.fixture(scope="module")
def mtls_broker(tmp_path_factory, pki):
    b = _broker(tmp_path_factory, "mtls", "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
                "--tls-client-ca", str(pki.ca))
    yield b
    b.kill()


def _ca(pki: Pki, **kw) -> TlsSettings:
    return TlsSettings(ca_file=str(pki.ca), **kw)


def _refused(expected: type[Exception], match: str, **settings) -> Exception:
    """Start an Admin that must fail; the error must come fast, in one line, matching `match`."""
    started = time.monotonic()
    with pytest.raises(expected, match=match) as info:
        Admin(**settings).start()
    assert time.monotonic() - started < FAST_S
    assert "\n" not in str(info.value)
    return info.value


def _poll(consumer: PullConsumer, want: int, timeout_s: float = 20.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got.extend(consumer.poll(timeout=1.0))
    return got


def test_producer_pull_consumer_and_admin_over_tls(tls_broker, pki):
    # By host name: the certificate is checked against "localhost".
    security = dict(brokers=f"localhost:{tls_broker.port}", tls=_ca(pki))
    with Admin(**security) as admin:
        admin.create_topic("TlsTopic", 2)
    with Producer(**security) as producer:
        sent = {producer.send(Message(topic="TlsTopic", body=f"m{i}".encode())).msg_id for i in range(10)}
    consumer = PullConsumer(group="tls-lite", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                            **security)
    consumer.subscribe("TlsTopic")
    with consumer:
        assert {m.msg_id for m in _poll(consumer, 10)} == sent


def test_push_consumer_over_tls(tls_broker, pki):
    security = dict(brokers=tls_broker.address, tls=_ca(pki))
    with Admin(**security) as admin:
        admin.create_topic("TlsPush", 1)
    with Producer(**security) as producer:
        sent = {producer.send(Message(topic="TlsPush", body=b"x")).msg_id for _ in range(5)}
    received: set[str] = set()

    def listener(msgs, context):
        received.update(m.msg_id for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = PushConsumer(group="tls-push", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                            **security)
    consumer.subscribe("TlsPush")
    consumer.register_message_listener(listener)
    with consumer:
        deadline = time.monotonic() + 20
        while received != sent and time.monotonic() < deadline:
            time.sleep(0.05)
    assert received == sent


def test_start_warning_names_what_is_missing(tls_broker, plain_broker):
    assert "without TLS or auth" in plain_broker.log_text()
    tls_log = tls_broker.log_text()
    assert "without auth" in tls_log and "without TLS" not in tls_log


def test_plaintext_client_against_tls_broker(tls_broker):
    error = _refused(UnavailableError, "closed the connection during setup: the broker may require TLS",
                     brokers=tls_broker.address)
    assert tls_broker.address in str(error)


def test_tls_client_against_plaintext_broker(plain_broker, pki):
    _refused(TlsHandshakeError, rf"TLS handshake with {plain_broker.address} failed: the broker does not speak TLS",
             brokers=plain_broker.address, tls=_ca(pki))


def test_untrusted_certificate(tls_broker, pki):
    _refused(TlsHandshakeError, r"certificate not trusted \(check tls ca_file",
             brokers=tls_broker.address, tls=TlsSettings(ca_file=str(pki.other_ca)))


def test_expired_certificate(tmp_path, pki):
    b = BrokerProcess(tmp_path / "data", args=("--tls-cert", str(pki.expired_cert),
                                               "--tls-key", str(pki.expired_key))).start()
    try:
        _refused(TlsHandshakeError, "certificate has expired", brokers=b.address, tls=_ca(pki))
    finally:
        b.kill()


def test_wrong_host_name_and_server_name_override(tmp_path, pki):
    b = BrokerProcess(tmp_path / "data", args=("--tls-cert", str(pki.wrong_host_cert),
                                               "--tls-key", str(pki.wrong_host_key))).start()
    try:
        _refused(TlsHandshakeError, "does not name the host dialled", brokers=b.address, tls=_ca(pki))
        # The name the certificate holds, given explicitly, is accepted.
        with Admin(brokers=b.address, tls=_ca(pki, server_name="broker.example.com")) as admin:
            assert admin.cluster.addresses == [b.address]
    finally:
        b.kill()


def test_mutual_tls_needs_a_client_certificate(mtls_broker, pki):
    _refused(UnavailableError, "may require a client certificate", brokers=mtls_broker.address, tls=_ca(pki))
    with Admin(brokers=mtls_broker.address,
               tls=_ca(pki, cert_file=str(pki.client_cert), key_file=str(pki.client_key))) as admin:
        admin.create_topic("MtlsTopic", 1)
        assert "MtlsTopic" in admin.list_topics()


# -- the CLI -------------------------------------------------------------------------------------------


def tidemark(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = without_security_env(os.environ)
    return forkserver.run([sys.executable, "-m", "tidemark.client.cli.main", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env={**environ, **(env or {})})


def test_cli_over_tls_and_mutual_tls(tls_broker, mtls_broker, pki):
    by_name = f"localhost:{tls_broker.port}"
    created = tidemark("topic", "create", "CliTls", "--queues", "2", "--broker", by_name, "--tls-ca-file", str(pki.ca))
    assert created.returncode == 0, created.stderr
    # TIDEMARK_TLS_CA_FILE turns TLS on like the flag.
    sent = tidemark("send", "CliTls", "--body", "hello", "--broker", by_name, env={"TIDEMARK_TLS_CA_FILE": str(pki.ca)})
    assert sent.returncode == 0, sent.stderr
    health = tidemark("health", "--broker", by_name, "--tls-ca-file", str(pki.ca))
    assert health.returncode == 0 and "SERVING" in health.stdout, health.stdout + health.stderr
    mtls = tidemark("topic", "list", "--broker", mtls_broker.address, "--tls-ca-file", str(pki.ca),
                    "--tls-cert-file", str(pki.client_cert), "--tls-key-file", str(pki.client_key))
    assert mtls.returncode == 0, mtls.stderr


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tidemark: "), proc.stderr
    return lines[0]


def test_cli_refusals_are_one_line(tls_broker, pki):
    started = time.monotonic()
    plain = _one_error_line(tidemark("topic", "list", "--broker", tls_broker.address))
    assert "may require TLS" in plain
    untrusted = _one_error_line(tidemark("topic", "list", "--broker", tls_broker.address,
                                         "--tls-ca-file", str(pki.other_ca)))
    assert f"TLS handshake with {tls_broker.address} failed: certificate not trusted" in untrusted
    assert time.monotonic() - started < 2 * FAST_S + 10  # two process starts included
