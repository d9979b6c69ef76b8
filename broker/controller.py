"""BrokerController: builds the broker's domain objects, owns their lifecycle and timers.

load() recovers the store and reads config files (synchronously, before the
server reports ready); start() starts the background work; shutdown() stops it
in reverse order and persists everything. Operations that span several
managers (deleting a topic or a group) live here so the servicers stay thin.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from tidemark.broker import memory
from tidemark.broker.auth import AuthStore
from tidemark.broker.cluster.offset_authority import OffsetAuthority
from tidemark.broker.cluster.permission import BrokerPermission
from tidemark.broker.cluster.registration import NameServerRegistrar, Registration
from tidemark.broker.cluster.replica_sync import ReplicaSync
from tidemark.broker.cluster.replicated_tables import CONFIG, LOCKS
from tidemark.broker.cluster.replication import ReplicationSource
from tidemark.broker.cluster.replication_checkpoint import ReplicationCheckpoint
from tidemark.broker.cluster.roles import ROLE_FILE_NAME, Role, load_role, save_role
from tidemark.broker.config import BrokerConfig, FlushDiskType, ReplicationMode, namesrv_addresses
from tidemark.broker.delivery.fetch import FetchSession
from tidemark.broker.delivery.handover import HeldQueue, QueueHandover, RefusedOffset
from tidemark.broker.delivery.pull import PullService, QueueReadAccess
from tidemark.broker.delivery.queries import MessageQueries
from tidemark.broker.delivery.waiters import QueueWaiters
from tidemark.broker.disk.metadata_file import MetadataFile
from tidemark.broker.errors import (
    BrokerError,
    FailedPreconditionError,
    NotFoundError,
    PermissionDeniedError,
    StoreError,
)
from tidemark.broker.ingest.delays import ScheduleMessageService
from tidemark.broker.ingest.send import SendService
from tidemark.broker.ingest.send_back import SendBackService
from tidemark.broker.membership.epoch import EpochSequence
from tidemark.broker.membership.groups import SubscriptionGroupManager, check_group
from tidemark.broker.membership.lock_file import LOCK_FILE_NAME, LockFile
from tidemark.broker.membership.locks import LockGrant, QueueLockManager
from tidemark.broker.membership.members import ConsumerInfo, ConsumerManager
from tidemark.broker.observe.gauges import take_snapshot
from tidemark.broker.observe.health import (
    CONFIG_FILES,
    POP_STATE,
    STORE,
    PersistenceHealth,
)
from tidemark.broker.observe.metrics import BrokerMetrics, StateSnapshot
from tidemark.broker.offsets import ConsumerOffsetManager, Fence
from tidemark.broker.offsets.commits import OffsetCommitService
from tidemark.broker.offsets.snapshots import PersistReport
from tidemark.broker.offsets.upkeep import OffsetUpkeep
from tidemark.broker.operations import Operations
from tidemark.broker.pop.service import PopService
from tidemark.broker.producers.service import IdempotenceService
from tidemark.broker.store import FlushMode, MessageStore, StoreConfig
from tidemark.broker.store.writability import WriteState
from tidemark.broker.topics import TopicConfigManager
from tidemark.broker.transactions.service import TransactionService
from tidemark.broker.version import VERSION
from tidemark.common.auth import Credentials
from tidemark.common.logs import get_logger
from tidemark.common.protocol import SCHEDULE_TOPIC, MessageIdGenerator, retry_topic
from tidemark.common.scheduler import Scheduler

log = get_logger("tidemark.broker")

RETENTION_CHECK_INTERVAL_S = 600.0
POP_REVIVE_INTERVAL_S = 0.5
POP_RENEW_INTERVAL_S = 5.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class StartupReport:
    recovery: object
    offsets: object
    topics: int
    groups: int


class BrokerController:
    def __init__(self, config: BrokerConfig) -> None:
        role = load_role(config.config_dir)
        if role is not None and (role.broker_id, "") != (config.broker_id, config.master):
            log.warning("this broker was promoted to master of %s (epoch %d): it runs as master whatever its "
                        "flags say; remove %s to make it follow a master again", config.broker_name, role.epoch,
                        ROLE_FILE_NAME, event="role_loaded", epoch=role.epoch)
            config = dataclasses.replace(config, broker_id=role.broker_id, master="")
        self.epoch = role.epoch if role is not None else 0  # a master's epoch (broker/cluster/roles.py)
        self.config = config
        self.clock_ms = now_ms
        config_dir = config.config_dir
        self.store = MessageStore(StoreConfig(
            data_dir=config.data_dir,
            commitlog_segment_size=config.commitlog_segment_size,
            consume_queue_entries_per_file=config.consume_queue_entries_per_file,
            max_open_consume_queue_files=config.max_open_consume_queue_files,
            flush_mode=FlushMode.SYNC if config.flush is FlushDiskType.SYNC else FlushMode.ASYNC,
            flush_interval_ms=config.flush_interval_ms,
            max_message_size=config.max_message_size,
            file_reserved_hours=config.file_reserved_hours,
        ))
        self.topics = TopicConfigManager(config_dir)
        self.groups = SubscriptionGroupManager(config_dir, retry_queue_nums=config.retry_queue_nums,
                                               retry_max_times=config.max_reconsume_times)
        self.auth = AuthStore(config_dir)
        self.epochs = EpochSequence()
        self.locks = QueueLockManager(epochs=self.epochs, expiry_ms=config.lock_expiry_ms)
        self.lock_file = LockFile(Path(config_dir) / LOCK_FILE_NAME, self.locks,
                                  fsync=config.flush is FlushDiskType.SYNC)
        self.offsets = ConsumerOffsetManager(config_dir, epochs=self.epochs, ownership=self.locks,
                                             allow_empty_on_corruption=config.force_empty_offsets)
        self.permission = BrokerPermission(config.broker_name, replica_of=config.master)
        self.hold = QueueWaiters()
        self.schedule = ScheduleMessageService(store=self.store, config_dir=config_dir,
                                               levels_ms=config.delay_levels_ms, clock_ms=self.clock_ms,
                                               can_deliver=lambda: self.permission.writable)
        authority = OffsetAuthority(permission=self.permission, replica=lambda: self.replica,
                                    controller_mode=bool(config.controller),
                                    name=lambda: f"{self.config.broker_name}/{self.config.broker_id}")
        self.commits = OffsetCommitService(store=self.store, topics=self.topics, offsets=self.offsets,
                                           groups=self.groups, on_reset=self.hold.notify,
                                           guard=authority.check_change, read_guard=authority.check_query)
        self.read_access = QueueReadAccess(topics=self.topics, groups=self.groups, offsets=self.offsets,
                                           locks=self.locks, permission=self.permission,
                                           message_model=lambda group: self.consumers.message_model(group))
        # Queues changing hands: lock waits, the new owner's starting point, the old one's final commits.
        self.handover = QueueHandover(locks=self.locks, offsets=self.offsets, commits=self.commits, hold=self.hold,
                                      popped=lambda group: self.pop.has_group(group),
                                      on_owners_changed=lambda group, n: self.metrics.ownership_changes.labels(
                                          group).inc(n), saved=self.lock_file,
                                      replicated=self._locks_replicated)
        self.puller = PullService(store=self.store, access=self.read_access, commits=self.commits, hold=self.hold,
                                  max_long_polling_ms=config.max_long_polling_ms)
        self.send_back = SendBackService(store=self.store, topics=self.topics, groups=self.groups,
                                         permission=self.permission, schedule=self.schedule,
                                         clock_ms=self.clock_ms)
        self.queries = MessageQueries(store=self.store, topics=self.topics)
        self.pop = PopService(config=config, store=self.store, topics=self.topics, groups=self.groups,
                              offsets=self.offsets, hold=self.hold, permission=self.permission,
                              clock_ms=self.clock_ms, pop_id_floor=self.epochs.last,
                              holds_locks=lambda group: bool(self.locks.locks(group)),
                              on_state=self._on_pop_state,
                              on_moved=lambda group, to_dlq: (self.metrics.dlq if to_dlq
                                                              else self.metrics.retries).labels(group).inc())
        self.producers = IdempotenceService(config_dir, store=self.store, clock_ms=self.clock_ms,
                                            max_producers=config.max_idempotent_producers,
                                            expiry_ms=config.producer_id_expiry_ms,
                                            id_floor=self.clock_ms() << 16)
        # A master serves its replicas' streams; a replica copies its master (broker/cluster/replication.py).
        self.replication = self._replication_source() if not config.broker_id else None
        self.producers.follower = bool(config.broker_id)
        self.store.follower = bool(config.broker_id)  # reads past a replica's end wait for it to catch up
        self.replica = ReplicaSync(master=config.master, store=self.store, topics=self.topics, groups=self.groups,
                                   offsets=self.offsets, schedule=self.schedule, pop=self.pop,
                                   producers=self.producers, broker_name=config.broker_name,
                                   broker_id=config.broker_id, segment_size=config.commitlog_segment_size,
                                   after_mirror=self.flush_configs, on_topic_gone=self._remove_topic_data,
                                   tls_ca_file=config.peer_tls_ca, credentials=self._peer_credentials(),
                                   hand_back=not config.controller, on_connected=self.handover.master_reached,
                                   on_master_locks=self.lock_file.keep_master) \
            if config.broker_id else None
        self.transactions = TransactionService(
            store=self.store, topics=self.topics, permission=self.permission, clock_ms=self.clock_ms,
            config_dir=config_dir, timeout_ms=config.transaction_timeout_ms,
            check_interval_ms=config.transaction_check_interval_ms, max_checks=config.transaction_check_max,
            sync_replication=self._sync_replication())
        self.sender = SendService(config=config, store=self.store, topics=self.topics,
                                  permission=self.permission, schedule=self.schedule,
                                  ids=MessageIdGenerator(), clock_ms=self.clock_ms, producers=self.producers,
                                  transactions=self.transactions, sync_replication=self._sync_replication())
        self.metrics = BrokerMetrics()
        # Sends, config changes and the offset timer report disk trouble here; the server maps it to health.
        self.persistence = PersistenceHealth(self.metrics)
        self.store.guard.add_listener(self._on_store_write_state)
        for file in self._config_files():
            file.on_state = self._on_config_file_state
        # The snapshot timer; CONSUMER_OFFSETS fails while the snapshot or the offset journal cannot be written.
        self.offset_upkeep = OffsetUpkeep(self.offsets, self.persistence,
                                          interval_s=config.flush_consumer_offset_interval_ms / 1000,
                                          written=self._offsets_written)
        self.consumers = ConsumerManager(expiry_ms=config.channel_expired_timeout_ms,
                                         watch_grace_ms=config.watch_grace_ms, clock_ms=self.clock_ms,
                                         on_leave=self.handover.client_gone,
                                         on_change=lambda g: self.metrics.membership_changes.labels(g).inc())
        self.scheduler = Scheduler("broker")
        self.registrar = NameServerRegistrar(
            namesrv_addresses(config), build=self.registration,
            fingerprint=lambda: (self.topics.version, self.permission.readable, self.permission.writable,
                                 self.config.broker_id, self.epoch),
            tls_ca_file=config.peer_tls_ca, on_fenced=self.permission.fence, credentials=self._peer_credentials())
        # Gives the allocator's free pages back after bursts of large requests and answers (broker/memory.py).
        self.trimmer = memory.Trimmer()
        self.operations = Operations(self)  # what the protocol adapters call
        self.started_ms = self.clock_ms()
        self._promoting = False
        self.switchover: Callable[[], Awaitable[int]] | None = None  # controller mode: set by ControllerMode.run
        self._checkpoint: ReplicationCheckpoint | None = None  # a master's replicated end across restarts
        self.ready = False
        self._started = False

    def load(self) -> StartupReport:
        """Recover the store and read config files. Raises ConfigFileError on unusable files."""
        recovery = self.store.load()
        topics = self.topics.load()
        groups = self.groups.load()
        self.auth.load()
        offsets = self.offsets.load()
        self.lock_file.load()
        self.schedule.load()
        self.pop.load()
        self.producers.load()
        self.transactions.load()
        self.topics.ensure_system_topic(SCHEDULE_TOPIC, len(self.config.delay_levels_ms))
        if self.replication is not None:
            self.store.add_dispatch_listener(self.replication.on_append)
            self._checkpoint = ReplicationCheckpoint(self.config.config_dir, self.replication, lambda: self.epoch)
            self._checkpoint.restore(self.store.commit_log_max_offset)
        self._wire_reads()
        return StartupReport(recovery, offsets, topics, groups)

    def _wire_reads(self) -> None:
        """Who wakes readers when a queue grows, and how far they read: on a replica every append, at once;
        on a master what a replica acknowledged (broker/cluster/replication.py: readers never see what a failover
        may lose)."""
        source = self.replication
        self.store.remove_dispatch_listener(self.hold.notify)
        if source is None:
            self.store.read_limit = lambda: None
            self.store.add_dispatch_listener(self.hold.notify)
        else:
            source.on_readable, source.on_all_readable = self.hold.notify, self.hold.notify_all
            self.store.read_limit = source.read_limit

    async def _checkpoint_replication(self) -> None:
        if self._checkpoint is not None:
            await self._checkpoint.save_if_moved()

    async def start(self) -> None:
        await self.store.start()
        if self.replica is None:
            await self.transactions.start()
        s = self.scheduler
        s.every("persist-consumer-offsets", self.config.flush_consumer_offset_interval_ms / 1000,
                self.offset_upkeep.tick)
        s.every("scan-consumers", 1.0, self.consumers.scan)
        s.every("retry-config-files", 1.0, self._retry_config_files)
        s.every("reload-auth", 2.0, self.auth.reload_if_changed)
        s.every("expire-queue-locks", 1.0, self.handover.expire)
        s.every("delete-expired-commitlog", RETENTION_CHECK_INTERVAL_S, self.store.delete_expired_segments)
        s.every("revive-pop-deliveries", POP_REVIVE_INTERVAL_S, self.pop.revive_expired)
        s.every("renew-pop-deliveries", POP_RENEW_INTERVAL_S, lambda: self.pop.renew(self._live_clients()))
        s.every("persist-pop-state", self.config.flush_consumer_offset_interval_ms / 1000, self.pop.persist_if_dirty)
        s.every("persist-producer-state", self.config.flush_consumer_offset_interval_ms / 1000,
                self.producers.maintain)
        s.every("check-transactions", min(1.0, self.config.transaction_check_interval_ms / 2000),
                self.transactions.check_due)
        s.every("persist-transaction-state", self.config.flush_consumer_offset_interval_ms / 1000,
                self.transactions.persist_if_dirty)
        if self.replica is not None:
            self.replica.start()
            s.every("mirror-master-metadata", 1.0, self.replica.mirror_metadata)
        s.every("release-readers", 1.0, lambda: self.replication and self.replication.release_readers())
        s.every("checkpoint-replication", 1.0, self._checkpoint_replication)
        if self.registrar.addresses:
            self.registrar.start()
            await self.registrar.register_all()  # routable before ready (a name server that is down costs its timeout)
            s.every("register-with-namesrv", self.config.register_interval_ms / 1000, self.registrar.register_all)
        await s.start()
        await self.schedule.start()
        self._started = True
        self.ready = True

    async def shutdown(self) -> None:
        """Stop background work, then persist offsets and flush the store. Idempotent.

        Each step runs even if an earlier one failed: a broken schedule file must not cost the
        consumer offsets or the store flush.
        """
        self.ready = False
        self.hold.close()
        steps = [("scheduler", self.scheduler.stop), ("schedule", self.schedule.shutdown)] if self._started else []
        steps += [("name server registration", self.registrar.stop), ("memory trims", self.trimmer.close)]
        if self.replica is not None:
            steps += [("replication", self.replica.stop)]
        steps += [("replication checkpoint", self._checkpoint_replication),
                  ("consumer offsets", self.offset_upkeep.final), ("queue locks", self.lock_file.close),
                  ("pop state", self.pop.shutdown),
                  ("producer state", self.producers.shutdown),
                  ("transaction state", self.transactions.persist_if_dirty),
                  ("config files", self.flush_configs),
                  ("store", self.store.shutdown)]
        failed = None
        for name, step in steps:
            try:
                await step()
            except Exception as e:
                log.exception("shutdown step failed", event="shutdown_error", step=name)
                failed = failed or e
        self._started = False
        if failed is not None:
            raise failed

    def _offsets_written(self, report: PersistReport) -> None:
        self.metrics.offset_flush_seconds.observe(report.duration_s)
        self.metrics.offset_file_bytes.set(report.size_bytes)

    def snapshot(self) -> StateSnapshot:
        """State gauges for a metrics scrape (called on the event loop thread)."""
        return take_snapshot(self)

    def heartbeat(self, info: ConsumerInfo) -> list[str]:
        """Register or refresh a consumer; the group's members after it.

        The group's config is created on first use; a clustering group gets its retry topic up front
        (as RocketMQ's heartbeat does). A broadcasting consumer of a group whose
        consume_broadcast_enable is false is refused (RocketMQ's NO_PERMISSION), before anything changes."""
        config = self.groups.get(info.group)
        broadcasting = info.message_model == "BROADCASTING"
        if broadcasting and config is not None and not config.consume_broadcast_enable:
            raise PermissionDeniedError(f"group {info.group!r} may not consume in BROADCASTING mode "
                                        f"(its consume_broadcast_enable is false)")
        config = self.groups.ensure(info.group)
        if not broadcasting:
            self.topics.ensure_system_topic(retry_topic(info.group), config.retry_queue_nums)
        self.consumers.heartbeat(info)
        return self.consumers.consumer_ids(info.group)

    async def lock_queues(self, group: str, client_id: str, queues: list[tuple[str, int]],
                          wait_ms: int = 0, *, renew: bool = False) -> list[LockGrant]:
        """Grant or renew queue locks, waiting up to wait_ms for a queue another client holds (handover.py)."""
        return await self.handover.lock_queues(group, client_id, queues, wait_ms, renew=renew)

    def held_queue(self, group: str, grant: LockGrant) -> HeldQueue:
        return self.handover.held_queue(group, grant)

    def unlock_queues(self, group: str, client_id: str, queues: list[tuple[str, int]],
                      final_offsets: list[tuple[str, int, int, Fence | None]] = (),
                      tokens: dict[tuple[str, int], int] | None = None) -> list[RefusedOffset]:
        """Apply the final commits of queues being handed back, then release their locks (handover.py)."""
        return self.handover.unlock_queues(group, client_id, queues, final_offsets, tokens)

    def fetch_session(self) -> FetchSession:
        """A new streaming-pull session (one per Fetch stream)."""
        commits = self.metrics.offset_commits.labels("fetch")
        return FetchSession(store=self.store, access=self.read_access, commits=self.commits, hold=self.hold,
                            on_commit=commits.inc)

    def _on_pop_state(self, reason: str | None) -> None:
        if reason:
            self.persistence.failing(POP_STATE, reason)
        else:
            self.persistence.ok(POP_STATE)

    def _live_clients(self) -> set[str]:
        return {client_id for group in self.consumers.groups() for client_id in self.consumers.consumer_ids(group)}

    def _on_store_write_state(self, state: WriteState, reason: str) -> None:
        if state is WriteState.WRITABLE:
            self.persistence.ok(STORE)
        else:
            self.persistence.failing(STORE, reason)

    def _config_files(self) -> tuple[MetadataFile, ...]:
        return (self.topics.file, self.groups.file, *self.auth.files)

    def _on_config_file_state(self, ok: bool, reason: str) -> None:
        if not any(f.failing for f in self._config_files()):
            self.persistence.ok(CONFIG_FILES)
        elif not ok:
            self.persistence.failing(CONFIG_FILES, reason)

    def _retry_config_files(self) -> None:
        for file in self._config_files():
            file.retry()

    async def flush_configs(self, *, replicated: bool = True) -> None:
        """Wait until topics.json, subscriptionGroup.json, users.json and acls.json hold every change so far,
        the name servers know the topics as they are now and, on a master (`replicated`: not for its
        replicas' own calls), its replicas in sync hold the topics and groups as they are now.

        Every file is flushed even after one failed, so each rolls back what it could not write (a user
        deleted with its rules changes two files); then the first failure is raised."""
        failed: BrokerError | None = None
        for file in self._config_files():
            try:
                await file.flush()
            except BrokerError as e:
                failed = failed or e
        if failed is not None:
            raise failed
        await self.registrar.sync_if_changed()
        if replicated and self.replication is not None:
            await self.replication.wait_table_replicated(CONFIG)

    def _peer_credentials(self) -> Credentials | None:
        """What a replica signs its calls to the master with, and the broker its registrations: peer_user, else
        init_user (a super user there too)."""
        user = self.config.peer_user or self.config.init_user
        if not user:
            return None
        name, _, secret = user.partition(":")
        return Credentials(name, secret)

    def _replication_source(self) -> ReplicationSource:
        c = self.config
        source = ReplicationSource(self.store, broker_name=c.broker_name, segment_size=c.commitlog_segment_size,
                                   timeout_s=c.replication_timeout_ms / 1000,
                                   sync=c.replication is ReplicationMode.SYNC, min_replicas=c.min_sync_replicas,
                                   epoch=lambda: self.epoch, fenced=lambda: bool(self.permission.stale))
        source.follow(self.producers, self.offsets, self.lock_file, self.topics, self.groups)
        return source

    async def _locks_replicated(self) -> None:
        """A master: until its replicas in sync hold the lock table as it is now (QueueHandover.lock_queues)."""
        if self.replication is not None:
            await self.replication.wait_table_replicated(LOCKS)

    def _sync_replication(self) -> ReplicationSource | None:
        """With sync replication, what a send checks before the store (a replica in sync) and waits for after
        it (a replica's acknowledgement)."""
        sync = self.replication is not None and self.config.replication is ReplicationMode.SYNC
        return self.replication if sync else None

    async def promote(self, epoch: int | None = None) -> int:
        """Make this replica the master of its name with a new epoch (`tidemark broker promote`; in controller
        mode the epoch etcd handed out); returns the epoch. The role is on disk before anything changes
        (broker/cluster/roles.py); the name servers learn it at once, and refuse the old master from then on."""
        if epoch is None and self.config.controller:  # a planned switchover through etcd (cluster/switchover.py)
            if self.switchover is None:
                raise FailedPreconditionError(f"broker {self.config.broker_name} is still starting: try again")
            return await self.switchover()
        if self.replica is None or self._promoting:
            raise FailedPreconditionError(f"broker {self.config.broker_name} here is a master already "
                                          f"(epoch {self.epoch}), or being promoted")
        self._promoting = True
        try:
            return await self._promote(epoch)
        finally:
            self._promoting = False

    async def follow(self, master: str) -> None:
        """Copy another master from now on (controller mode: another replica won the election)."""
        if self.replica is None:
            raise FailedPreconditionError(f"broker {self.config.broker_name} here is the master: it follows nobody")
        self.config = dataclasses.replace(self.config, master=master)
        self.permission.follow(master)
        await self.replica.follow(master)
        await self.registrar.sync_if_changed()

    async def _promote(self, epoch: int | None) -> int:
        if epoch is None:
            epoch = max(self.epoch, self.registrar.master_epoch, self.replica.master_epoch) + 1
        try:
            await asyncio.to_thread(save_role, self.config.config_dir, Role(0, epoch))
        except OSError as e:
            raise StoreError(f"cannot write {ROLE_FILE_NAME} ({e.strerror or e}); still a replica") from None
        replica, self.replica = self.replica, None
        await replica.stop()
        self.lock_file.adopt_master()  # (before anything is served as master)
        await self.lock_file.save()
        self.config = dataclasses.replace(self.config, broker_id=0, master="")
        self.epoch = epoch
        self.store.follower = False
        self.producers.promoted()
        self.replication = self._replication_source()
        # Written from now on, with the new epoch: what an earlier life as master wrote is ignored.
        self._checkpoint = ReplicationCheckpoint(self.config.config_dir, self.replication, lambda: self.epoch)
        self.store.add_dispatch_listener(self.replication.on_append)
        self.sender.sync_replication = self.transactions.sync_replication = self._sync_replication()
        self._wire_reads()
        self.transactions.load()  # the half and op topics it copied: open transactions are checked from here
        await self.transactions.start()
        self.permission.promote()
        log.warning("promoted to master", event="broker_promoted", broker=self.config.broker_name, epoch=epoch)
        await self.registrar.sync_if_changed()
        return epoch

    def registration(self) -> Registration:
        """What the broker tells the name servers: who it is and every topic it serves."""
        c = self.config
        return Registration(
            cluster_name=c.cluster_name, broker_name=c.broker_name, broker_id=c.broker_id, address=c.address,
            version=VERSION, epoch=self.epoch,
            replica_lag_bytes=self.replica.lag_bytes if self.replica is not None else 0,
            replica_lag_ms=self.replica.lag_ms if self.replica is not None else 0,
            in_sync_replicas=tuple(self.replication.in_sync_replicas()) if self.replication is not None else (),
            readable=self.permission.readable, writable=self.permission.writable,
            uptime_ms=max(0, self.clock_ms() - self.started_ms),
            topics=tuple(self.topics.list(include_system=True)))

    @property
    def configs_dirty(self) -> bool:
        return any(file.dirty for file in self._config_files())

    async def delete_topic(self, name: str) -> None:
        self.topics.delete(name)
        await self.topics.file.flush()  # a deletion topics.json cannot record is undone before data goes
        await self._remove_topic_data(name)

    async def _remove_topic_data(self, name: str) -> None:
        """A deleted topic's messages, offsets, locks and pop state (on a replica: deleted on its master)."""
        await self.store.delete_topic(name)
        removed = self.offsets.clean_topic(name)
        self.locks.forget_topic(name)
        self.pop.forget_topic(name)
        self.producers.forget_topic(name)
        log.info("topic data removed", event="topic_cleanup", topic=name, offset_entries=removed)

    def delete_group(self, group: str) -> None:
        check_group(group)
        members = self.consumers.consumer_ids(group)
        if members:
            raise FailedPreconditionError(f"group {group!r} has {len(members)} live member(s); stop them first")
        removed = self.offsets.remove_group(group)
        had_config = self.groups.get(group) is not None
        if had_config:
            self.groups.delete(group)
        if not removed and not had_config:
            raise NotFoundError(f"group {group!r} is unknown on this broker")
        self.locks.forget_group(group)
        self.pop.forget_group(group)
        log.info("group deleted", event="group_delete", group=group, offset_entries=removed)

    def known_groups(self) -> list[str]:
        return sorted(set(self.offsets.groups()) | set(self.groups.groups()) | set(self.consumers.groups()))
