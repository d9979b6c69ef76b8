"""DedupListener: run a push consumer's listener at most once per message key, within a bounded window.

Delivery is at least once: a consumer that dies before its offset
is committed, a broker that restarts before it persisted the offsets, a queue
moving to another consumer, a producer sending again after a timeout: each can
hand a listener a message it has already handled. Where the business
operation cannot be made idempotent itself, DedupListener wraps the listener
and keeps a mark per (consumer group, topic, key):

    absent --claim--> CONSUMING --listener succeeded--> CONSUMED --expiry or eviction--> absent
                       |      ^
                       |      +-- claimed again once consuming_expire_s has passed (a holder that hung)
                       +-- listener failed or raised: the mark is deleted, so the retry runs

Claiming is atomic. Absent (or an expired CONSUMING mark) becomes CONSUMING
and the message runs; CONSUMED means it ran already: skipped, it counts as
consumed; a live CONSUMING mark means a copy is running right now, so this one
is retried later, not skipped: the running copy may still fail, and a skip
would then lose the message.

Batches: the claims split a batch into skipped messages and a run that the
user's listener gets in one call, in batch order. The consume services count
the messages up to ack_index as consumed and retry the rest, so what goes back
must be a prefix of the batch; _settle() derives it. Nothing a call marks
CONSUMED lies after its prefix, so a handled message is never sent back.

The stores (dedup_stores.py) serve one process (docs/dedup.md says what that
promises); marks shared between processes need a DedupStore over Redis or a
database.
"""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidemark.client.consumer.consume_concurrently import checked_status
from tidemark.client.consumer.dedup_stores import (
    Claim,
    ClaimOutcome,
    DedupStore,
    FileDedupStore,
    MemoryDedupStore,
    RecordKey,
)
from tidemark.client.consumer.listener import (
    ConsumeConcurrentlyContext,
    ConsumeOrderlyContext,
    split_by_ack_index,
)
from tidemark.client.errors import InvalidArgumentError, InvalidTypeError
from tidemark.client.message import ConsumeConcurrentlyStatus, ConsumeOrderlyStatus, MessageExt
from tidemark.common.logs import get_logger

__all__ = ["Claim", "ClaimOutcome", "DedupKey", "DedupListener", "DedupStats", "DedupStore", "FileDedupStore",
           "MemoryDedupStore"]

log = get_logger("tidemark.client.dedup")

DEFAULT_CONSUMING_EXPIRE_S = 60.0
# Longer than RocketMQ's whole retry schedule (16 retries take about 4 h 46 min), so a message that
# succeeded while one of its copies was still waiting in the retry topic is still remembered.
DEFAULT_RECORD_EXPIRE_S = 24 * 3600.0

KeyFunction = Callable[[MessageExt], "str | None"]


class DedupKey(enum.Enum):
    """What identifies a message for deduplication."""

    # The message id (RocketMQ's UNIQ_KEY): the same across redeliveries, broker retries and the
    # producer's own retries of one send() call; a new one when the application sends again.
    MSG_ID = "MSG_ID"
    # Message.keys, the whole string: catches an application that sends the same business message
    # twice. A message without keys falls back to its message id.
    KEYS = "KEYS"


@dataclass(frozen=True, slots=True)
class DedupStats:
    skipped: int  # messages not given to the listener because their key was CONSUMED
    deferred: int  # messages retried later because a copy of them held a live CONSUMING mark


# -- the listener -------------------------------------------------------------------------------


class _Fate(enum.Enum):
    RUN = "RUN"  # given to the user's listener (run index: its place in the run)
    SKIP = "SKIP"  # CONSUMED already
    COPY = "COPY"  # a second message of the batch with a key the run holds (run index: that message's)


@dataclass(slots=True)
class _Plan:
    """One batch after claiming: what runs, what is skipped, where claiming stopped."""

    run: list[MessageExt] = field(default_factory=list)
    claims: list[Claim | None] = field(default_factory=list)  # per run member; None: not deduplicated
    fates: list[tuple[_Fate, int]] = field(default_factory=list)  # per claimed message of the batch, in order


class DedupListener:
    """Wraps a concurrent or orderly listener so it sees each key once (see the module docstring).

        store = FileDedupStore("/var/lib/app/orders.dedup", max_entries=200_000)
        consumer.register_message_listener(DedupListener(handle, group="orders", store=store, key=DedupKey.KEYS))

    The same object serves register_message_listener and register_message_listener_orderly: it
    tells them apart by the context it is called with. `group` must be the consumer's group: marks
    are per (group, topic, key), so one store can serve several groups. `key` is a DedupKey or a
    function of the message returning the key (None or "": that message is not deduplicated).
    A CONSUMING mark older than `consuming_expire_s` is taken over, so it must exceed the
    listener's longest run; a CONSUMED mark is kept `record_expire_s` (and while the store has room).
    """

    def __init__(self, listener: Callable[..., Any], *, group: str, store: DedupStore | None = None,
                 key: DedupKey | KeyFunction = DedupKey.MSG_ID,
                 consuming_expire_s: float = DEFAULT_CONSUMING_EXPIRE_S,
                 record_expire_s: float = DEFAULT_RECORD_EXPIRE_S) -> None:
        if not callable(listener):
            raise InvalidTypeError(f"listener must be callable, not {type(listener).__name__}")
        if not isinstance(group, str) or not group:
            raise InvalidArgumentError(f"group must be the consumer group's name, got {group!r}")
        if store is None:
            store = MemoryDedupStore()
        elif not isinstance(store, DedupStore):
            raise InvalidTypeError(f"store must be a DedupStore, not {type(store).__name__}")
        if not isinstance(key, DedupKey) and not callable(key):
            raise InvalidTypeError(f"key must be a DedupKey or a function of the message, got {key!r}")
        self.listener = listener
        self.group = group
        self.store = store
        self.key = key
        self.consuming_expire_s = _positive_seconds("consuming_expire_s", consuming_expire_s)
        self.record_expire_s = _positive_seconds("record_expire_s", record_expire_s)
        self._stats_lock = threading.Lock()
        self._skipped = 0
        self._deferred = 0

    def stats(self) -> DedupStats:
        with self._stats_lock:
            return DedupStats(self._skipped, self._deferred)

    def __call__(self, msgs: Sequence[MessageExt], context: ConsumeConcurrentlyContext | ConsumeOrderlyContext
                 ) -> ConsumeConcurrentlyStatus | ConsumeOrderlyStatus:
        if isinstance(context, ConsumeOrderlyContext):
            return self._consume_orderly(msgs, context)
        return self._consume_concurrently(msgs, context)

    def key_of(self, msg: MessageExt) -> str | None:
        """The message's dedup key; None: not deduplicated."""
        if self.key is DedupKey.MSG_ID:
            return msg.msg_id or None
        if self.key is DedupKey.KEYS:
            return msg.keys.strip() or msg.msg_id or None
        key = self.key(msg)
        if key is None or key == "":
            return None
        if not isinstance(key, str):
            raise InvalidTypeError(f"the dedup key function returned {type(key).__name__}, expected str or None")
        return key

    # -- one batch ----------------------------------------------------------------------------

    def _consume_concurrently(self, msgs: Sequence[MessageExt],
                              context: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        plan = self._plan(msgs)
        ok = 0
        if plan.run:
            # The user's listener gets its own context: its ack_index counts in the run, not the batch.
            inner = ConsumeConcurrentlyContext(message_queue=context.message_queue,
                                               delay_level_when_next_consume=context.delay_level_when_next_consume)
            result = self._run(plan, inner)
            status = checked_status(result, context.message_queue)
            ok = split_by_ack_index(len(plan.run), status, inner.ack_index if status is result else None)
            context.delay_level_when_next_consume = inner.delay_level_when_next_consume
        consumed = self._settle(plan, ok)
        self._count(plan, consumed, len(msgs))
        if consumed == len(msgs):
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
        context.ack_index = consumed - 1
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS if consumed else ConsumeConcurrentlyStatus.RECONSUME_LATER

    def _consume_orderly(self, msgs: Sequence[MessageExt], context: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        """Orderly batches are all or nothing: SUCCESS only once every message is consumed or skipped.
        A run that succeeded before a message in flight elsewhere stays CONSUMED: when the suspended
        batch comes back it is skipped, and the queue's order holds."""
        plan = self._plan(msgs)
        ok = 0
        if plan.run:
            result = self._run(plan, context)
            if result is ConsumeOrderlyStatus.SUCCESS:
                ok = len(plan.run)
            elif not isinstance(result, ConsumeOrderlyStatus):
                log.error("orderly listener returned %r; treating it as SUSPEND_CURRENT_QUEUE_A_MOMENT", result,
                          event="listener_bad_status", queue=context.message_queue)
        consumed = self._settle(plan, ok)
        complete = consumed == len(msgs)
        self._count(plan, consumed if complete else 0, len(msgs))
        return ConsumeOrderlyStatus.SUCCESS if complete else ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT

    def _plan(self, msgs: Sequence[MessageExt]) -> _Plan:
        """Claim the batch's keys in order, up to the first message in flight elsewhere: only a prefix
        can be reported consumed, so it and all after it are retried anyway, and running them now
        would be work thrown away (holding marks that block their copies)."""
        plan = _Plan()
        held: dict[RecordKey, int] = {}
        try:
            for msg in msgs:
                key = self.key_of(msg)
                if key is None:
                    plan.fates.append((_Fate.RUN, len(plan.run)))
                    plan.run.append(msg)
                    plan.claims.append(None)
                    continue
                record_key = (self.group, msg.topic, key)
                if record_key in held:
                    plan.fates.append((_Fate.COPY, held[record_key]))
                    continue
                claim = self.store.claim(record_key, self.consuming_expire_s)
                if claim.outcome is ClaimOutcome.DUPLICATE:
                    plan.fates.append((_Fate.SKIP, -1))
                elif claim.outcome is ClaimOutcome.IN_FLIGHT:
                    break
                else:
                    held[record_key] = len(plan.run)
                    plan.fates.append((_Fate.RUN, len(plan.run)))
                    plan.run.append(msg)
                    plan.claims.append(claim)
        except BaseException:
            self._release(plan.claims)
            raise
        return plan

    def _run(self, plan: _Plan, context: object) -> object:
        try:
            return self.listener(list(plan.run), context)
        except BaseException:
            # The consume service logs it and retries the whole batch: the retry must run again.
            self._release(plan.claims)
            raise

    def _settle(self, plan: _Plan, ok: int) -> int:
        """Mark the first `ok` run members CONSUMED and release the rest; return how many messages of
        the batch count as consumed: the longest prefix of claimed messages that are each skipped,
        a run member among the first `ok`, or a copy of one. The user's ack_index is a prefix of
        the run and the run keeps batch order, so every member marked CONSUMED lies in that prefix."""
        for i, claim in enumerate(plan.claims):
            if claim is None:
                continue
            try:
                if i < ok:
                    self.store.mark_consumed(claim, self.record_expire_s)
                else:
                    self.store.release(claim)
            except Exception:
                # The listener's outcome stands; the mark stays CONSUMING until consuming_expire_s.
                log.error("dedup store failed; the mark of %r stays CONSUMING until it expires", claim.key,
                          event="dedup_store_error", exc_info=True)
        consumed = 0
        for fate, index in plan.fates:
            if fate is not _Fate.SKIP and index >= ok:
                break
            consumed += 1
        return consumed

    def _release(self, claims: list[Claim | None]) -> None:
        for claim in claims:
            if claim is not None:
                try:
                    self.store.release(claim)
                except Exception:
                    log.error("dedup store failed to release %r; it stays CONSUMING until it expires", claim.key,
                              event="dedup_store_error", exc_info=True)

    def _count(self, plan: _Plan, consumed: int, size: int) -> None:
        # Only skips that count as consumed: the others come back and are counted then.
        skipped = sum(1 for fate, _ in plan.fates[:consumed] if fate is not _Fate.RUN)
        deferred = int(len(plan.fates) < size)
        if skipped or deferred:
            with self._stats_lock:
                self._skipped += skipped
                self._deferred += deferred


def _positive_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidTypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise InvalidArgumentError(f"{name} must be a positive number of seconds, got {value}")
    return float(value)
