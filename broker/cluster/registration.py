"""NameServerRegistrar: keeps the broker registered with every name server it was given.

Like RocketMQ's registerBrokerAll: the whole registration (identity,
permission, every topic config) goes to each name server on a timer, so a
name server that restarts with an empty table knows the broker again within
one interval, and a broker that dies leaves the routes after the name
servers' expiry. A change (a topic created, deleted or updated, the broker's
permission) is registered at once instead: `sync_if_changed` is awaited by
the request that made it, so a client that created a topic finds its route
at the name servers as soon as the answer arrives.

With credentials (the broker's init_user) every call is signed, which a name server started with
--broker-user requires: only a broker may register, and so fence a master (namesrv/guard.py).

A name server that does not answer delays nothing beyond `timeout_s` and
fails nothing: the next tick tries again, and the log says once when a
name server stops and starts answering.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import grpc

from tidemark.broker import tls
from tidemark.broker.topics import TopicConfig
from tidemark.common.auth import Credentials, signed_metadata
from tidemark.common.logs import get_logger
from tidemark.common.protocol import ERROR_CLASS_KEY
from tidemark.v1 import admin_pb2, namesrv_pb2, namesrv_pb2_grpc

log = get_logger("tidemark.broker.cluster.registration")


@dataclass(frozen=True, slots=True)
class Registration:
    """What a broker tells the name servers about itself (the controller builds it, in plain types)."""

    cluster_name: str
    broker_name: str
    broker_id: int
    address: str
    version: str
    epoch: int
    replica_lag_bytes: int
    replica_lag_ms: int
    in_sync_replicas: tuple[int, ...]
    readable: bool
    writable: bool
    uptime_ms: int
    topics: tuple[TopicConfig, ...]

    def to_pb(self) -> namesrv_pb2.BrokerRegistration:
        fields = {f: getattr(self, f) for f in self.__slots__ if f != "topics"}
        return namesrv_pb2.BrokerRegistration(**fields, topics=[
            admin_pb2.TopicConfig(name=t.name, read_queue_nums=t.read_queue_nums, write_queue_nums=t.write_queue_nums,
                                  readable=t.readable, writable=t.writable, system=t.system) for t in self.topics])


class State(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


class NameServerRegistrar:
    def __init__(self, addresses: Sequence[str], *, build: Callable[[], Registration],
                 fingerprint: Callable[[], Hashable], tls_ca_file: str = "", timeout_s: float = 3.0,
                 on_fenced: Callable[[str], None] = lambda why: None,
                 credentials: Credentials | None = None) -> None:
        self.addresses = tuple(addresses)
        self._credentials = credentials
        self._build = build
        self._fingerprint = fingerprint
        self._tls_ca_file = tls_ca_file
        self._timeout = timeout_s
        self.state = State.NEW
        self._stubs: dict[str, namesrv_pb2_grpc.NameServerServiceStub] = {}
        self._channels: list[grpc.aio.Channel] = []
        self._registered: Hashable = None  # the fingerprint of the last registration sent
        self.errors: dict[str, str | None] = {a: None for a in self.addresses}  # last failure per name server
        self.master_epoch = 0  # the newest master epoch a name server told for this broker name
        # A name server refused the registration as a replaced master (an older epoch): the broker must
        # stop taking writes.
        self._on_fenced = on_fenced
        self._lock = asyncio.Lock()

    def start(self) -> None:
        """Open the channels (on the running loop: grpc.aio channels are bound to it)."""
        if self.state is not State.NEW:
            return
        for address in self.addresses:
            channel = tls.peer_channel(address, self._tls_ca_file)
            self._channels.append(channel)
            self._stubs[address] = namesrv_pb2_grpc.NameServerServiceStub(channel)
        self.state = State.RUNNING

    async def register_all(self) -> None:
        """Send the current registration to every name server (the timer's job)."""
        if self.state is not State.RUNNING:
            return
        async with self._lock:
            fingerprint, request = self._fingerprint(), namesrv_pb2.RegisterBrokerRequest(broker=self._build().to_pb())
            # Sent, answered or not: a name server that missed it gets it on the next tick, and requests
            # awaiting sync_if_changed do not each wait out a dead name server again.
            self._registered = fingerprint
            await asyncio.gather(*(self._call(a, "RegisterBroker", request) for a in self.addresses))

    async def sync_if_changed(self) -> None:
        """Register at once when the registration changed since the last one sent (cheap otherwise)."""
        if self.state is State.RUNNING and self._fingerprint() != self._registered:
            async with self._lock:
                if self._fingerprint() == self._registered:
                    return  # a registration that waited for the lock sent it
            await self.register_all()

    async def stop(self) -> None:
        """Unregister from every name server (the broker's routes go at once), then close."""
        if self.state is not State.RUNNING:
            self.state = State.STOPPED
            return
        self.state = State.STOPPED
        r = self._build()
        request = namesrv_pb2.UnregisterBrokerRequest(broker_name=r.broker_name, broker_id=r.broker_id,
                                                      address=r.address)
        await asyncio.gather(*(self._call(a, "UnregisterBroker", request) for a in self.addresses))
        for channel in self._channels:
            await channel.close()

    async def _call(self, address: str, method: str, request) -> bool:
        try:
            metadata = signed_metadata(self._credentials) if self._credentials is not None else None
            answer = await getattr(self._stubs[address], method)(request, timeout=self._timeout, metadata=metadata)
        except grpc.RpcError as e:
            if (ERROR_CLASS_KEY, "FencedError") in tuple(e.trailing_metadata() or ()):
                self._on_fenced(e.details())
            error = f"{e.code().name}: {e.details()}"
            if self.errors[address] is None:
                log.warning("name server %s does not take the registration: %s", address, error,
                            event="namesrv_unreachable", namesrv=address, method=method)
            self.errors[address] = error
            return False
        if self.errors[address] is not None:
            log.info("name server %s answers again", address, event="namesrv_reachable", namesrv=address)
            self.errors[address] = None
        if isinstance(answer, namesrv_pb2.RegisterBrokerResponse):
            self.master_epoch = max(self.master_epoch, answer.master_epoch)
        return True
