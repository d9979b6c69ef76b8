"""BrokerCluster: the brokers a client talks to, and which queues of a topic each one holds.

Two ways to find the brokers:

- **name servers** (`namesrv`, RocketMQ's way): the brokers register with
  them; the client asks any name server for the cluster (which broker name
  is at which address) and for each topic's route. When no name server
  answers, the client keeps the brokers and routes it last had, however old,
  and keeps working with them.
- **a fixed list of brokers**: the client learns each broker's name from
  GetBrokerInfo and merges the brokers' GetRoute answers into a topic route
  (a topic may have queues on several brokers).

Either way routes are cached for route_refresh_interval_s, like RocketMQ's
periodic route refresh.

**Failover to replicas** (RocketMQ's read from slave): when a call finds a
master unreachable and its broker name has a replica, `connection(name)`
answers the replica's connection from then on, so consumers keep fetching,
heartbeating and committing there (the replica holds the commits and hands
them back to the master when it returns), and `write_queues` leaves the
name out, so producers send to the other broker names. The master is probed
at most every PROBE_INTERVAL_S while it is away; the first answer switches
back. A read without a group (`read`) that finds the master unreachable goes
to the replica at once, as a grouped reader's next attempt would.

**While no queue takes writes** (a master down, a replica being promoted),
waiting for the periodic refresh would keep producers down for up to
route_refresh_interval_s after the cluster healed; instead the route, and for
a send pinned to a broker name the cluster view, are asked for again at once,
at most once per ROUTE_RETRY_INTERVAL_S each, so a dead cluster is not
hammered. That is an outage (UnavailableError, retriable), not an input error.

**A master replaced** (a controller's election, a promotion): every call that fails retriably on a
broker name's connection (a timeout, a refusal as not the master's, a broken stream: whoever made
it, a producer, a consumer's fetch, commit or lock, an admin call) makes the name suspect (`suspect`),
and the name servers are asked where its master is now, every ROUTE_RETRY_INTERVAL_S for up to a
request timeout, at once and in the background (`_resolve`, one look at a time per name). Whenever a
name's serving address changes, by that look or by any route or cluster refresh, `moves` tells those
listening (moves.py: a consumer's fetch streams and membership move there at once): nobody waits for
a periodic refresh, a rebalance or a reconnect back-off to find the new master. A failover to a replica and
the failback to the master are such changes too.

**Unreachable is not missing**: NotFoundError only when a broker (or a name
server) that answered says the topic does not exist; when the brokers that
might hold it cannot be asked, the answer is a retriable UnavailableError.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from tidemark.client.errors import (
    BrokerUnreachableError,
    ClientStateError,
    InvalidArgumentError,
    NotFoundError,
    TidemarkError,
    UnavailableError,
)
from tidemark.client.message import MessageQueue
from tidemark.client.remoting.connection import BrokerConnection
from tidemark.client.remoting.moves import MasterMoves
from tidemark.client.remoting.namesrv import NameServerClient
from tidemark.client.remoting.routes import RetryGate, merged_route
from tidemark.client.security import TlsSettings
from tidemark.client.types import ClusterBroker, TopicRoute
from tidemark.common.auth import Credentials
from tidemark.common.logs import get_logger
from tidemark.common.scheduler import cancel_and_wait

if TYPE_CHECKING:
    from tidemark.client.settings import ClientSettings

log = get_logger("tidemark.client.cluster")

PROBE_INTERVAL_S = 1.0
# How often a route without a writable queue, or the cluster view while a master is away, is asked for
# again out of schedule (per topic, per broker name).
ROUTE_RETRY_INTERVAL_S = 0.25
# How long a suspect master gets to answer before the name servers are asked where writes go now.
SUSPECT_PROBE_S = 0.5

T = TypeVar("T")


class BrokerCluster:
    def __init__(self, addresses: Sequence[str], *, namesrv: Sequence[str] = (), timeout_s: float = 3.0,
                 route_ttl_s: float = 30.0, credentials: Credentials | None = None,
                 tls: TlsSettings | None = None) -> None:
        self._timeout = timeout_s
        self._route_ttl = route_ttl_s
        self._credentials = credentials
        self._tls = tls
        # With name servers the brokers come from them, and `addresses` is not used.
        self.namesrv = (NameServerClient(namesrv, timeout_s=timeout_s, credentials=credentials, tls=tls)
                        if namesrv else None)
        self._by_address: dict[str, BrokerConnection] = {} if namesrv else {a: self._connect(a) for a in addresses}
        self._by_name: dict[str, BrokerConnection] = {}
        self._replicas: dict[str, list[str]] = {}  # broker name -> replica addresses, lowest id first
        self._down: dict[str, float] = {}  # broker name -> when its master was last probed, while it is away
        self._cluster_at: float | None = None  # when the name servers last told the cluster view
        self._routes: dict[str, tuple[float, TopicRoute]] = {}
        self._reported: set[str] = set()  # listed addresses already warned about as unreachable
        self._retry = RetryGate(ROUTE_RETRY_INTERVAL_S)  # out-of-schedule refreshes while writes cannot go
        # Broker names whose master did not answer in time or said it may no longer be the master: the next
        # master_connection finds out where writes go first (`_resolve`, one at a time per name).
        self._suspect: set[str] = set()
        self._resolving: dict[str, asyncio.Future[BrokerConnection]] = {}
        self.moves = MasterMoves()  # told whenever another address serves a broker name
        self._closed = False
        # The discovery under way, shared by every caller that asks meanwhile (a consumer's start asks in
        # three places at once): queued one behind the other, each waited its own request timeout in turn
        # against brokers that do not answer.
        self._discovering: asyncio.Future[dict[str, BrokerConnection]] | None = None
        self._discoveries = 0  # how many have begun

    @classmethod
    def for_settings(cls, s: ClientSettings) -> BrokerCluster:
        """The cluster a client component with these settings talks to."""
        return cls(s.brokers, namesrv=s.namesrv, timeout_s=s.request_timeout_s, route_ttl_s=s.route_refresh_interval_s,
                   credentials=s.credentials, tls=s.tls)

    @classmethod
    async def connect(cls, s: ClientSettings) -> BrokerCluster:
        """The cluster for these settings with its brokers discovered; closed again when discovery fails
        (UnavailableError when no broker answers)."""
        cluster = cls.for_settings(s)
        try:
            await cluster.discover()
        except BaseException:
            await cluster.close()
            raise
        return cluster

    def _connect(self, address: str) -> BrokerConnection:
        """Every connection of the cluster dials the same way: the same credentials and TLS settings."""
        return BrokerConnection(address, timeout_s=self._timeout, credentials=self._credentials, tls=self._tls,
                                on_unavailable=self._unavailable, on_retriable=self._failed)

    def _failed(self, conn: BrokerConnection, error: TidemarkError) -> None:
        """A call or stream on `conn` failed retriably: the master of its name may have been replaced (the
        name servers are asked at once, `suspect`), whichever part of the client made the call."""
        if conn.broker_name and not self._closed:
            self.suspect(conn.broker_name)

    def _unavailable(self, conn: BrokerConnection) -> None:
        """A call found `conn` unreachable: when it is a master with a replica, fail over to the replica."""
        name = conn.broker_name
        if name and self._by_name.get(name) is conn and self._replicas.get(name) and name not in self._down:
            self._down[name] = time.monotonic()
            log.warning("master of %s at %s is unreachable; reading from its replica %s", name, conn.address,
                        self._replicas[name][0], event="broker_failover", broker=name)
            self.moves.tell(name, self._replicas[name][0])

    @property
    def addresses(self) -> list[str]:
        return list(self._by_address)

    def connections(self) -> list[BrokerConnection]:
        return list(self._by_address.values())

    async def close(self) -> None:
        self._closed = True
        self.moves.clear()
        if self._discovering is not None:
            await cancel_and_wait(self._discovering)
        for resolving in list(self._resolving.values()):
            resolving.cancel()
        for conn in self._by_address.values():
            await conn.close()
        self._by_address.clear()
        self._by_name.clear()
        if self.namesrv is not None:
            await self.namesrv.close()

    def _adopt(self, broker_name: str, address: str, before: BrokerConnection | None = None) -> BrokerConnection:
        """The connection serving broker_name from now on (a name may move to a new address); `before` is
        the one that served it until now (default: the current one)."""
        conn = self.connection_at(address)
        conn.broker_name = broker_name
        before = self._by_name.get(broker_name) if before is None else before
        self._by_name[broker_name] = conn
        if before is not conn:
            self._down.pop(broker_name, None)  # a new serving address: nothing to fail over from
        if before is not None and before is not conn:
            self._moved(broker_name, before, conn)
        return conn

    def _moved(self, name: str, before: BrokerConnection, now: BrokerConnection) -> None:
        """Another address serves `name` now. The replicas known for it are out of date (the new master
        was one of them, the old one may come back as one): the new master leaves the list and the next
        discover() reads the cluster view again, so that a failover of the new master never goes to
        itself. Then the listeners hear of it."""
        replicas = self._replicas.get(name)
        if replicas and now.address in replicas:
            replicas.remove(now.address)
        self._cluster_at = None
        self._suspect.discard(name)
        log.info("master of %s moved from %s to %s", name, before.address, now.address, event="master_moved",
                 broker=name)
        self.moves.tell(name, now.address)

    async def discover(self, *, refresh: bool = False) -> dict[str, BrokerConnection]:
        """Learn the name of every reachable broker; UnavailableError if none answers. A call made while a
        discovery is under way has that one's outcome. Once the cluster is closed, ClientStateError: a
        discovery begun then would open connections nobody closes."""
        self._check_open()
        if self._by_name and (self._cluster_fresh() and not refresh if self.namesrv is not None
                              else all(c.broker_name is not None for c in self._by_address.values())):
            return dict(self._by_name)  # nothing to ask
        running = self._discovering
        if running is not None and refresh:
            # Under way since before this call: it may have asked before what made the caller refresh (a
            # new master named). Once it ends, a discovery of our own, unless another began meanwhile.
            began = self._discoveries
            await asyncio.wait((running,))
            self._check_open()  # (close() cancelled it)
            running = self._discovering if self._discoveries > began else None
        if running is None:
            running = self._discovering = asyncio.ensure_future(
                self._discover_from_namesrv() if self.namesrv is not None else self._discover_listed())
            self._discoveries += 1
            running.add_done_callback(self._discovered)
        try:
            return dict(await asyncio.shield(running))
        except asyncio.CancelledError:
            if running.cancelled():  # close() cancelled the discovery, not this caller's task
                self._check_open()
            raise

    def _check_open(self, what: str = "nothing is discovered any more") -> None:
        if self._closed:
            raise ClientStateError(f"the broker cluster is closed: {what}")

    def _discovered(self, done: asyncio.Future[dict[str, BrokerConnection]]) -> None:
        if self._discovering is done:
            self._discovering = None
        if not done.cancelled():
            done.exception()  # (retrieved: every caller has it raised)

    def _cluster_fresh(self) -> bool:
        return self._cluster_at is not None and time.monotonic() - self._cluster_at < self._route_ttl

    async def _discover_listed(self) -> dict[str, BrokerConnection]:
        """The names of the listed brokers not known yet, from their GetBrokerInfo."""
        missing = [c for c in self._by_address.values() if c.broker_name is None]
        results = await asyncio.gather(*(c.broker_info() for c in missing), return_exceptions=True)
        failures: list[TidemarkError] = []
        unreachable: list[tuple[str, TidemarkError]] = []
        for conn, result in zip(missing, results, strict=True):
            if isinstance(result, TidemarkError):
                failures.append(result)
                unreachable.append((conn.address, result))
                continue
            if isinstance(result, BaseException):
                raise result
            if result.broker_id:  # a replica: where reads go while its master is away
                replicas = self._replicas.setdefault(result.broker_name, [])
                if conn.address not in replicas:
                    replicas.append(conn.address)
                self._by_name.setdefault(result.broker_name, conn)  # serves until its master is listed
                continue
            other = self._by_name.get(result.broker_name)
            if other is not None and other.info is not None and other.info.broker_id:
                other = None  # the replica stood in for its master, listed too
            if other is not None and other is not conn:
                raise InvalidArgumentError(
                    f"brokers {other.address} and {conn.address} both call themselves {result.broker_name!r}")
            self._by_name[result.broker_name] = conn
        if not self._by_name:
            if len(failures) == 1:
                raise failures[0]  # its message names the broker and why (a refused TLS handshake...)
            why = "; ".join(str(f) for f in failures)
            # Every broker refused the same way (credentials, TLS): that kind, not a retriable outage.
            kinds = {type(f) for f in failures}
            kind = kinds.pop() if len(kinds) == 1 else UnavailableError
            raise kind(f"no broker reachable at {', '.join(self._by_address)}" + (f": {why}" if why else ""),
                       code=failures[0].code if failures else None)
        self._warn_unreachable(unreachable)
        return dict(self._by_name)

    def _warn_unreachable(self, unreachable: list[tuple[str, TidemarkError]]) -> None:
        """A warning for each listed broker that does not answer while others do, once per address (every
        call discovers again); when none answers, the error raised says it instead."""
        for address, error in unreachable:
            if address not in self._reported:
                self._reported.add(address)
                log.warning("broker %s does not answer; going on with the others (%s)", address, error,
                            event="broker_unreachable", addr=address)

    async def _discover_from_namesrv(self) -> dict[str, BrokerConnection]:
        """The brokers the name servers know (a master per name, or its lowest replica while it has
        none), asked again once route_ttl_s old; the last view while no name server answers."""
        try:
            brokers = await self.namesrv.cluster()
        except UnavailableError as e:
            if not self._by_name:
                raise
            log.warning("no name server answers; keeping the brokers known before", event="namesrv_unreachable",
                        error=e, brokers=len(self._by_name))
            return dict(self._by_name)
        serving: dict[str, str] = {}
        replicas: dict[str, list[str]] = {}
        for b in sorted(brokers, key=lambda b: b.broker_id):
            if b.broker_name not in serving:
                serving[b.broker_name] = b.address  # the lowest id serves: the master while it is registered
            else:
                replicas.setdefault(b.broker_name, []).append(b.address)
        self._replicas = replicas
        if not serving:
            raise UnavailableError(f"the name servers ({', '.join(self.namesrv.addresses)}) know no broker yet")
        previous, self._by_name = self._by_name, {}
        for name, address in serving.items():
            kept = previous.get(name)
            if kept is not None and kept.address == address:
                self._by_name[name] = kept  # unchanged: a failover under way stays as it is
            else:
                self._adopt(name, address, kept)
        self._cluster_at = time.monotonic()
        return dict(self._by_name)

    async def cluster(self) -> list[ClusterBroker]:
        """Every broker the name servers know; without name servers, the brokers of the list as they
        describe themselves."""
        if self.namesrv is not None:
            return await self.namesrv.cluster()
        out = []
        for conn in (await self.discover()).values():
            info = await conn.broker_info()
            out.append(ClusterBroker("", info.broker_name, 0, info.broker_addr, info.version, info.readable,
                                     info.writable, None, 0, None))
        return sorted(out, key=lambda b: b.broker_name)

    async def connection(self, broker_name: str) -> BrokerConnection:
        """The connection serving broker_name: its master, or its replica while the master is away.

        While a call to the name just failed and the name servers are being asked where its master is
        (`suspect`), the answer waits for theirs (at most a request timeout, and not while a replica stands
        in): the next call (a rebalance's next topic, a commit, an admin call) goes to the master they name,
        not once more to one that is paused or replaced, to time out there again."""
        resolving = self._resolving.get(broker_name)
        if resolving is not None and broker_name not in self._down:
            await asyncio.wait((resolving,))  # its outcome is in _by_name; a failure of the look is not ours
        return await self._serving(broker_name)

    async def _serving(self, broker_name: str) -> BrokerConnection:
        conn = self._by_name.get(broker_name)
        if conn is None:
            await self.discover(refresh=True)
            conn = self._by_name.get(broker_name)
        if conn is None:
            raise NotFoundError(f"broker {broker_name!r} is not among the known brokers ({', '.join(self._by_name)})")
        if broker_name in self._down:
            return await self._failover(broker_name, conn)
        return conn

    def connection_at(self, address: str) -> BrokerConnection:
        """The connection to one address, whatever it serves (a replica to promote, a name's new master).
        Once the cluster is closed, ClientStateError, also to a call that was waiting when close() ran (a
        route, a master's probe): a connection opened then is one nobody closes, and one it had is closed."""
        self._check_open("no connection is opened any more")
        conn = self._by_address.get(address)
        if conn is None:
            conn = self._by_address[address] = self._connect(address)
        return conn

    async def serving(self) -> dict[str, BrokerConnection]:
        """Every broker name with the connection serving it now (its replica while its master is away)."""
        return {name: await self.connection(name) for name in await self.discover()}

    def suspect(self, broker_name: str) -> None:
        """A call to the master of `broker_name` timed out, broke off or was refused as not the master's:
        paused, partitioned or replaced, and the name servers may know a new one already. Where it is now is
        found out at once, in the background (`_resolve`), and the next master_connection waits for that
        answer: a controller elects a new master in seconds, and nothing else would tell a client whose
        connection still stands. Its fetch streams and commits follow by `moves`."""
        self._suspect.add(broker_name)
        if self.namesrv is not None and not self._closed:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return  # off the loop: the next master_connection looks
            self._resolving_of(broker_name)

    def _resolving_of(self, name: str) -> asyncio.Future[BrokerConnection] | None:
        """The look at where a suspect name's master is now: the one under way, or a new one."""
        resolving = self._resolving.get(name)
        conn = self._by_name.get(name)  # the master's, not a replica standing in for it
        if resolving is None and conn is not None:  # one look at a time, however many wait for it
            resolving = self._resolving[name] = asyncio.ensure_future(self._resolve(name, conn))
            resolving.add_done_callback(lambda _f, n=name: self._resolving.pop(n, None))
        return resolving

    async def _resolve(self, name: str, conn: BrokerConnection) -> BrokerConnection:
        """Where the writes of a suspect master go: back to it once it answers as a writable master, to the
        address the name servers name once it changes (a takeover), else, after a request timeout, to it
        again (the caller's attempt then says what is wrong)."""
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                info = await conn.broker_info(timeout=min(self._timeout, SUSPECT_PROBE_S))
                if info.writable and not info.fenced and not info.broker_id:
                    self._suspect.discard(name)
                    return conn
            except TidemarkError:
                pass  # paused, cut off or gone: the name servers may know better
            try:
                await self.discover(refresh=True)
            except TidemarkError:
                pass
            now = self._by_name.get(name, conn)
            if now is not conn:  # _adopt told the listeners
                self._suspect.discard(name)
                return now
            if time.monotonic() > deadline:
                return conn
            await asyncio.sleep(ROUTE_RETRY_INTERVAL_S)

    def is_down(self, broker_name: str) -> bool:
        """Whether the master of `broker_name` is failed over to its replica (takes no writes now)."""
        return broker_name in self._down

    async def master_connection(self, broker_name: str) -> BrokerConnection:
        """The master's connection, for writes: a retriable UnavailableError while it is away (a replica
        takes no writes; the sender picks another broker's queue). While it is away the name servers are
        asked again (at most every ROUTE_RETRY_INTERVAL_S): a promoted replica is the master at once."""
        conn = await self._serving(broker_name)
        # Failed over to a replica, the name servers are asked below instead (and no write waits for them).
        suspect = broker_name in self._suspect and self.namesrv is not None and broker_name not in self._down
        resolving = self._resolving_of(broker_name) if suspect else None
        if resolving is not None:
            conn = await asyncio.shield(resolving)
        if broker_name in self._down and self.namesrv is not None and self._retry.try_now(("master", broker_name)):
            await self.discover(refresh=True)  # a new address for the name ends the failover
            conn = await self.connection(broker_name)
        if broker_name in self._down:
            raise BrokerUnreachableError(f"the master of {broker_name} is unreachable; its replica takes no writes")
        return conn

    async def read(self, broker_name: str, call: Callable[[BrokerConnection], Awaitable[T]]) -> T:
        """call() on the connection serving reads of broker_name, for a read without a group. When it finds
        the master unreachable and the name fails over to its replica, the call goes to the replica at
        once, as a grouped reader's next fetch does (nothing but the caller would retry it)."""
        conn = await self.connection(broker_name)
        try:
            return await call(conn)
        except UnavailableError:
            standby = await self.connection(broker_name)
            if standby is conn:
                raise
            return await call(standby)

    async def _failover(self, name: str, master: BrokerConnection) -> BrokerConnection:
        now = time.monotonic()
        if now - self._down[name] >= PROBE_INTERVAL_S:
            self._down[name] = now
            try:
                await master.broker_info(timeout=min(self._timeout, 0.5))
            except TidemarkError:
                pass
            else:
                self._down.pop(name, None)
                log.info("master of %s at %s answers again", name, master.address, event="broker_failback",
                         broker=name)
                # Told like any other change of the serving address: a fetch stream left on the replica would
                # keep the queues this client locks on the master from now on waiting there for a lock the
                # replica never grants (the fault checker's controller scenario, seed 21912).
                self.moves.tell(name, master.address)
                return master
        if not self._replicas.get(name):
            return master  # no replica known (any more): the master's own errors say why
        replica = self.connection_at(self._replicas[name][0])
        replica.broker_name = name
        return replica

    async def any_connection(self) -> BrokerConnection:
        names = self._by_name or await self.discover()
        return next(iter(names.values()))

    def route_known(self, topic: str) -> bool:
        """Whether route(topic) would answer from the cache now (read within the route TTL), without a call."""
        cached = self._routes.get(topic)
        return cached is not None and time.monotonic() - cached[0] < self._route_ttl

    async def route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        cached = self._routes.get(topic)
        if cached is not None and not refresh and time.monotonic() - cached[0] < self._route_ttl:
            return cached[1]
        if self.namesrv is not None:
            return await self._route_from_namesrv(topic, cached)
        # While the brokers' names are still unknown (a client's start), the route is asked of every listed
        # broker beside its GetBrokerInfo, on the connection being made: one round trip instead of two.
        # Only the answers of the connections discovery picks are used.
        early = ({a: asyncio.ensure_future(c.route(topic)) for a, c in self._by_address.items()}
                 if any(c.broker_name is None for c in self._by_address.values()) else {})
        try:
            brokers = await self.discover()
            answers = await asyncio.gather(*(early.pop(c.address, None) or c.route(topic) for c in brokers.values()),
                                           return_exceptions=True)
        finally:
            await cancel_and_wait(*early.values())
        try:
            route = merged_route(topic, ((f"{name} ({c.address})", answer) for (name, c), answer
                                         in zip(brokers.items(), answers, strict=True)))
        except TidemarkError:
            self._routes.pop(topic, None)
            raise
        for d in route.queue_datas:
            if d.broker_name not in self._by_name and d.broker_addr not in self._by_address:
                conn = self.connection_at(d.broker_addr)
                conn.broker_name = d.broker_name
                self._by_name[d.broker_name] = conn
        self._routes[topic] = (time.monotonic(), route)
        return route

    async def _route_from_namesrv(self, topic: str, cached: tuple[float, TopicRoute] | None) -> TopicRoute:
        try:
            route = await self.namesrv.route(topic)
        except NotFoundError:
            self._routes.pop(topic, None)
            raise
        except UnavailableError as e:
            if cached is None:
                raise
            log.warning("no name server answers; keeping the last route", event="namesrv_unreachable",
                        topic=topic, error=e)
            return cached[1]
        for d in route.queue_datas:
            if self._by_name.get(d.broker_name) is None or self._by_name[d.broker_name].address != d.broker_addr:
                self._adopt(d.broker_name, d.broker_addr)
        route = TopicRoute(topic, tuple(sorted(route.queue_datas, key=lambda d: d.broker_name)))
        self._routes[topic] = (time.monotonic(), route)
        return route

    def forget_route(self, topic: str) -> None:
        self._routes.pop(topic, None)

    async def read_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        return (await self.route(topic, refresh=refresh)).read_queues()

    async def write_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        """The topic's writable queues, but those of a broker name whose master is away. With none, the
        masters that are away are probed and the route asked for again at once (at most every
        ROUTE_RETRY_INTERVAL_S per topic): a promotion or a master's return ends the wait then."""
        route = await self.route(topic, refresh=refresh)
        queues = self._writable(route)
        if not queues and self._retry.try_now(("route", topic)):
            for name in {d.broker_name for d in route.queue_datas if d.broker_name in self._down}:
                await self.connection(name)  # probes the master (at most every PROBE_INTERVAL_S)
            route = await self.route(topic, refresh=True)
            queues = self._writable(route)
        return queues

    def _writable(self, route: TopicRoute) -> list[MessageQueue]:
        return [mq for mq in route.write_queues() if mq.broker_name not in self._down]

    async def await_write_queues(self, topic: str, deadline: float) -> list[MessageQueue]:
        """The topic's writable queues; while it has none (a failover under way), asked for again every
        ROUTE_RETRY_INTERVAL_S until `deadline` (time.monotonic()), then a retriable UnavailableError
        saying why none takes writes."""
        while True:
            queues = await self.write_queues(topic)
            if queues:
                return queues
            left = deadline - time.monotonic()
            if left <= 0:
                raise self.no_writable_queue(topic)
            await asyncio.sleep(min(left, max(self._retry.wait_s(("route", topic)), 0.01)))

    async def write_queue(self, topic: str, queue_id: int) -> MessageQueue:
        """The writable queue `queue_id` of the topic (of the first broker name with one): InvalidArgumentError
        when the topic has no such queue, a retriable UnavailableError when it has but takes no writes now."""
        queues = [q for q in await self.write_queues(topic, refresh=True) if q.queue_id == queue_id]
        if queues:
            return queues[0]
        route = await self.route(topic)
        if not any(queue_id < max(d.read_queue_nums, d.write_queue_nums) for d in route.queue_datas):
            raise InvalidArgumentError(f"topic {topic!r} has no writable queue {queue_id}")
        raise self.no_writable_queue(topic, queue_id)

    def no_writable_queue(self, topic: str, queue_id: int | None = None) -> UnavailableError:
        """The error for a topic whose queues exist but none takes writes now, saying why per broker name."""
        cached = self._routes.get(topic)
        reasons = []
        for d in cached[1].queue_datas if cached is not None else ():
            if d.broker_name in self._down:
                reasons.append(f"the master of {d.broker_name} is unreachable and its replica takes no writes")
            elif not d.writable:
                reasons.append(f"{d.broker_name} takes no writes (a replica standing in for a master that is down, "
                               "or the topic's or broker's permission)")
        which = "" if queue_id is None else f" {queue_id}"
        return UnavailableError(f"topic {topic!r} has no writable queue{which} now: "
                                f"{'; '.join(reasons) or 'none of its brokers takes writes'}; a failover or "
                                "promotion may be under way: retry later")
