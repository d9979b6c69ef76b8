"""TLS on the broker's gRPC port, and the start-up warning for a broker exposed without protection.

The files named by the config are read once, at start: replacing a certificate
takes a restart (config validation already checked they are readable).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import grpc

from tidemark.broker.config import BrokerConfig

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def server_credentials(config: BrokerConfig) -> grpc.ServerCredentials | None:
    """TLS credentials for the gRPC port, or None when the broker serves plaintext.

    With tls_client_ca, clients must present a certificate that chains to it (mutual TLS)."""
    if not config.tls_cert:
        return None
    pair = (Path(config.tls_key).read_bytes(), Path(config.tls_cert).read_bytes())
    client_ca = Path(config.tls_client_ca).read_bytes() if config.tls_client_ca else None
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca, require_client_auth=client_ca is not None)


def peer_channel(address: str, ca_file: str = "", options: tuple = ()) -> grpc.aio.Channel:
    """The broker's own dial to a peer (a name server, its master): TLS trusting `ca_file` when given
    (peer_tls_ca), else plaintext. Must be called on the loop that will use it."""
    if not ca_file:
        return grpc.aio.insecure_channel(address, options=list(options))
    credentials = grpc.ssl_channel_credentials(root_certificates=Path(ca_file).read_bytes())
    return grpc.aio.secure_channel(address, credentials, options=list(options))


def is_loopback(host: str) -> bool:
    """True when only this machine can reach `host` (0.0.0.0, :: and real addresses cannot)."""
    name = host.strip().strip("[]").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def exposure_warning(config: BrokerConfig, auth_enabled: bool) -> str | None:
    """The warning to log at start when the port is reachable beyond this machine and lacks TLS or
    auth; None when the broker listens on loopback only or has both."""
    missing, risks, fixes = [], [], []
    if not config.tls_cert:
        missing.append("TLS")
        risks.append("read its traffic")
        fixes.append("--tls-cert/--tls-key")
    if not auth_enabled:
        missing.append("auth")
        risks.append("read and change every topic, group and offset")
        fixes.append("--auth")
    if not missing or is_loopback(config.host):
        return None
    return (f"broker listens on {config.host}:{config.port}, beyond loopback, without {' or '.join(missing)}: "
            f"anyone who can reach the port can {' and '.join(risks)}; set {' and '.join(fixes)}")
