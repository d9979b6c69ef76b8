"""Controller mode: one broker's life under etcd's decisions (`--controller etcd://...`; election.py decides).

- Identity: a broker of the name gets a member id from etcd the first time it starts (a counter under the
  name, compare-and-swap) and keeps it in its data dir (config/member.json); replicas report it in their
  hello, so it is what the in-sync set holds.
- Start (`decide`): no master in etcd and this broker may take over: it campaigns, standing as a
  candidate with where its commit log ends (of brokers that start together, the longest log wins, at the
  first election too: a group moved to controller mode with its data), and a win makes it the master
  with etcd's epoch (its role file says so for the broker's restart logic). A master elsewhere: it
  starts as that master's replica (an old master that restarts rejoins this way; the replication hello
  cuts back what it holds beyond the new master's log). Its own master key from before a restart: it
  waits for that lease to expire (it cannot renew a lease of its past life) and decides again.
- Running (`run`, owned by the broker server): a master renews its lease from the moment it wins (before
  the broker is even built) and records its in-sync set whenever it changes; every write asks whether
  the lease can still be valid (writes wait while it is uncertain), and once etcd says the lease is gone
  the broker is fenced for good and `run` returns: the broker stops and starts again in its own process
  (app.py), and so rejoins as a replica. A replica watches the master key: gone, it campaigns (when in
  sync) and is promoted with the epoch etcd gave it; moved, it follows the new master.
- Planned switchover (`tidemark broker promote`, switchover.py): the replica named asks through etcd, its
  master hands over once that replica holds everything, and is fenced as if its lease had expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from pathlib import Path

import aetcd

from tidemark.broker.cluster.election import Election, Master, parse_controller
from tidemark.broker.cluster.etcd_members import MEMBER_FAILURES, EtcdMembers
from tidemark.broker.cluster.roles import Role, forget_role, load_role, save_role
from tidemark.broker.cluster.switchover import Switchover
from tidemark.broker.config import BrokerConfig
from tidemark.broker.errors import FailedPreconditionError, StoreError
from tidemark.broker.store.logscan import end_on_disk
from tidemark.common.backoff import Backoff
from tidemark.common.fsutil import atomic_write
from tidemark.common.logs import get_logger
from tidemark.common.scheduler import cancel_and_wait

log = get_logger("tidemark.broker.controller_mode")

MEMBER_FILE_NAME = "member.json"
# How often a master compares its in-sync set with the one etcd holds (a third of the lease after a failed
# write). A replica is elected only once etcd records it in sync, and the set a master writes when it wins
# holds itself alone: at a third of the 2 s lease, a replica that connected 0.44 s before its master was
# paused was not recorded, the master came back and won again, and nobody took writes for 23 s (the fault
# checker's controller scenario, seed 19700). Comparing two small sets ten times a second costs nothing.
IN_SYNC_POLL_S = 0.1


class ControllerMode:
    def __init__(self, config: BrokerConfig, *, after_fence: bool = False) -> None:
        self._config = config
        # This broker's last life ended fenced (its master lease expired): see _decide.
        self._after_fence = after_fence
        self._endpoints = parse_controller(config.controller)
        self._client: EtcdMembers | None = None
        self.election: Election | None = None
        self.switchover: Switchover | None = None
        self.member_id = 0
        self._broker = None  # the BrokerController, once built
        self._keeper: asyncio.Task | None = None
        self._lost: asyncio.Future[str] | None = None

    async def connect(self) -> EtcdMembers:
        """A client of the etcd members, connected to the first that answers (ConnectionError naming
        each failure when none does)."""
        c = self._config
        user, _, password = c.controller_user.partition(":")
        members = EtcdMembers(self._endpoints, user=user, password=password,
                              call_timeout_s=max(0.5, c.controller_lease_s / 3))
        try:
            await members.connect()
        except ConnectionError as e:
            raise ConnectionError(f"etcd at {c.controller}: {e}") from None
        return members

    async def decide(self) -> BrokerConfig:
        """This broker's role for its start: the config to build the broker with (master: broker_id 0).
        A member that fails meanwhile is left for the next (a few rounds of them at most)."""
        c = self._config
        self._client = await self.connect()
        failures = 0
        while True:
            try:
                if self.election is None:
                    self.member_id = await self._member_id()
                    self.election = Election(self._client, c.cluster_name, c.broker_name, self.member_id,
                                             c.address, ttl_s=c.controller_lease_s)
                    self.switchover = Switchover(self._client, self.election,
                                                 timeout_s=c.switchover_timeout_ms / 1000)
                return await self._decide(await asyncio.to_thread(load_role, c.config_dir))
            except (aetcd.exceptions.ClientError, TimeoutError) as e:  # (no member answers: ConnectionError)
                failures += 1
                if failures > 3 * len(self._endpoints):
                    raise ConnectionError(f"etcd at {c.controller} failed while deciding this broker's role: "
                                          f"{e}") from None
                log.warning("etcd failed while deciding this broker's role: %r; asking again", e,
                            event="controller_decide_retry")
                await asyncio.sleep(0.2)

    async def _decide(self, role: Role | None) -> BrokerConfig:
        c = self._config
        # A master whose lease expired (paused, or cut off from etcd) comes back from a fault that the
        # brokers in sync with it did not have: for one lease it lets them take over before it campaigns
        # itself. Else it would most often win again at once (its log is the longest, and its restart is
        # quicker than their campaign), and the fault would move nothing. Without another broker in sync,
        # or once the lease has passed, it campaigns.
        let_others_until = asyncio.get_running_loop().time() + c.controller_lease_s if self._after_fence else 0.0
        while True:
            view = await self.election.view()
            if (view.master is None and view.in_sync - {self.member_id}
                    and asyncio.get_running_loop().time() < let_others_until):
                await asyncio.sleep(0.1)
                continue
            if view.master is None:  # (its log as the files say: brokers that start together are ranked by it)
                log_end = await asyncio.to_thread(end_on_disk, Path(c.data_dir) / "commitlog")
                won = await self.election.campaign(epoch_floor=role.epoch if role is not None else 0,
                                                   log_end=log_end)
                if won is not None:
                    self._keep_lease()
                    await asyncio.to_thread(save_role, c.config_dir, Role(0, won.epoch))
                    return dataclasses.replace(c, broker_id=0, master="")
                if not self.election.eligible(view):
                    log.warning("no master of %s, and this broker was not in sync with the last one: waiting "
                                "for an in-sync broker to take over", c.broker_name, event="controller_waiting")
                    await asyncio.sleep(c.controller_lease_s / 3)
                continue
            if view.master.broker_id == self.member_id:
                await asyncio.sleep(0.2)  # this broker's key from before its restart: its lease runs out
                continue
            await asyncio.to_thread(forget_role, c.config_dir)  # a master no longer: it follows
            log.info("master of %s is broker %d at %s (epoch %d): following it", c.broker_name,
                     view.master.broker_id, view.master.address, view.master.epoch, event="controller_follow",
                     master=view.master.address, epoch=view.master.epoch)
            return dataclasses.replace(c, broker_id=self.member_id, master=view.master.address)

    def _keep_lease(self) -> None:
        """This broker just won the master key: its lease is kept from now on, before anything else."""
        loop = asyncio.get_running_loop()
        self._lost = loop.create_future()
        self._keeper = loop.create_task(self.election.keep(self._on_lost), name="controller-lease")
        self._keeper.add_done_callback(self._keeper_ended)

    def _keeper_ended(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:  # a bug: nobody keeps the lease now
            self._on_lost(f"the lease keeper failed: {task.exception()!r}")

    def _on_lost(self, why: str) -> None:
        """The master lease may have expired: no more writes here, at once."""
        if self._broker is not None:
            self._broker.permission.fence(f"controller mode: {why}")
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(why)

    async def run(self, broker) -> None:
        """The broker's life under etcd until cancelled (the broker server owns this task)."""
        self._broker = broker
        broker.switchover = lambda: self.switchover.request(broker)  # `tidemark broker promote`
        try:
            while True:
                if broker.replica is None:
                    broker.permission.lease_valid = self.election.lease_valid
                    if self._lost is not None and self._lost.done():
                        broker.permission.fence(f"controller mode: {self._lost.result()}")
                    await self._serve_as_master(broker)
                    return  # fenced for good: the broker restarts in-process and rejoins as a replica (app.py)
                won = await self._follow_until_vacant(broker)
                broker.permission.lease_valid = self.election.lease_valid
                await broker.promote(epoch=won.epoch)
                self.switchover.took_over()
        finally:
            await cancel_and_wait(self._keeper)

    async def _serve_as_master(self, broker) -> None:
        election, lost = self.election, self._lost
        published: frozenset[int] | None = None
        failed = False
        # A switchover that hands the mastership over ends this life as a lost lease does.
        switchovers = asyncio.get_running_loop().create_task(self.switchover.serve(broker, self._on_lost),
                                                              name="controller-switchover")
        try:
            while not lost.done():
                in_sync = frozenset({self.member_id, *broker.replication.in_sync_replicas()})
                if in_sync == published:
                    failed = False  # (back to what etcd holds: nothing to write, so nothing failing)
                elif not broker.permission.handing_over:
                    try:  # (writes do not wait for this: each asks the lease itself)
                        async with asyncio.timeout(election.ttl_s):  # (not wait_for: see Election.keep)
                            await election.publish_in_sync(in_sync)
                        published, failed = in_sync, False
                    except FailedPreconditionError as e:  # the key is no longer this broker's
                        self._on_lost(str(e))
                    except MEMBER_FAILURES as e:
                        log.warning("cannot record the in-sync set in etcd: %r", e, event="in_sync_unrecorded")
                        failed = True
                await asyncio.wait([lost, switchovers], timeout=election.ttl_s / 3 if failed else IN_SYNC_POLL_S)
                if switchovers.done() and not lost.done():  # a bug: nobody answers switchovers now
                    self._on_lost(f"the switchover task failed: {switchovers.exception()!r}")
        finally:
            await cancel_and_wait(switchovers)

    async def _follow_until_vacant(self, broker) -> Master:
        """Follow whoever is master; return once this broker won the vacant mastership (its lease kept)."""
        prober = asyncio.get_running_loop().create_task(self._probe_members(), name="controller-probe")
        try:
            return await self._watch_until_won(broker)
        finally:
            await cancel_and_wait(prober)

    async def _probe_members(self) -> None:
        """While this broker only watches: a member that froze or lost its quorum sends no event and no
        error, so a read every lease tells; a failed one is left behind, which ends the watch through it."""
        while True:
            await asyncio.sleep(self._config.controller_lease_s)
            with contextlib.suppress(*MEMBER_FAILURES):
                await self._client.probe()

    async def _watch_until_won(self, broker) -> Master:
        backoff = Backoff(first_s=0.2, max_s=2.0)
        failures = 0
        while True:
            try:
                async with contextlib.aclosing(self.election.watch()) as masters:
                    async for master in masters:
                        failures = 0
                        if master is None:
                            floor = max(broker.epoch, broker.registrar.master_epoch,
                                        broker.replica.master_epoch if broker.replica is not None else 0)
                            won = await self.election.campaign(epoch_floor=floor,
                                                               log_end=broker.store.commit_log_max_offset)
                            if won is not None:
                                self._keep_lease()
                                return won
                        elif master.broker_id != self.member_id and master.address != broker.config.master:
                            await broker.follow(master.address)
            except MEMBER_FAILURES as e:
                log.warning("etcd watch of the master failed: %r; watching again", e, event="controller_watch_failed")
            await asyncio.sleep(backoff.delay(failures))
            failures += 1

    async def close(self) -> None:
        """A clean stop: a master resigns (a replica takes over at once, not after the lease), then closes.
        The caller has fenced the broker first."""
        await cancel_and_wait(self._keeper)
        if self.election is not None and self.election.won is not None:
            try:
                await self.election.resign()
            except MEMBER_FAILURES as e:
                log.warning("could not resign in etcd (the lease expires by itself): %s", e, event="resign_failed")
        if self._client is not None:
            await self._client.close()

    async def _member_id(self) -> int:
        path = Path(self._config.config_dir) / MEMBER_FILE_NAME
        try:
            return int(json.loads(path.read_text())["memberId"])
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError) as e:
            raise StoreError(f"{path} holds no member id ({e}); remove it to get a new one") from None
        member_id = await self._allocate_member_id()
        path.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(atomic_write, path, json.dumps({"memberId": member_id}).encode())
        return member_id

    async def _allocate_member_id(self) -> int:
        c, client = self._config, self._client
        key = f"/tidemark/{c.cluster_name}/{c.broker_name}/next_member".encode()
        t = client.transactions
        while True:
            found = await client.get(key)
            current, revision = (int(found.value), found.mod_revision) if found is not None else (1, 0)
            ok, _ = await client.transaction(compare=[t.mod(key) == revision],
                                             success=[t.put(key, str(current + 1).encode())], failure=[])
            if ok:
                return current
