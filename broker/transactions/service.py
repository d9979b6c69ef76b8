"""TransactionService: half messages in, commits and rollbacks out, checks to producers, restarts.

A half message is a send with TRAN_MSG=true and PGROUP=<producer group>:
SendService re-addresses it (`half_record`) to RMQ_SYS_TRANS_HALF_TOPIC queue
0 with its real topic and queue in REAL_TOPIC / REAL_QID, and reports it
stored (`added`). `end` commits or rolls it back.

Exactly one outcome, whatever crashes. An end writes its **op record** (JSON:
the half's offset, the outcome, and for a commit where the message goes:
topic, queue, queue offset, message id) and then, for a commit, the message
on its real queue, in one step of the event loop with nothing between them.
A kill -9 can still fall between the two writes, so loading checks every
commit op above the op floor: a committed message missing from the queue
offset its op names is put again from the half (it can only be missing from
exactly there: nothing else wrote to that queue in between). Halves are
found again by scanning the half topic from the floor, their ends by
scanning the op topic from the op floor (both kept in transactionState.json,
with the checks already sent; losing the file only means scanning from 0).

Checks: a producer of a group keeps a watch stream open
(WatchTransactionChecks); every tick, each half unresolved past the
transaction timeout is sent to one of its group's watchers, round-robin, and
asked again every check interval. After transaction_check_max checks the
half is rolled back and logged (RocketMQ's discard). With no watcher of the
group connected the check counts as sent: a group that never comes back does
not keep half messages forever.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tidemark.broker.cluster.permission import BrokerPermission
from tidemark.broker.errors import (
    BrokerError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)
from tidemark.broker.faults import crash_point
from tidemark.broker.membership.groups import check_group
from tidemark.broker.store import MessageRecord, MessageStore, StoredMessage
from tidemark.broker.topics import TopicConfigManager, check_topic
from tidemark.broker.transactions.table import Half, Outcome, TransactionTable
from tidemark.common.fsutil import atomic_write
from tidemark.common.logs import get_logger
from tidemark.common.protocol import (
    TRANSACTION_HALF_TOPIC,
    TRANSACTION_OP_TOPIC,
    MessageIdGenerator,
    PropertyKey,
    tag_hash,
)

if TYPE_CHECKING:
    from tidemark.broker.ingest.send import SyncReplication

log = get_logger("tidemark.broker.transactions")

STATE_FILE_NAME = "transactionState.json"
OP_TAG = "d"  # RocketMQ's REMOVETAG
MAX_QUEUED_CHECKS = 1000  # per watcher: a producer that stopped reading loses checks, not memory


@dataclass(frozen=True, slots=True)
class Check:
    """A question to a producer: what became of this transaction?"""

    half_offset: int
    msg_id: str
    message: StoredMessage  # the half, as stored (its real topic in REAL_TOPIC)


class TransactionService:
    def __init__(self, *, store: MessageStore, topics: TopicConfigManager, permission: BrokerPermission,
                 clock_ms: Callable[[], int], config_dir: Path, timeout_ms: int, check_interval_ms: int,
                 max_checks: int, sync_replication: SyncReplication | None = None) -> None:
        self._store = store
        self._topics = topics
        self._permission = permission
        self._clock_ms = clock_ms
        self._path = Path(config_dir) / STATE_FILE_NAME
        self._limits = {"timeout_ms": timeout_ms, "check_interval_ms": check_interval_ms, "max_checks": max_checks}
        self.sync_replication = sync_replication  # as SendService's
        self._ids = MessageIdGenerator()
        self.table = TransactionTable(**self._limits)
        self._written_version = 0
        # group -> each watch's queue of checks -> (the producer's client id, the topics it sends to); keyed by
        # the watch, not the client id: two producers of a group in one process share a client id.
        self._watchers: dict[str, dict[asyncio.Queue[Check], tuple[str, frozenset[str]]]] = \
            collections.defaultdict(dict)
        self._turn = itertools.count()
        self._discard_failures: dict[int, str] = {}  # half offset -> why its rollback failed (said once)
        self.repaired = 0  # committed messages put again at start (a crash between the op and the message)
        self._unfinished: list[dict] = []  # commit ops found at load, their messages checked at start

    # -- load ------------------------------------------------------------------------------------

    def load(self) -> None:
        """Rebuild the table from the topics (after the store recovered); `start` finishes interrupted
        commits."""
        self._topics.ensure_system_topic(TRANSACTION_HALF_TOPIC, 1)
        self._topics.ensure_system_topic(TRANSACTION_OP_TOPIC, 1)
        state = self._read_state()
        table = TransactionTable(**self._limits, floor=state.get("floor", 0), op_floor=state.get("opFloor", 0))
        store = self._store
        for offset in range(max(table.floor, store.min_offset(TRANSACTION_HALF_TOPIC, 0)),
                            store.max_offset(TRANSACTION_HALF_TOPIC, 0)):
            half = store.message_at(TRANSACTION_HALF_TOPIC, 0, offset)
            if half is not None:
                table.add(offset, half.properties.get(PropertyKey.PRODUCER_GROUP, ""), half.msg_id,
                          half.properties.get(PropertyKey.REAL_TOPIC, ""), half.store_timestamp)
        op_end = store.max_offset(TRANSACTION_OP_TOPIC, 0)
        for offset in range(max(table.op_floor, store.min_offset(TRANSACTION_OP_TOPIC, 0)), op_end):
            op = _decode_op(store.message_at(TRANSACTION_OP_TOPIC, 0, offset))
            if op is None:
                continue
            if op["outcome"] == Outcome.COMMIT.value and table.get(op["half"]) is not None:
                self._unfinished.append(op)
            table.resolve(op["half"], Outcome(op["outcome"]), offset)
        table.advance_op_floor(op_end)
        table.restore_checks(state.get("checks", []))
        self.table = table
        if len(table) or self._unfinished:
            log.info("transactions loaded", event="transactions_loaded", open=len(table), floor=table.floor,
                     commits_to_check=len(self._unfinished))

    async def start(self) -> None:
        """Once the store takes writes: put again the committed messages a crash kept from their queue."""
        unfinished, self._unfinished = self._unfinished, []
        for op in unfinished:
            self._finish_commit(op)
        if self.repaired:
            await self._store.wait_durable(self._store.commit_log_max_offset)

    def _read_state(self) -> dict:
        try:
            state = json.loads(self._path.read_bytes())
            if not isinstance(state, dict):
                raise ValueError("not an object")
            return state
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.warning("%s is unusable (%s): scanning the transaction topics from the start", self._path.name, e,
                        event="transaction_state_unusable")
            return {}

    def _finish_commit(self, op: dict) -> None:
        """A commit op whose message is not at the offset the op names: the broker died between the two
        writes. Put the message again, from its half."""
        topic, queue_id, offset = op["topic"], op["queue"], op["offset"]
        if self._topics.get(topic) is None or offset < self._store.min_offset(topic, queue_id):
            return  # deleted, or taken by retention: it was there
        stored = self._store.message_at(topic, queue_id, offset)
        if stored is not None and stored.msg_id == op["msgId"]:
            return
        half = self._store.message_at(TRANSACTION_HALF_TOPIC, 0, op["half"])
        if half is None:
            log.error("committed transaction %s cannot be restored: its half message is gone", op["msgId"],
                      event="transaction_restore_failed", half_offset=op["half"])
            return
        self._store.put_messages_now([self._real_record(half, op["half"])])
        self.repaired += 1
        log.warning("committed transaction %s restored: the broker stopped between its op record and its "
                    "message", op["msgId"], event="transaction_restored", topic=topic, queue=queue_id)

    # -- half messages ---------------------------------------------------------------------------

    @staticmethod
    def is_half(properties: dict[str, str]) -> bool:
        return properties.get(PropertyKey.TRANSACTION_PREPARED, "").lower() == "true"

    def half_record(self, record: MessageRecord) -> MessageRecord:
        """A producer's half message, re-addressed to the half topic."""
        group = record.properties.get(PropertyKey.PRODUCER_GROUP, "")
        try:
            check_group(group)
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"a transactional message needs its producer group in {PropertyKey.PRODUCER_GROUP}: "
                                       f"{e}") from None
        props = {**record.properties, PropertyKey.REAL_TOPIC: record.topic, PropertyKey.REAL_QID: str(record.queue_id)}
        return MessageRecord(topic=TRANSACTION_HALF_TOPIC, queue_id=0, body=record.body, properties=props,
                             tags_code=record.tags_code, flag=record.flag, born_timestamp=record.born_timestamp,
                             born_host=record.born_host)

    def stored_half(self, record: MessageRecord) -> StoredMessage | None:
        """The open or committed half that this half record (as `half_record` re-addressed it) repeats:
        the same producer group and message id, a producer's retry of a send whose answer it lost.
        Answered with that half, never stored twice (TransactionTable); the producer's end of a
        committed one then finds it ended the way a check decided."""
        props = record.properties
        key = (props.get(PropertyKey.PRODUCER_GROUP, ""), props.get(PropertyKey.UNIQ_KEY, ""))
        offset = self.table.open_offset(*key)
        if offset is not None:
            return self._store.message_at(TRANSACTION_HALF_TOPIC, 0, offset)
        offset = self.table.committed_offset(*key)
        stored = None if offset is None else self._store.message_at(TRANSACTION_HALF_TOPIC, 0, offset)
        # A committed one answers a retry only: the same message for the same topic (an application may
        # reuse a message id for a new transaction, which must be stored).
        if stored is None or stored.body != record.body \
                or stored.properties.get(PropertyKey.REAL_TOPIC) != props.get(PropertyKey.REAL_TOPIC):
            return None
        return stored

    def added(self, half_offset: int, record: MessageRecord, store_timestamp: int) -> None:
        props = record.properties
        self.table.add(half_offset, props[PropertyKey.PRODUCER_GROUP], props[PropertyKey.UNIQ_KEY],
                       props[PropertyKey.REAL_TOPIC], store_timestamp)

    # -- ends --------------------------------------------------------------------------------------

    async def end(self, group: str, msg_id: str, half_offset: int, outcome: Outcome, *, by: str,
                  topic: str = "") -> bool:
        """Commit or roll back the half at `half_offset`; False when it had ended that way already (a
        second answer to a check). FailedPreconditionError when it ended the other way."""
        check_group(group)
        if topic:
            check_topic(topic)
        self._permission.check_writable()
        half = self.table.get(half_offset)
        if half is None:
            previous = self.table.outcome(half_offset)
            if previous is outcome:
                if self.sync_replication is not None:  # the first end's answer may have timed out on a replica
                    await self.sync_replication.wait_replicated(self._store.commit_log_max_offset)
                return False
            if previous is not None or half_offset < self.table.floor:
                raise FailedPreconditionError(
                    f"transaction {msg_id} at half offset {half_offset} has already ended"
                    + (f" ({previous.value})" if previous is not None else ""))
            raise NotFoundError(f"no transaction at half offset {half_offset} on this broker")
        if half.msg_id != msg_id or (group and half.group != group) or (topic and half.topic != topic):
            raise InvalidArgumentError(f"the transaction at half offset {half_offset} is {half.msg_id} of group "
                                       f"{half.group!r} on topic {half.topic!r}, not {msg_id} of {group!r} on "
                                       f"{topic!r}")
        stored = self._store.message_at(TRANSACTION_HALF_TOPIC, 0, half_offset)
        if stored is None:
            raise NotFoundError(f"the half message of transaction {msg_id} is gone (retention)")
        op = {"half": half_offset, "outcome": outcome.value, "msgId": msg_id, "by": by}
        real = None
        if outcome is Outcome.COMMIT:
            real = self._real_record(stored, half_offset)
            if self._topics.get(real.topic) is None:
                raise NotFoundError(f"transaction {msg_id} cannot commit: topic {real.topic!r} no longer exists")
            op.update(topic=real.topic, queue=real.queue_id, offset=self._store.max_offset(real.topic, real.queue_id))
        op_offset = self._store.max_offset(TRANSACTION_OP_TOPIC, 0)
        if self.sync_replication is not None:
            self.sync_replication.check_in_sync()  # refused before the op is stored, not after
        # The op and the message in one step: nothing else can write between them (see the module doc).
        last = self._store.put_messages_now([self._op_record(op)])[-1]
        if real is not None:
            crash_point("transaction-op-stored")
            last = self._store.put_messages_now([real])[-1]
        self.table.resolve(half_offset, outcome, op_offset)
        end = last.commit_log_offset + last.store_size
        await self._store.wait_durable(end)
        if self.sync_replication is not None:
            await self.sync_replication.wait_replicated(end)
        return True

    def _op_record(self, op: dict) -> MessageRecord:
        return MessageRecord(topic=TRANSACTION_OP_TOPIC, queue_id=0,
                             body=json.dumps(op, separators=(",", ":")).encode(),
                             properties={PropertyKey.TAGS: OP_TAG, PropertyKey.UNIQ_KEY: self._ids.next()},
                             tags_code=tag_hash(OP_TAG), flag=0, born_timestamp=self._clock_ms(), born_host="")

    def _real_record(self, half: StoredMessage, half_offset: int) -> MessageRecord:
        props = dict(half.properties)
        topic = props.pop(PropertyKey.REAL_TOPIC, "")
        queue_id = int(props.pop(PropertyKey.REAL_QID, "0"))
        props[PropertyKey.TRANSACTION_HALF_OFFSET] = str(half_offset)
        config = self._topics.get(topic)
        if config is not None and queue_id >= config.write_queue_nums:
            queue_id %= config.write_queue_nums  # the topic shrank since the half was sent
        return half.rewritten(topic=topic, queue_id=queue_id, properties=props,
                              tags_code=tag_hash(props.get(PropertyKey.TAGS, "")))

    # -- checks ------------------------------------------------------------------------------------

    def watch(self, group: str, client_id: str, topics: frozenset[str]) -> asyncio.Queue[Check]:
        """A producer of `group` takes checks of its half messages on `topics` from the returned queue
        until `unwatch`."""
        check_group(group)
        if not topics:
            raise InvalidArgumentError("a transaction check watch needs the topics the producer sends to")
        for topic in topics:
            check_topic(topic)
        queue: asyncio.Queue[Check] = asyncio.Queue(MAX_QUEUED_CHECKS)
        self._watchers[group][queue] = (client_id, topics)
        return queue

    def unwatch(self, group: str, queue: asyncio.Queue[Check]) -> None:
        self._watchers.get(group, {}).pop(queue, None)

    async def check_due(self) -> None:
        """The timer: ask a producer about every half past its timeout; roll back those asked too often."""
        if not self._permission.writable:
            return
        now = self._clock_ms()
        for due in self.table.due(now):
            half = due.half
            if due.discard:
                log.warning("transaction %s of group %s rolled back: no decision after %d checks", half.msg_id,
                            half.group, half.checks, event="transaction_discarded", half_offset=half.offset)
                try:
                    await self.end(half.group, half.msg_id, half.offset, Outcome.ROLLBACK, by="check-limit")
                except BrokerError as e:  # no replica in sync, a full disk: tried again on the next tick
                    if self._discard_failures.get(half.offset) != str(e):
                        self._discard_failures[half.offset] = str(e)
                        log.warning("discarding transaction %s failed: %s", half.msg_id, e,
                                    event="transaction_discard_failed")
                else:
                    self._discard_failures.pop(half.offset, None)
                continue
            self._send_check(half)
            self.table.checked(half.offset, now)

    def _send_check(self, half: Half) -> None:
        watchers = [queue for queue, (_, topics) in self._watchers.get(half.group, {}).items() if half.topic in topics]
        if not watchers:
            return
        message = self._store.message_at(TRANSACTION_HALF_TOPIC, 0, half.offset)
        if message is None:
            return
        queue = watchers[next(self._turn) % len(watchers)]
        try:
            queue.put_nowait(Check(half.offset, half.msg_id, message))
        except asyncio.QueueFull:
            pass  # asked again next interval

    def halves(self, group: str = "") -> list[Half]:
        """Open half messages (of one producer group, if given), oldest first."""
        if group:
            check_group(group)
        return [h for h in self.table.halves() if not group or h.group == group]

    # -- persistence -------------------------------------------------------------------------------

    async def persist_if_dirty(self) -> None:
        if self.table.version == self._written_version:
            return
        version, data = self.table.version, json.dumps(self.table.snapshot()).encode()
        try:
            await asyncio.to_thread(atomic_write, self._path, data)
        except OSError as e:
            log.warning("%s cannot be written: %s", self._path.name, e, event="transaction_state_persist_failed")
            return
        self._written_version = version


def real_view(half: StoredMessage) -> StoredMessage:
    """A half message as its producer sent it: its real topic and queue, without the broker's properties."""
    props = {k: v for k, v in half.properties.items() if k not in (PropertyKey.REAL_TOPIC, PropertyKey.REAL_QID)}
    return dataclasses.replace(half, topic=half.properties.get(PropertyKey.REAL_TOPIC, half.topic),
                               queue_id=int(half.properties.get(PropertyKey.REAL_QID, half.queue_id)),
                               properties=props)


def _decode_op(message: StoredMessage | None) -> dict | None:
    if message is None:
        return None
    try:
        op = json.loads(message.body)
        if not isinstance(op.get("half"), int) or op.get("outcome") not in ("commit", "rollback"):
            raise ValueError("not an op record")
        if op["outcome"] == "commit" and not (isinstance(op.get("topic"), str) and isinstance(op.get("queue"), int)
                                              and isinstance(op.get("offset"), int)):
            raise ValueError("a commit op without its message's place")
        return op
    except (ValueError, AttributeError) as e:
        log.warning("op record at %d skipped: %s", message.queue_offset, e, event="transaction_op_unreadable")
        return None
