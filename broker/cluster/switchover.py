"""A planned switchover in controller mode: `tidemark broker promote` names a replica, and its master hands
it the mastership, losing nothing (Kafka's preferred-leader election and RocketMQ 5's electMaster with a
named broker, but the successor is made to hold everything first).

The replica named (`request`, called by `tidemark broker promote` through BrokerController.promote) puts
a request into etcd, and its master (`serve`, while it is master):

1. refuses a successor that is not one of its connected replicas or not in sync (replication.py's
   in-sync set), writing the reason into the request;
2. takes no writes from then on (BrokerPermission.handing_over: a send gets NotCurrentError, UNAVAILABLE
   and retriable, so clients ask the name servers again as after a failover; commits the same) and
   waits until the successor holds everything it has: its whole log, acknowledged, every producer
   and offset change, and its queue locks, topics and groups (ReplicationSource.wait_holds_all);
3. then, in one etcd transaction (Election.hand_over), deletes its `master` key and writes `handover`
   naming the successor: while that key lives only the successor may take `master`, with the next
   epoch, so nobody else can be elected. This broker is fenced, and rejoins as the new master's replica
   (app.py's in-process restart);
4. or, when the successor did not hold everything within `switchover_timeout_ms`, takes writes again and
   refuses the request: nothing changed.

The request is `switchover` under the broker name's keys (election.py), put only while absent (a second
switchover is refused while one runs) and only while the master it asks holds the `master` key, bound to
a lease a little longer than the timeout, so that an abandoned one goes by itself. The requester revokes
that lease (the key goes with it) once it knows the outcome: it took over (ControllerMode tells it,
`took_over`), or the master's refusal is in the key.
"""

from __future__ import annotations

import asyncio
import enum
import json
import math
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

import aetcd

from tidemark.broker.cluster.election import Election
from tidemark.broker.cluster.etcd_members import MEMBER_FAILURES, end_watch
from tidemark.broker.errors import SwitchoverError
from tidemark.common.backoff import Backoff
from tidemark.common.logs import get_logger

log = get_logger("tidemark.broker.cluster.switchover")

# How often the requester looks at its request for the master's answer.
ANSWER_POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class Request:
    successor: int  # the member id of the replica to promote
    address: str
    master_epoch: int  # the epoch of the master asked: a later master ignores it
    token: str  # this request's own (a key that went and came again is another request)
    refused: str = ""  # the master's answer, when it refused

    def encode(self) -> bytes:
        return json.dumps({"successor": self.successor, "address": self.address, "master_epoch": self.master_epoch,
                           "token": self.token, "refused": self.refused}, sort_keys=True).encode()

    @staticmethod
    def decode(raw: bytes) -> Request | None:
        """The request, or None for a value that is not one (logged: nobody acts on it)."""
        try:
            doc = json.loads(raw)
            return Request(int(doc["successor"]), str(doc["address"]), int(doc["master_epoch"]), str(doc["token"]),
                           str(doc.get("refused", "")))
        except (ValueError, KeyError, TypeError) as e:
            log.warning("a switchover request in etcd is unreadable: %s", e, event="switchover_unreadable")
            return None


class Phase(enum.Enum):
    """The master's side of one request."""

    CHECKING = "checking"  # is the successor a connected, in-sync replica?
    PAUSED = "paused"  # writes refused, waiting for the successor to hold everything
    HANDED_OVER = "handed_over"  # etcd took the handover: this broker is not the master any more
    REFUSED = "refused"  # writes go on as before


class Switchover:
    """Both sides of a planned switchover for one broker (see the module docstring). Not thread-safe: the
    broker's event loop only."""

    def __init__(self, client: Any, election: Election, *, timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._election = election
        self._key = election.prefix + b"switchover"
        self._master_key = election.prefix + b"master"
        self.timeout_s = timeout_s
        self._clock = clock
        self._took_over: asyncio.Event | None = None  # while a request of this broker waits
        self.phase: Phase | None = None  # the master's side of the request it answers now

    # -- the replica named -----------------------------------------------------------------------------

    async def request(self, broker) -> int:
        """Ask this broker's master to hand it the mastership; the epoch it took over with. SwitchoverError
        (nothing changed) when it cannot."""
        c = broker.config
        if broker.replica is None:
            raise SwitchoverError(f"broker {c.broker_name} at {c.address} is the master already (epoch "
                                  f"{broker.epoch}): name one of its replicas")
        if self._took_over is not None:
            raise SwitchoverError(f"a switchover of broker {c.broker_name} to {c.address} is already running")
        # Claimed before the first await: a second call arriving meanwhile is refused here, and never
        # replaces or clears the event this one waits on.
        took_over = self._took_over = asyncio.Event()
        try:
            return await self._request(broker, took_over)
        except MEMBER_FAILURES as e:  # (the master may still hand over: it answers a request it got)
            raise SwitchoverError(f"etcd failed during the switchover of broker {c.broker_name} to {c.address} "
                                  f"({e!r}): see `tidemark cluster list` for who is master") from None
        finally:
            self._took_over = None

    async def _request(self, broker, took_over: asyncio.Event) -> int:
        c = broker.config
        master = (await self._election.view()).master
        if master is None or master.address != c.master or not broker.replica.connected:
            raise SwitchoverError(f"broker {c.broker_name} at {c.address} is not replicating from a master right "
                                  f"now (etcd names {master.address if master else 'none'}): try again once "
                                  f"it is")
        mine = Request(self._election.broker_id, c.address, master.epoch, secrets.token_hex(8))
        lease = await self._client.lease(math.ceil(self.timeout_s + 2 * self._election.ttl_s))
        t = self._client.transactions
        try:
            put, found = await self._client.transaction(
                compare=[t.version(self._key) == 0, t.value(self._master_key) == master.encode()],
                success=[t.put(self._key, mine.encode(), lease=lease.id)], failure=[t.get(self._key)])
            if not put:
                running = Request.decode(found[0][0][0]) if found and found[0] else None
                if running is not None:
                    raise SwitchoverError(f"a switchover of broker {c.broker_name} to broker {running.successor} "
                                          f"at {running.address} is already running: wait for its outcome")
                raise SwitchoverError(f"the master of broker {c.broker_name} changed meanwhile: try again")
            log.warning("asked master %s to hand its mastership to this broker", master.address,
                        event="switchover_requested", master=master.address, epoch=master.epoch)
            return await self._answer(broker, mine, took_over)
        finally:
            try:  # the request goes with it
                await self._client.revoke_lease(lease.id)
            except MEMBER_FAILURES as e:  # it expires by itself
                log.warning("could not withdraw the switchover request: %r", e, event="switchover_not_withdrawn")

    async def _answer(self, broker, mine: Request, took_over: asyncio.Event) -> int:
        # The master gives up after its timeout; etcd's and the successor's steps come after a handover.
        deadline = self._clock() + self.timeout_s + self._election.ttl_s
        while self._clock() < deadline:
            if took_over.is_set():
                return broker.epoch
            found = await self._client.get(self._key)
            now = Request.decode(found.value) if found is not None else None
            if now is None or now.token != mine.token:
                if (await self._election.view()).handover is None and not took_over.is_set():
                    raise SwitchoverError("the switchover request left etcd before the master answered it "
                                          "(its lease expired): nothing changed")
            elif now.refused:
                raise SwitchoverError(now.refused)
            try:
                async with asyncio.timeout(ANSWER_POLL_S):
                    await took_over.wait()
            except TimeoutError:
                pass
        raise SwitchoverError(f"no answer from the master within {self.timeout_s + self._election.ttl_s:g} s: "
                              f"the request is withdrawn")

    def took_over(self) -> None:
        """ControllerMode: this broker won the mastership (its request, if any, is answered)."""
        if self._took_over is not None:
            self._took_over.set()

    # -- the master -------------------------------------------------------------------------------------

    async def serve(self, broker, on_handed_over: Callable[[str], None]) -> None:
        """While this broker is the master: answer the requests addressed to it, until cancelled or handed
        over (then `on_handed_over(why)`, and it returns)."""
        backoff, failures = Backoff(first_s=0.2, max_s=2.0), 0
        while True:
            try:
                async for raw, lease in self._requests():
                    failures = 0
                    request = Request.decode(raw) if raw is not None else None
                    won = self._election.won
                    if request is None or request.refused or won is None or request.master_epoch != won.epoch:
                        continue
                    why = await self._answer_request(broker, request, raw, lease)
                    if why:
                        on_handed_over(why)
                        return
            except MEMBER_FAILURES as e:
                log.warning("etcd watch of switchover requests failed: %r; watching again", e,
                            event="switchover_watch_failed")
            await asyncio.sleep(backoff.delay(failures))
            failures += 1

    async def _requests(self) -> AsyncIterator[tuple[bytes | None, int]]:
        """The request (as stored, with its lease) at once, then at every change (None: gone)."""
        watch = await self._client.watch(self._key)
        try:
            found = await self._client.get(self._key)
            yield (found.value, found.lease) if found is not None else (None, 0)
            async for event in watch:
                if getattr(event, "kind", None) == aetcd.rtypes.EventKind.DELETE:
                    yield None, 0
                else:
                    yield event.kv.value, event.kv.lease
        finally:
            await end_watch(watch)

    async def _answer_request(self, broker, request: Request, raw: bytes, lease: int) -> str:
        """Hand over to the request's successor, or refuse it; why this broker is no longer the master
        ("" while it still is)."""
        source, permission, name = broker.replication, broker.permission, broker.config.broker_name
        who = f"broker {request.successor} at {request.address}"
        self.phase = Phase.CHECKING
        replicas = source.replica_ends()
        if request.successor not in replicas:
            return await self._refuse(request, raw, lease, (
                f"{who} is not a replica of broker {name}'s master {broker.config.address} (connected replicas: "
                f"{', '.join(map(str, sorted(replicas))) or 'none'}): nothing changed"))
        if request.successor not in source.in_sync_replicas():
            return await self._refuse(request, raw, lease, (
                f"{who} is not in sync with broker {name}'s master (it holds {replicas[request.successor]} "
                f"of {broker.store.commit_log_max_offset} bytes): nothing changed"))
        if permission.stale or not permission.writable:
            return await self._refuse(request, raw, lease, (
                f"broker {name}'s master cannot hand over now ({permission.stale or 'not writable'}): nothing "
                f"changed"))
        self.phase, permission.handing_over = Phase.PAUSED, who
        paused = self._clock()
        log.warning("handing the mastership to %s: writes wait", who, event="switchover_paused",
                    successor=request.successor)
        try:
            if not await source.wait_holds_all(request.successor, self.timeout_s):
                held = source.replica_ends().get(request.successor, 0)
                return await self._refuse(request, raw, lease, (
                    f"{who} did not catch up with broker {name}'s master within {self.timeout_s:g} s (it holds "
                    f"{held} of {broker.store.commit_log_max_offset} bytes; the master's producer, offset, queue "
                    f"lock, topic and group changes count too): the master takes writes again, nothing changed"))
            in_sync = frozenset({self._election.broker_id, request.successor})
            t = self._client.transactions
            try:
                done = await self._election.hand_over(request.successor, request.address, in_sync=in_sync,
                                                      compare=[t.value(self._key) == raw])
            except MEMBER_FAILURES as e:  # it may have been done: only a new master may write from now on
                self.phase = Phase.HANDED_OVER
                return f"etcd failed while handing the mastership to {who} ({e!r}); it may have been done"
            if not done:  # the request was withdrawn, or the key is not this broker's: as before
                self.phase = Phase.REFUSED
                log.warning("the switchover to %s was withdrawn before the handover", who,
                            event="switchover_withdrawn")
                return ""
            self.phase = Phase.HANDED_OVER
            log.warning("handed the mastership to %s after %.3f s without writes", who, self._clock() - paused,
                        event="switchover_done", successor=request.successor, paused_s=self._clock() - paused)
            return f"handed the mastership to {who} (a planned switchover)"
        finally:
            if self.phase is not Phase.HANDED_OVER:
                permission.handing_over = ""

    async def _refuse(self, request: Request, raw: bytes, lease: int, why: str) -> str:
        self.phase = Phase.REFUSED
        log.warning("switchover refused: %s", why, event="switchover_refused", successor=request.successor)
        t = self._client.transactions
        try:
            await self._client.transaction(compare=[t.value(self._key) == raw],
                                           success=[t.put(self._key, replace(request, refused=why).encode(),
                                                          lease=lease)], failure=[])
        except MEMBER_FAILURES as e:  # the requester gives up by itself
            log.warning("could not answer the switchover request: %r", e, event="switchover_unanswered")
        return ""
