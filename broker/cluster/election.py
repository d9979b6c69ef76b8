"""Who is the master of a broker name, decided by etcd (controller mode, `--controller etcd://...`).

Tidemark writes no consensus of its own: etcd's leases, compare-and-swap transactions and watches decide,
as RocketMQ 5's controller (DLedger) and Kafka's KRaft decide for theirs. Under
`/tidemark/<cluster>/<broker name>/` etcd holds:

- `master`: the master's broker id, address and epoch, bound to the master's lease. The master renews the
  lease every third of its TTL; a master that stops (killed, paused, cut off from etcd) loses the key when
  the lease expires, and only then can another broker win.
- `epoch`: the last master epoch handed out, a plain key that survives every restart of every broker and
  of etcd. Each election writes epoch + 1 in the same transaction that takes `master`, so two masters of
  one name never share an epoch, and the name servers and replicas fence the lower one.
- `in_sync`: the broker ids the master last saw in sync (RocketMQ 5's SyncStateSet, Kafka's ISR), written
  only under the master's own `master` key. Only a broker in it may take over: one that missed
  acknowledged records cannot become master. Before the first election (epoch 0) every broker may.
- `handover`: written by a master handing its mastership to one named replica (a planned switchover,
  switchover.py) in the transaction that deletes its `master` key, bound to a lease of one TTL. While it
  lives only the named successor may take `master` (deleting it in the same transaction), whatever the
  others' logs; the others stand back until the successor took over or the key expired with it.
- `candidates/<id>`: how far the log of each broker campaigning now goes, bound to a short lease. A send
  is acknowledged once `min_sync_replicas` replicas hold it, so with more replicas than that an in-sync
  one may lack the newest acknowledged records: of the live candidates, the one whose log goes furthest
  takes over (ties: the lowest id), and the others wait for it (at most a lease: it may have died).
  A candidate also waits for every other broker of the in-sync set but the last master to stand (at most
  a lease: it may be down with the master), so one that stands late, its process or etcd slow, is still
  compared: a first look after a fixed window let a shorter log win on a loaded machine.
- `last_master`: the id of the broker that last took `master` (a plain key), which the candidates do not
  wait for: it is the one that went (or, fenced and back, lets the others go first: controller_mode.py).

A master stops writing before etcd can let another take over: etcd expires a lease TTL after the last
renewal it received, which is after the renewal was sent, so a master that has not had a renewal
answered takes no writes from `ttl_s - FENCE_MARGIN_S` after it sent the last one that was (`Lease`).
If etcd then answers a renewal with the lease alive, nobody can have taken the key meanwhile and writes
go on; if it says the lease is gone, the broker is fenced for good (controller_mode.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aetcd

from tidemark.broker.cluster.etcd_members import MEMBER_FAILURES, end_watch
from tidemark.broker.errors import FailedPreconditionError, InvalidArgumentError
from tidemark.common.logs import get_logger
from tidemark.common.protocol import split_host_port

log = get_logger("tidemark.broker.election")

# A master stops taking writes this long before the soonest its lease can expire at etcd.
FENCE_MARGIN_S = 1.0
# How long candidates wait for each other to stand before comparing logs, and between looks.
CANDIDATE_WINDOW_S = 0.3
# Before the first election (epoch 0) the first look comes later: brokers of a group moved to controller
# mode with their data start at about the same time, and the one with the longest log must be among them.
FIRST_ELECTION_WINDOW_S = 1.0
# How often a broker standing back for a handover looks whether the successor took over (or the key expired).
HANDOVER_POLL_S = 0.05
MIN_TTL_S = 2


@dataclass(frozen=True, slots=True)
class Master:
    broker_id: int
    address: str
    epoch: int

    def encode(self) -> bytes:
        return json.dumps({"broker_id": self.broker_id, "address": self.address, "epoch": self.epoch},
                          sort_keys=True).encode()

    @staticmethod
    def decode(raw: bytes) -> Master:
        doc = json.loads(raw)
        return Master(int(doc["broker_id"]), str(doc["address"]), int(doc["epoch"]))


@dataclass(frozen=True, slots=True)
class Handover:
    """A master's handing over to `successor` (switchover.py), as stored (`raw`, for the successor's
    compare-and-swap)."""

    successor: int
    address: str
    raw: bytes

    @staticmethod
    def encode(successor: int, address: str, epoch: int) -> bytes:
        return json.dumps({"successor": successor, "address": address, "from_epoch": epoch}, sort_keys=True).encode()

    @staticmethod
    def decode(raw: bytes) -> Handover:
        doc = json.loads(raw)
        return Handover(int(doc["successor"]), str(doc["address"]), raw)


@dataclass(frozen=True, slots=True)
class View:
    """What etcd says about a broker name at one revision."""

    master: Master | None
    epoch: int  # the last epoch handed out (0: never an election)
    in_sync: frozenset[int]
    epoch_revision: int  # mod revision of the epoch key (0: absent), for the next compare-and-swap
    handover: Handover | None = None  # a planned switchover's successor, until it takes over
    last_master: int | None = None  # who took `master` last (None: nobody yet, or written before the key was)


def parse_controller(url: str) -> list[tuple[str, int]]:
    """`etcd://HOST:PORT[,HOST:PORT...]` as (host, port) pairs; InvalidArgumentError with the reason."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme != "etcd" or not rest:
        raise InvalidArgumentError(f"controller {url!r} must be etcd://HOST:PORT[,HOST:PORT...]")
    endpoints = []
    for part in rest.rstrip("/").split(","):
        found = split_host_port(part)
        if found is None:
            raise InvalidArgumentError(f"controller endpoint {part!r} must be HOST:PORT")
        endpoints.append((found[0].strip("[]"), found[1]))
    return endpoints


class Election:
    """One broker's side of its name's election, through `client` (an aetcd.Client, or EtcdMembers over
    several members). Not thread-safe: the broker's event loop only."""

    def __init__(self, client: Any, cluster: str, broker_name: str, broker_id: int, address: str, *,
                 ttl_s: int = 3, clock: Callable[[], float] = time.monotonic) -> None:
        if ttl_s < MIN_TTL_S:
            raise InvalidArgumentError(f"the master lease must last at least {MIN_TTL_S} s, got {ttl_s}")
        self._client = client
        prefix = f"/tidemark/{cluster}/{broker_name}/"
        self.prefix = prefix.encode()  # the broker name's keys (switchover.py keeps its request here too)
        self._candidates = (prefix + "candidates/").encode()
        self._master_key, self._epoch_key, self._in_sync_key, self._handover_key, self._last_master_key = (
            (prefix + name).encode() for name in ("master", "epoch", "in_sync", "handover", "last_master"))
        self.broker_id = broker_id
        self.address = address
        self.ttl_s = ttl_s
        self._clock = clock
        self.lease: Lease | None = None  # while this broker is master
        self.won: Master | None = None

    async def view(self) -> View:
        keys = (self._master_key, self._epoch_key, self._in_sync_key, self._handover_key, self._last_master_key)
        ok, (master, epoch, in_sync, handover, last_master) = await self._client.transaction(
            compare=[], success=[self._client.transactions.get(key) for key in keys], failure=[])
        epoch_value, epoch_revision = (int(epoch[0][0]), epoch[0][1].mod_revision) if epoch else (0, 0)
        return View(master=Master.decode(master[0][0]) if master else None, epoch=epoch_value,
                    in_sync=frozenset(json.loads(in_sync[0][0])) if in_sync else frozenset(),
                    epoch_revision=epoch_revision, handover=Handover.decode(handover[0][0]) if handover else None,
                    last_master=int(last_master[0][0]) if last_master else None)

    def eligible(self, view: View) -> bool:
        """Whether this broker may take over: in the last master's in-sync set, or no election yet."""
        return view.epoch == 0 or self.broker_id in view.in_sync

    async def campaign(self, epoch_floor: int = 0, log_end: int | None = None) -> Master | None:
        """Become the master when there is none and this broker may; the new Master (with its epoch, above
        `epoch_floor` too: an epoch this broker or its name servers saw before etcd decided), or None when
        another holds the key, this broker is not eligible, or another won the race. With `log_end` (where
        this broker's commit log ends) it first stands as a candidate, and goes on only when no live
        eligible candidate's log goes further (see the module docstring). While a handover names another
        broker it waits for that one to take over (or for the key to expire: the successor died)."""
        view = await self.view()
        while view.master is None and view.handover is not None and view.handover.successor != self.broker_id:
            await asyncio.sleep(HANDOVER_POLL_S)
            view = await self.view()
        if view.master is None and view.handover is not None:  # named by the master that handed over
            return await self._take(view, epoch_floor)
        if view.master is not None or not self.eligible(view):
            return None
        if log_end is not None:
            view = await self._stand(log_end, FIRST_ELECTION_WINDOW_S if view.epoch == 0 else CANDIDATE_WINDOW_S)
            if view is None:
                return None
        return await self._take(view, epoch_floor)

    async def _stand(self, log_end: int, window_s: float) -> View | None:
        """As a candidate: the view to campaign on once this broker is the best live candidate and every
        other broker of the in-sync set but the last master stood (or, within a lease, the better ones did
        not take over or the others did not stand), None once someone took the key or this broker may not
        (any more). The others have `window_s` to stand before the first look."""
        lease = await self._client.lease(self.ttl_s)
        try:
            await self._client.put(self._candidates + str(self.broker_id).encode(),
                                   json.dumps({"log_end": log_end}).encode(), lease=lease.id)
            deadline = self._clock() + self.ttl_s + window_s
            while True:
                await asyncio.sleep(window_s)  # the others stand meanwhile
                window_s = CANDIDATE_WINDOW_S
                view = await self.view()
                if view.master is not None or not self.eligible(view):
                    return None
                rivals = await self._rivals(view)
                ahead = [i for i, end in rivals.items() if (end, -i) > (log_end, -self.broker_id)]
                # Before the first election nobody knows who else there is: the window alone decides.
                missing = view.in_sync - rivals.keys() - {self.broker_id, view.last_master} if view.epoch else ()
                if not ahead and not missing:
                    return view
                if self._clock() > deadline:
                    log.warning("candidates with a longer log did not take over, or brokers in sync did not "
                                "stand, within a lease: campaigning", event="candidate_overdue",
                                broker_id=self.broker_id, ahead=sorted(ahead), missing=sorted(missing))
                    return view
        finally:
            await self._revoke(lease.id)

    async def _rivals(self, view: View) -> dict[int, int]:
        """Every other live candidate that may take over: broker id -> where its log ends."""
        out = {}
        for kv in await self._client.get_prefix(self._candidates):
            try:
                broker_id = int(kv.key[len(self._candidates):])
                end = int(json.loads(kv.value)["log_end"])
            except (ValueError, KeyError, TypeError):
                continue
            if broker_id != self.broker_id and (view.epoch == 0 or broker_id in view.in_sync):
                out[broker_id] = end
        return out

    async def _take(self, view: View, epoch_floor: int) -> Master | None:
        sent = self._clock()  # etcd counts the lease's TTL from the grant, which is after this
        lease = await self._client.lease(self.ttl_s)
        me = Master(self.broker_id, self.address, max(view.epoch, epoch_floor) + 1)
        t = self._client.transactions
        # The winner alone is in sync until it records its replicas: the last master's set does not let
        # anyone take over from this one. A handover names who may win: only that broker, taking it away.
        named = view.handover is not None and view.handover.successor == self.broker_id
        handover = ([t.value(self._handover_key) == view.handover.raw], [t.delete(self._handover_key)]) if named \
            else ([t.version(self._handover_key) == 0], [])
        won, _ = await self._client.transaction(
            compare=[t.create(self._master_key) == 0, t.mod(self._epoch_key) == view.epoch_revision, *handover[0]],
            success=[t.put(self._epoch_key, str(me.epoch).encode()),
                     t.put(self._master_key, me.encode(), lease=lease.id),
                     t.put(self._in_sync_key, json.dumps([self.broker_id]).encode()),
                     t.put(self._last_master_key, str(self.broker_id).encode()), *handover[1]], failure=[])
        if not won:
            await self._revoke(lease.id)
            return None
        self.lease, self.won = Lease(lease.id, self.ttl_s, sent), me
        log.info("elected master of %s with epoch %d", self._master_key.decode(), me.epoch, event="master_elected",
                 broker_id=self.broker_id, epoch=me.epoch)
        return me

    async def publish_in_sync(self, broker_ids: frozenset[int]) -> None:
        """Record the in-sync set; only the master holding the key may (FailedPreconditionError else)."""
        if self.won is None:
            raise FailedPreconditionError("only the master records the in-sync set")
        t = self._client.transactions
        ok, _ = await self._client.transaction(
            compare=[t.value(self._master_key) == self.won.encode()],
            success=[t.put(self._in_sync_key, json.dumps(sorted(broker_ids)).encode())], failure=[])
        if not ok:
            raise FailedPreconditionError(f"broker {self.broker_id} is no longer the master (epoch {self.won.epoch})")

    async def hand_over(self, successor: int, address: str, *, compare: list, in_sync: frozenset[int]) -> bool:
        """Give the mastership to `successor` (a planned switchover, switchover.py): in one transaction, while
        this broker holds the master key and `compare` holds, the key goes and `handover` names the successor
        (bound to a fresh lease of one TTL), with `in_sync` as the in-sync set. True once done: this broker is
        not the master any more. False when a comparison failed (nothing changed)."""
        if self.won is None:
            raise FailedPreconditionError("only the master hands its mastership over")
        lease = await self._client.lease(self.ttl_s)
        t = self._client.transactions
        done, _ = await self._client.transaction(
            compare=[t.value(self._master_key) == self.won.encode(), *compare],
            success=[t.delete(self._master_key),
                     t.put(self._handover_key, Handover.encode(successor, address, self.won.epoch), lease=lease.id),
                     t.put(self._in_sync_key, json.dumps(sorted(in_sync)).encode())], failure=[])
        if not done:
            await self._revoke(lease.id)
            return False
        log.info("handed the mastership of %s to broker %d", self._master_key.decode(), successor,
                 event="master_handed_over", broker_id=self.broker_id, successor=successor, epoch=self.won.epoch)
        return True

    async def renew(self) -> bool:
        """Renew the master lease once; False when etcd says it is gone (then this broker is not master)."""
        lease = self.lease
        if lease is None:
            return False
        sent = self._clock()
        reply = await self._client.refresh_lease(lease.id)
        if reply is None:  # the keepalive stream ended unanswered: a failed call, not an expired lease
            raise ConnectionError("etcd did not answer the lease keepalive")
        if reply.TTL <= 0:
            return False
        lease.renewed(sent)
        return True

    async def keep(self, on_lost: Callable[[str], None]) -> None:
        """Renew the lease every third of its TTL until cancelled.

        Between answered renewals `lease_valid()` turns False once the fence deadline passes: writes wait.
        A later renewal that etcd answers with the lease alive makes it True again, since nobody can take
        the master key while this broker's lease holds it. `on_lost(reason)` is called once etcd says the
        lease is gone (it expired while etcd was out of reach, or was revoked), and keep() returns."""
        if self.lease is None:
            raise FailedPreconditionError("not the master: no lease to keep")
        failing = False
        while True:
            try:
                # A call etcd never answers ends within a TTL. asyncio.timeout, not wait_for: Python 3.11's
                # wait_for returns a renewal that finished as this task was cancelled and loses the
                # cancellation, and the keeper went on renewing while its broker's stop waited for it.
                async with asyncio.timeout(self.ttl_s):
                    alive = await self.renew()
            except Exception as e:  # unreachable, refused, a timeout: try again; the deadline guards writes
                if not failing:
                    log.warning("master lease renewal failed: %r; writes wait once the lease is uncertain", e,
                                event="lease_renewal_failed")
                failing = True
                await asyncio.sleep(0.2)
                continue
            if not alive:
                on_lost("etcd says the master lease expired")
                return
            if failing:
                log.info("master lease renewed again", event="lease_renewed")
                failing = False
            await asyncio.sleep(self.ttl_s / 3)

    async def resign(self) -> None:
        """Give up being master now (a clean stop): the key goes with the lease, a replica takes over at once."""
        lease, self.lease, self.won = self.lease, None, None
        if lease is not None:
            await self._revoke(lease.id)

    def lease_valid(self) -> bool:
        """Whether this broker is certainly still the master (its lease cannot have expired at etcd yet)."""
        return self.lease is not None and self.lease.valid(self._clock())

    async def watch(self) -> AsyncIterator[Master | None]:
        """The master at once, then at every change of the key (None while there is none)."""
        watch = await self._client.watch(self._master_key)
        try:
            yield (await self.view()).master
            async for event in watch:
                kind = getattr(event, "kind", None)
                yield None if kind == aetcd.rtypes.EventKind.DELETE else Master.decode(event.kv.value)
        finally:
            await end_watch(watch)

    async def _revoke(self, lease_id: int) -> None:
        try:
            await self._client.revoke_lease(lease_id)
        except MEMBER_FAILURES as e:  # it expires by itself then
            log.warning("could not revoke lease %x: %s", lease_id, e, event="lease_revoke_failed")


class Lease:
    """The master's lease as this broker may count on it: etcd expires it `ttl_s` after the last renewal
    it received, at the earliest `ttl_s` after that renewal was sent."""

    def __init__(self, lease_id: int, ttl_s: int, sent: float) -> None:
        self.id = lease_id
        self.ttl_s = ttl_s
        self.fence_at = sent + ttl_s - FENCE_MARGIN_S

    def valid(self, now: float) -> bool:
        return now < self.fence_at

    def renewed(self, sent: float) -> None:
        self.fence_at = max(self.fence_at, sent + self.ttl_s - FENCE_MARGIN_S)
