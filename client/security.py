"""Who a client is (credentials) and how it reaches brokers (TLS): the settings and their defaults.

Pure values, no grpc: `client/remoting/security.py` turns them into channel
credentials and the interceptors that sign every call.

Defaults come from the environment, so a deployment can switch every client on
without code changes:

    TIDEMARK_ACCESS_KEY + TIDEMARK_SECRET_KEY   credentials (both, or neither)
    TIDEMARK_TLS_CA_FILE                        TLS, trusting this CA bundle
    TIDEMARK_TLS_CERT_FILE + TIDEMARK_TLS_KEY_FILE  a client certificate (mutual TLS)
    TIDEMARK_TLS=1                              TLS with grpc's default trust roots
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tidemark.client.errors import InvalidArgumentError
from tidemark.common.auth import Credentials
from tidemark.common.env_secrets import secret_from_env

ACCESS_KEY_ENV = "TIDEMARK_ACCESS_KEY"
SECRET_KEY_ENV = "TIDEMARK_SECRET_KEY"
TLS_ENV = "TIDEMARK_TLS"
TLS_CA_FILE_ENV = "TIDEMARK_TLS_CA_FILE"
TLS_CERT_FILE_ENV = "TIDEMARK_TLS_CERT_FILE"
TLS_KEY_FILE_ENV = "TIDEMARK_TLS_KEY_FILE"


@dataclass(frozen=True, kw_only=True)
class TlsSettings:
    """TLS towards the brokers. Files are PEM and read when a connection is made.

    ca_file: the CA bundle that signed the brokers' certificates (empty: grpc's default roots,
    which GRPC_DEFAULT_SSL_ROOTS_FILE_PATH can point at the system store). cert_file/key_file:
    this client's certificate, for brokers that require one (mutual TLS). server_name: the name
    the broker certificate must hold when it differs from the host the client dials.
    """

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""

    def __post_init__(self) -> None:
        for name in ("ca_file", "cert_file", "key_file", "server_name"):
            value = getattr(self, name)
            if isinstance(value, Path):
                object.__setattr__(self, name, str(value))
            elif value is None:
                object.__setattr__(self, name, "")
            elif not isinstance(value, str):
                raise InvalidArgumentError(f"TlsSettings.{name} must be a string, got {type(value).__name__}")
        if bool(self.cert_file) != bool(self.key_file):
            raise InvalidArgumentError("TlsSettings: cert_file and key_file must be given together")

    def read(self, name: str) -> bytes | None:
        """The bytes of file setting `name`, None when unset; InvalidArgumentError naming it when unreadable."""
        path = getattr(self, name)
        if not path:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as e:
            raise InvalidArgumentError(f"tls {name} {path}: cannot read it ({e.strerror or e})") from None


def credentials_from_env(env: Mapping[str, str] | None = None) -> Credentials | None:
    """Credentials from TIDEMARK_ACCESS_KEY/TIDEMARK_SECRET_KEY when both are set (the secret may be in the
    file TIDEMARK_SECRET_KEY_FILE names instead: common/env_secrets.py); InvalidArgumentError when that
    file cannot be read."""
    env = os.environ if env is None else env
    access = env.get(ACCESS_KEY_ENV, "")
    if not access:
        return None  # (a secret file nobody uses is not read)
    try:
        secret = secret_from_env(env, SECRET_KEY_ENV)
    except ValueError as e:
        raise InvalidArgumentError(str(e)) from None
    return Credentials(access, secret) if access and secret else None


def tls_from_env(env: Mapping[str, str] | None = None) -> TlsSettings | None:
    """TLS settings from TIDEMARK_TLS_* (any of them turns TLS on), else None (plaintext)."""
    env = os.environ if env is None else env
    ca, cert, key = (env.get(k, "") for k in (TLS_CA_FILE_ENV, TLS_CERT_FILE_ENV, TLS_KEY_FILE_ENV))
    on = env.get(TLS_ENV, "").strip().lower() in ("1", "true", "yes", "on")
    if not (ca or cert or key or on):
        return None
    return TlsSettings(ca_file=ca, cert_file=cert, key_file=key)


def coerce_credentials(value: object) -> Credentials | None:
    """A Credentials, an (access_key, secret_key) pair, or None."""
    if value is None or isinstance(value, Credentials):
        return value
    if isinstance(value, tuple | list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        try:
            return Credentials(value[0], value[1])
        except ValueError as e:
            raise InvalidArgumentError(str(e)) from None
    # Never echo the value: it may hold the secret.
    raise InvalidArgumentError(f"credentials must be a tidemark.common.auth.Credentials or an (access_key, secret_key) "
                               f"pair, got a {type(value).__name__}")


def coerce_tls(value: object) -> TlsSettings | None:
    """False/None: plaintext; True: TLS with default trust roots; or a TlsSettings."""
    if value is None or value is False:
        return None
    if value is True:
        return TlsSettings()
    if isinstance(value, TlsSettings):
        return value
    raise InvalidArgumentError(f"tls must be True, False or a TlsSettings, got {value!r}")
