"""BrokerServer: the asyncio gRPC server around a BrokerController, with health and reflection."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import socket
import threading

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tidemark.broker import tls
from tidemark.broker.auth.guard import AccessGuard, retry_topic_owner
from tidemark.broker.config import BrokerConfig
from tidemark.broker.controller import BrokerController
from tidemark.broker.disk import data_format
from tidemark.broker.disk.datadir import DataDirLock
from tidemark.broker.observe.metrics import BrokerStateCollector, serve
from tidemark.broker.services.admin import AdminServicer
from tidemark.broker.services.intake import RequestBudget, RequestIntake
from tidemark.broker.services.membership import MembershipServicer
from tidemark.broker.services.messaging import MessagingServicer
from tidemark.broker.services.offsets import OffsetServicer
from tidemark.broker.services.replication import ReplicationServicer
from tidemark.broker.services.rmq5 import service as rmq5
from tidemark.broker.version import VERSION
from tidemark.common.logs import get_logger
from tidemark.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    membership_pb2,
    membership_pb2_grpc,
    messaging_pb2,
    messaging_pb2_grpc,
    offsets_pb2,
    offsets_pb2_grpc,
    replication_pb2_grpc,
)

log = get_logger("tidemark.broker")

# Room for a pull response of many messages; requests are limited by the config (max_request_bytes).
MAX_GRPC_SEND_BYTES = 64 * 1024 * 1024
# /healthz: how long the event loop may take to run a no-op before the broker counts as stuck.
HEALTH_LOOP_TIMEOUT_S = 3.0
SERVICE_NAMES = tuple(
    module.DESCRIPTOR.services_by_name[name].full_name
    for module, name in ((messaging_pb2, "MessagingService"), (offsets_pb2, "OffsetService"),
                         (membership_pb2, "MembershipService"), (admin_pb2, "AdminService"))
)


class HealthServicer(health.aio.HealthServicer):
    """grpc's health service, with List: grpcio-health-checking's raises NotImplementedError, which an
    anonymous caller could turn into an ERROR and a traceback in the log per call."""

    def __init__(self) -> None:
        super().__init__()
        self._statuses: dict[str, int] = {}  # what set() was told last, per service name

    async def set(self, service: str, status) -> None:
        self._statuses[service] = status
        await super().set(service, status)

    async def List(self, request, context):
        """The status of every service the broker registered (the health protocol's List)."""
        return health_pb2.HealthListResponse(statuses={
            name: health_pb2.HealthCheckResponse(status=status) for name, status in self._statuses.items()})


class PortInUseError(OSError):
    """A port the broker is to listen on is taken (by another broker, often): said in one line, nothing
    started."""


def check_port_free(host: str, port: int, what: str = "port") -> None:
    """PortInUseError when another socket listens on host:port. Checked before anything starts: grpc
    only logs a C-core error line and raises a RuntimeError that does not say why."""
    if not port:
        return
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return  # the real bind says what is wrong with the host
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind: TIME_WAIT is no user
            try:
                s.bind(address)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise PortInUseError(f"{what} {port} on {host} is already in use") from None
                # Any other refusal (an address family the host lacks) is the real bind's to report.


class BrokerServer:
    def __init__(self, config: BrokerConfig) -> None:
        self.controller = BrokerController(config)
        self.config = self.controller.config  # with a promotion's role applied (broker/cluster/roles.py)
        self.port: int | None = None
        self._server: grpc.aio.Server | None = None
        self._health = HealthServicer()
        # SERVING only while started, not stopping, and every part can write to disk (broker/observe/health.py).
        self._serving = False
        self._health_updates: set[asyncio.Task] = set()
        self.controller.persistence.add_listener(self._on_persistence_health)
        self._metrics_server = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._data_dir_lock = DataDirLock(config.data_dir)

    async def start(self) -> int:
        """Lock the data dir, recover, then serve; returns the bound port. Health turns SERVING once
        everything is up. DataDirLockedError when another broker has the data dir, PortInUseError when
        another process has the port or the metrics port, DataFormatError when the data dir holds a format
        this build does not read (all three checked first: nothing is touched then)."""
        check_port_free(self.config.host, self.config.port)
        if self.config.metrics_port:
            check_port_free(self.config.metrics_host, self.config.metrics_port, "metrics port")
        data_format.check(self.config.data_dir, version=VERSION)  # before the lock: a refused dir stays as it was
        self._data_dir_lock.acquire()
        data_format.ensure(self.config.data_dir, version=VERSION)  # stamps a new, pre-stamp or older-format dir, locked
        report = self.controller.load()
        r = report.recovery
        log.info("store recovered",
                 event="store_recovered", clean=r.clean_shutdown, scanned_from=r.scanned_from,
                 end=r.commit_log_end, truncated_bytes=r.truncated_bytes, redispatched=r.redispatched,
                 duration_s=r.duration_s)
        o = report.offsets
        log.info("consumer offsets loaded",
                 event="offsets_loaded", source=o.source.value, file=o.path, entries=o.entries,
                 skipped=len(o.skipped))
        guard = await self._access_guard() if self.config.auth else None
        self.intake = RequestIntake(RequestBudget(self.config.max_inflight_request_bytes,
                                                  on_burst_over=self.controller.trimmer.burst_over), guard,
                                    refusal_answers=rmq5.refusal_answers)
        server = grpc.aio.server(interceptors=[self.intake], options=[
            ("grpc.max_receive_message_length", self.config.request_limit_bytes),
            ("grpc.max_send_message_length", MAX_GRPC_SEND_BYTES),
            ("grpc.so_reuseport", 0),
            # Clients ping idle connections (client/remoting/connection.py: every 30 s, calls or not). gRPC's
            # server default accepts one ping per 5 minutes without data and then sends GOAWAY
            # "too_many_pings": idle consoles and consumers lost their connection every couple of minutes.
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", self.config.keepalive_min_interval_ms),
        ])
        messaging_pb2_grpc.add_MessagingServiceServicer_to_server(MessagingServicer(self.controller), server)
        offsets_pb2_grpc.add_OffsetServiceServicer_to_server(OffsetServicer(self.controller), server)
        membership_pb2_grpc.add_MembershipServiceServicer_to_server(MembershipServicer(self.controller), server)
        admin_pb2_grpc.add_AdminServiceServicer_to_server(AdminServicer(self.controller), server)
        replication_pb2_grpc.add_ReplicationServiceServicer_to_server(ReplicationServicer(self.controller), server)
        # RocketMQ 5's protocol on the same port (the official clients of every language).
        server.add_generic_rpc_handlers((rmq5.handlers(rmq5.Rmq5Servicer(self.controller)),))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server)
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        listen, credentials = f"{self.config.host}:{self.config.port}", tls.server_credentials(self.config)
        try:
            self.port = (server.add_secure_port(listen, credentials) if credentials is not None
                         else server.add_insecure_port(listen))
        except RuntimeError:  # grpc's "Failed to bind": taken since the check, or an address not ours
            check_port_free(self.config.host, self.config.port)
            raise OSError(f"cannot listen on {listen}") from None
        if not self.port:
            raise OSError(f"cannot listen on {self.config.host}:{self.config.port}")
        if self.config.port == 0:
            # Port 0 picked a free port: routes and broker info must advertise that one, not :0.
            self.config = self.controller.config = dataclasses.replace(self.config, port=self.port)
        await server.start()
        self._server = server
        await self.controller.start()
        if self.config.metrics_port:
            self._loop = asyncio.get_running_loop()
            collector = BrokerStateCollector(self._loop, self.controller.snapshot)
            # Its own address, loopback by default: the gRPC port's TLS and auth do not cover it.
            try:
                self._metrics_server = serve(self.controller.metrics, collector, self.config.metrics_host,
                                             self.config.metrics_port, health=self._http_health)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:  # e.g. the gRPC port given again
                    raise PortInUseError(f"metrics port {self.config.metrics_port} on {self.config.metrics_host} "
                                         f"is already in use") from None
                raise
            log.info("metrics served", event="metrics_ready", host=self.config.metrics_host,
                     port=self.config.metrics_port)
        self._serving = True
        await self._publish_health()
        warning = tls.exposure_warning(self.config, auth_enabled=self.config.auth)
        if warning:
            log.warning(warning, event="broker_exposed")
        log.info("broker ready",
                 event="broker_ready", broker=self.config.broker_name, host=self.config.host, port=self.port,
                 data_dir=self.config.data_dir, flush=self.config.flush.value)
        return self.port

    async def _access_guard(self) -> AccessGuard:
        """Authentication and authorization for every call (--auth); creates the first super user from
        --init-user when there are no users yet (RocketMQ's initAuthenticationUser)."""
        store = self.controller.auth
        if self.config.init_user:
            name, _, secret = self.config.init_user.partition(":")
            if store.ensure_initial_user(name, secret):
                await self.controller.flush_configs()
                log.info("first super user created", event="auth_init_user", user=name)
            elif store.user(name) is None or store.user(name).secret_key != secret:
                supers = sorted(u.name for u in store.users() if u.super_user)
                log.warning("init_user ignored: users exist already (super users: %s)", ", ".join(supers),
                            event="auth_init_user_ignored", user=name)
        if not store.has_users():
            log.warning("auth is on and there are no users: every request will be refused; "
                        "set TIDEMARK_INIT_USER=NAME:SECRET to create the first super user", event="auth_no_users")
        topics, groups = self.controller.topics, self.controller.groups
        return AccessGuard(store, max_skew_s=self.config.auth_max_skew_s,
                           retry_owner=lambda topic: retry_topic_owner(topic, lambda g: groups.get(g) is not None,
                                                                       lambda t: topics.get(t) is not None))

    def _http_health(self) -> tuple[bool, str]:
        """/healthz (read from the metrics thread): what the gRPC health check says, and that the event
        loop, which answers that check and every request, still runs (a stuck loop is unhealthy here, as
        the gRPC check would time out)."""
        if not self._serving:
            return False, "starting or stopping"
        failing = self.controller.persistence.failing_parts()
        if failing:
            return False, "; ".join(f"{part}: {why}" for part, why in sorted(failing.items()))
        ran = threading.Event()
        try:
            self._loop.call_soon_threadsafe(ran.set)
        except RuntimeError:  # the loop is closed: stopping
            return False, "starting or stopping"
        if not ran.wait(HEALTH_LOOP_TIMEOUT_S):
            return False, f"the broker's event loop did not answer within {HEALTH_LOOP_TIMEOUT_S:g} s"
        return True, ""

    async def _set_health(self, status) -> None:
        for name in ("", *SERVICE_NAMES):
            await self._health.set(name, status)

    def _on_persistence_health(self, _healthy: bool) -> None:
        if self._serving:
            task = asyncio.get_running_loop().create_task(self._publish_health())
            self._health_updates.add(task)
            task.add_done_callback(self._health_updates.discard)

    async def _publish_health(self) -> None:
        """Set every service to what the broker is now (read per service: a later change wins)."""
        for name in ("", *SERVICE_NAMES):
            ok = self._serving and self.controller.persistence.healthy
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING if ok
                                   else health_pb2.HealthCheckResponse.NOT_SERVING)

    async def _settled(self) -> None:
        """What a stop waits for before it cuts the replicas' streams: the sends waiting for the disk or a
        replica are answered, and the replicas hold the log's end."""
        await self.controller.sender.settled()
        if self.controller.replication is not None:
            await self.controller.replication.wait_replicas_hold_all()

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop accepting calls, let in-flight ones finish within `grace_s` (default: stop_grace_ms), then
        flush offsets and store."""
        if grace_s is None:
            grace_s = self.config.stop_grace_ms / 1000
        self._serving = False
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()  # its port too: a broker may start again in this process
            self._metrics_server = None
        self.controller.hold.close()
        if self._server is not None:
            # Before the server's stop, whose grace they would hold to its end (services/streams.py). Both
            # share the one grace: what the ordered stop used up, the unary calls no longer get (they had
            # it already: the sends owed were what it waited for).
            loop = asyncio.get_running_loop()
            deadline = loop.time() + grace_s
            await self.intake.streams.stop(self._settled, deadline)
            await self._server.stop(max(0.0, deadline - loop.time()))
            self._server = None
        if self._data_dir_lock.held:
            try:
                await self.controller.shutdown()
            finally:
                self._data_dir_lock.release()
            log.info("broker stopped", event="broker_stop", broker=self.config.broker_name)
        # else it never started (a taken port, a data dir another broker holds): nothing to say stopped
