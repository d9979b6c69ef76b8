"""How the client commands reach the brokers: --broker, --timeout, credentials and TLS flags.

Flags win over the environment (TIDEMARK_ACCESS_KEY, TIDEMARK_SECRET_KEY,
TIDEMARK_TLS_CA_FILE, TIDEMARK_TLS_CERT_FILE, TIDEMARK_TLS_KEY_FILE). A broker
given by host name is checked against the name in its certificate (grpc does
this for every TLS connection); --tls-server-name names the expected one
when the dialled address differs.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from tidemark.client.errors import InvalidArgumentError
from tidemark.client.security import (
    ACCESS_KEY_ENV,
    SECRET_KEY_ENV,
    TLS_CA_FILE_ENV,
    TLS_CERT_FILE_ENV,
    TLS_KEY_FILE_ENV,
    TlsSettings,
)
from tidemark.common.auth import Credentials
from tidemark.common.env_secrets import secret_from_env


def add_arguments(common: argparse.ArgumentParser) -> None:
    common.add_argument("--access-key", default=None, metavar="KEY",
                        help=f"access key signing every request (default ${ACCESS_KEY_ENV})")
    common.add_argument("--secret-key", default=None, metavar="SECRET",
                        help=f"secret of the access key (default ${SECRET_KEY_ENV}; prefer the environment: "
                             f"command lines are visible to other users)")
    common.add_argument("--tls", action="store_true",
                        help="connect with TLS, trusting grpc's default roots unless --tls-ca-file is given")
    common.add_argument("--tls-ca-file", default=None, metavar="FILE",
                        help=f"PEM CA bundle the brokers' certificates chain to; turns TLS on "
                             f"(default ${TLS_CA_FILE_ENV})")
    common.add_argument("--tls-cert-file", default=None, metavar="FILE",
                        help=f"PEM client certificate for mutual TLS (default ${TLS_CERT_FILE_ENV})")
    common.add_argument("--tls-key-file", default=None, metavar="FILE",
                        help=f"PEM key of --tls-cert-file (default ${TLS_KEY_FILE_ENV})")
    common.add_argument("--tls-server-name", default=None, metavar="NAME",
                        help="name the brokers' certificates hold, when it is not the host in --broker")


def add_namespace(named: argparse.ArgumentParser) -> None:
    """--namespace, for the commands that name topics or groups."""
    named.add_argument("--namespace", default="", metavar="NS",
                       help="the namespace of the topics and groups named (RocketMQ's namespace; stored as "
                            "NS%%NAME): a list shows only the namespace's topics or groups")


# The logger naming a listed broker that does not answer (tidemark.client.remoting.cluster): the CLI shows its
# warnings, one line each, while the command goes on with the brokers that answer.
UNREACHABLE_LOGGER = "tidemark.client.cluster"


def resolve(args: argparse.Namespace) -> None:
    """Set args.credentials and args.tls from the flags and the environment; InvalidArgumentError when
    only half of a pair is given."""
    logging.getLogger(UNREACHABLE_LOGGER).setLevel(logging.WARNING)
    env = os.environ
    access = args.access_key or env.get(ACCESS_KEY_ENV, "")
    try:  # $TIDEMARK_SECRET_KEY, or the file $TIDEMARK_SECRET_KEY_FILE names
        secret = args.secret_key or secret_from_env(env, SECRET_KEY_ENV)
    except ValueError as e:
        raise InvalidArgumentError(str(e)) from None
    if bool(access) != bool(secret):
        missing = ("--secret-key (or $TIDEMARK_SECRET_KEY, $TIDEMARK_SECRET_KEY_FILE)" if access
                   else "--access-key (or $TIDEMARK_ACCESS_KEY)")
        raise InvalidArgumentError(f"credentials need both an access key and a secret key: {missing} is missing")
    args.credentials = Credentials(access, secret) if access else None
    ca = args.tls_ca_file or env.get(TLS_CA_FILE_ENV, "")
    cert = args.tls_cert_file or env.get(TLS_CERT_FILE_ENV, "")
    key = args.tls_key_file or env.get(TLS_KEY_FILE_ENV, "")
    server_name = args.tls_server_name or ""
    on = args.tls or bool(ca or cert or key or server_name)
    args.tls = TlsSettings(ca_file=ca, cert_file=cert, key_file=key, server_name=server_name) if on else None


def client_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword settings of a Producer, consumer or Admin built by a command."""
    return {"brokers": args.brokers, "namesrv": args.namesrv, "request_timeout_s": args.timeout, "credentials": args.credentials,
            "tls": args.tls, "namespace": getattr(args, "namespace", "")}
