"""Certificates for TLS tests, generated at test time with `cryptography` (nothing checked in).

`make_pki(directory)` writes a small PKI as PEM files and returns their paths:
a CA, a server certificate for 127.0.0.1/localhost, an expired one, one for
another host name, a client certificate for mutual TLS, and a second CA that
signed nothing the broker serves (a client trusting it sees an untrusted peer).
EC P-256 keys keep generation in the milliseconds.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The environment that gives clients an identity or TLS (client/security.py): tests that say how they
# connect clear these first.
SECURITY_ENV_KEYS = ("TIDEMARK_BROKER", "TIDEMARK_TLS", "TIDEMARK_TLS_CA_FILE", "TIDEMARK_TLS_CERT_FILE",
                     "TIDEMARK_TLS_KEY_FILE", "TIDEMARK_ACCESS_KEY", "TIDEMARK_SECRET_KEY")


def without_security_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k not in SECURITY_ENV_KEYS}


@dataclass(frozen=True)
class Pki:
    ca: Path               # the CA clients trust
    other_ca: Path         # a CA that signed none of the broker certificates
    server_cert: Path      # 127.0.0.1, ::1 and localhost
    server_key: Path
    expired_cert: Path     # same names, validity ended yesterday
    expired_key: Path
    wrong_host_cert: Path  # only broker.example.com
    wrong_host_key: Path
    client_cert: Path      # for mutual TLS, signed by `ca`
    client_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey | None = None) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        path.with_suffix(".key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def _ca(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(_name(common_name)).issuer_name(_name(common_name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def _leaf(ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], common_name: str, *,
          dns: tuple[str, ...] = (), ips: tuple[str, ...] = (), client: bool = False,
          expired: bool = False) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_cert, ca_key = ca
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    if expired:
        start, end = now - datetime.timedelta(days=10), now - datetime.timedelta(days=1)
    else:
        start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(days=30)
    names = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (x509.CertificateBuilder()
               .subject_name(_name(common_name)).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def make_pki(directory: Path) -> Pki:
    """Write every certificate and key under `directory` (created if needed)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca = _ca("tidemark test CA")
    other = _ca("some other CA")
    local = dict(dns=("localhost",), ips=("127.0.0.1", "::1"))
    _write(d / "ca.pem", ca[0])
    _write(d / "other-ca.pem", other[0])
    _write(d / "server.pem", *_leaf(ca, "localhost", **local))
    _write(d / "expired.pem", *_leaf(ca, "localhost", expired=True, **local))
    _write(d / "wrong-host.pem", *_leaf(ca, "broker.example.com", dns=("broker.example.com",)))
    _write(d / "client.pem", *_leaf(ca, "tidemark-client", client=True))
    return Pki(ca=d / "ca.pem", other_ca=d / "other-ca.pem",
               server_cert=d / "server.pem", server_key=d / "server.key",
               expired_cert=d / "expired.pem", expired_key=d / "expired.key",
               wrong_host_cert=d / "wrong-host.pem", wrong_host_key=d / "wrong-host.key",
               client_cert=d / "client.pem", client_key=d / "client.key")
