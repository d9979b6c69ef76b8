"""NameServer: the `tidemark namesrv` process, a gRPC server around a RouteTable.

It keeps no files (RocketMQ's name server does not either): after a restart
its table fills again within one registration interval of the brokers.
Several run side by side, unaware of each other; every broker registers with
each of them and clients ask whichever answers.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import os
import signal
import sys
import time
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tidemark.broker import tls
from tidemark.broker.config import USER_SPEC
from tidemark.broker.namesrv.guard import RegistrationGuard
from tidemark.broker.namesrv.routes import DEFAULT_EXPIRY_MS, RouteTable
from tidemark.broker.namesrv.service import NameServerServicer
from tidemark.broker.services.intake import RequestBudget, RequestIntake
from tidemark.common.auth import Credentials
from tidemark.common.env_secrets import secret_from_env
from tidemark.common.logs import get_logger, setup_logging
from tidemark.common.scheduler import Scheduler
from tidemark.v1 import namesrv_pb2, namesrv_pb2_grpc

log = get_logger("tidemark.namesrv")

DEFAULT_NAMESRV_PORT = 9876
# A registration carries every topic config of a broker: room for about 100,000 topics.
MAX_REQUEST_BYTES = 32 * 1024 * 1024
BROKER_USER_ENV = "TIDEMARK_BROKER_USER"
SERVICE_NAME = namesrv_pb2.DESCRIPTOR.services_by_name["NameServerService"].full_name


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, kw_only=True)
class NameServerConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_NAMESRV_PORT
    expiry_ms: int = DEFAULT_EXPIRY_MS
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    # NAME:SECRET the brokers sign registrations with (their init_user); empty: registrations are open.
    broker_user: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0..65535, got {self.port}")
        if not 1000 <= self.expiry_ms <= 24 * 3600 * 1000:
            raise ValueError(f"expiry must be 1000..86400000 ms, got {self.expiry_ms}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key must be given together")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("tls_client_ca (mutual TLS) needs tls_cert and tls_key")
        if self.broker_user and not USER_SPEC.fullmatch(self.broker_user):
            raise ValueError("broker_user must be NAME:SECRET (the brokers' init_user; the secret at least "
                             "8 characters)")
        for name in ("tls_cert", "tls_key", "tls_client_ca"):
            path = getattr(self, name)
            if path and not (os.path.isfile(path) and os.access(path, os.R_OK)):
                raise ValueError(f"{name} {path} is not a readable file")

    @property
    def broker_credentials(self) -> Credentials | None:
        if not self.broker_user:
            return None
        name, _, secret = self.broker_user.partition(":")
        return Credentials(name, secret)

    @property
    def scan_interval_s(self) -> float:
        """How often silent brokers are looked for: RocketMQ's 5 s, faster with a short expiry."""
        return min(5.0, self.expiry_ms / 4000)


class State(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


class NameServer:
    def __init__(self, config: NameServerConfig) -> None:
        self.config = config
        self.table = RouteTable(config.expiry_ms)
        self.port: int | None = None
        self.state = State.NEW
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._scheduler = Scheduler("namesrv")
        self._scheduler.every("expire-brokers", config.scan_interval_s, self._expire)

    async def start(self) -> int:
        if self.state is not State.NEW:
            raise RuntimeError(f"name server is {self.state.value}, not new")
        server = grpc.aio.server(
            interceptors=[RequestIntake(RequestBudget(MAX_REQUEST_BYTES))],
            options=[("grpc.max_receive_message_length", MAX_REQUEST_BYTES), ("grpc.so_reuseport", 0)])
        guard = RegistrationGuard(self.config.broker_credentials)
        namesrv_pb2_grpc.add_NameServerServiceServicer_to_server(NameServerServicer(self.table, now_ms, guard),
                                                                 server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        listen, credentials = f"{self.config.host}:{self.config.port}", tls.server_credentials(self.config)
        self.port = (server.add_secure_port(listen, credentials) if credentials is not None
                     else server.add_insecure_port(listen))
        if not self.port:
            raise OSError(f"cannot listen on {listen}")
        await server.start()
        self._server = server
        await self._scheduler.start()
        for name in ("", SERVICE_NAME):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.state = State.RUNNING
        log.info("name server ready", event="namesrv_ready", host=self.config.host, port=self.port,
                 expiry_ms=self.config.expiry_ms, registrations="open" if guard.open else "signed")
        return self.port

    async def stop(self, grace_s: float = 1.0) -> None:
        if self.state is State.STOPPED:
            return
        self.state = State.STOPPED
        await self._scheduler.stop()
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
        log.info("name server stopped", event="namesrv_stop")

    def _expire(self) -> None:
        for b in self.table.expire(now_ms()):
            r = b.registration
            log.warning("broker expired: no registration for %d ms", self.table.expiry_ms, event="broker_expired",
                        broker=r.broker_name, broker_id=r.broker_id, addr=r.address)


# -- `tidemark namesrv` -----------------------------------------------------------------------------


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="tidemark namesrv", description="Run a Tidemark name server.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in containers)")
    parser.add_argument("--port", type=int, default=DEFAULT_NAMESRV_PORT,
                        help=f"gRPC port (RocketMQ's {DEFAULT_NAMESRV_PORT}); 0 picks a free port")
    parser.add_argument("--expiry-ms", type=int, default=DEFAULT_EXPIRY_MS,
                        help="a broker silent this long leaves the routes (RocketMQ's 120000)")
    parser.add_argument("--tls-cert", default="", metavar="FILE", help="PEM certificate chain (with --tls-key)")
    parser.add_argument("--tls-key", default="", metavar="FILE", help="PEM private key of --tls-cert")
    parser.add_argument("--tls-client-ca", default="", metavar="FILE",
                        help="PEM CA bundle client certificates must chain to (mutual TLS)")
    parser.add_argument("--broker-user", default=None, metavar="NAME:SECRET",
                        help="take registrations only when signed by this user, the brokers' --init-user (needed "
                             f"when brokers run --auth: an unsigned registration could fence a master); also "
                             f"${BROKER_USER_ENV}, or a file named by ${BROKER_USER_ENV}_FILE, which keep the "
                             f"secret out of the process list")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="log level")
    parser.add_argument("--log-format", default="kv", choices=("kv", "json"), help="log format")
    return parser


async def _serve(config: NameServerConfig) -> None:
    server = NameServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
        await stop.wait()
    finally:
        await server.stop()


def run(args: argparse.Namespace) -> int:
    try:
        broker_user = args.broker_user if args.broker_user is not None else secret_from_env(os.environ,
                                                                                             BROKER_USER_ENV)
        config = NameServerConfig(host=args.host, port=args.port, expiry_ms=args.expiry_ms, tls_cert=args.tls_cert,
                                  tls_key=args.tls_key, tls_client_ca=args.tls_client_ca, broker_user=broker_user)
    except ValueError as e:
        print(f"tidemark namesrv: {e}", file=sys.stderr)
        return 2
    setup_logging(args.log_level, args.log_format)
    try:
        import uvloop

        uvloop.run(_serve(config))
    except OSError as e:
        print(f"tidemark namesrv: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
