"""PendingUnlocks: queues we let go of whose unlock failed, asked again until the broker hears of it.

A handover's final commit and unlock go in one UnlockQueues call. When that call fails (a partition, a
timeout) it may never have reached the broker, which then keeps the lock for us until it expires while
the queue's next owner waits and nobody consumes the queue (a partition of a few seconds stalled a
queue for a minute). So the unlock, with its final commit, is asked again every LOCK_RETRY_DELAY_S per
broker until the broker answers, the lock has expired on the broker anyway, or the queue is ours again.

The calls run without the ownership lock: a broker cut off must not hold up rebalances and lock starts
for the others for a request timeout each second. A queue that comes back to us must never be released
by a late unlock nor see its offset moved back by its old final commit, so taking it back first waits
for a call already asking for it (`settle`) and then drops its pending record: the broker has answered
(or the call has given up) before the new LockQueues is sent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tidemark.client.errors import TidemarkError
from tidemark.client.message import MessageQueue
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.client.types import OffsetCommit, QueueLockGrant
from tidemark.common.logs import get_logger
from tidemark.common.scheduler import TaskSet

log = get_logger("tidemark.client.ownership")

# Pause before asking again after a broker could not be asked at all.
LOCK_RETRY_DELAY_S = 1.0
# A broker's lock lifetime until one of its grants tells it (each grant carries the broker's expiry,
# from its lock_expiry_ms setting): RocketMQ's REBALANCE_LOCK_MAX_LIVE_TIME, the broker's default.
LOCK_LIFETIME_S = 60.0


def lock_lifetime_s(grant: QueueLockGrant, wall_ms: float) -> float | None:
    """The lock lifetime a grant tells, received at `wall_ms` (None: the grant does not say). A broker
    clock behind ours shortens it (retries end early: the next owner waits for the expiry, as without
    retries), one ahead lengthens it (retries the broker would answer just the same)."""
    if grant.expire_timestamp <= 0:
        return None
    return max(0.0, (grant.expire_timestamp - wall_ms) / 1000.0)


@dataclass(frozen=True, eq=False)
class _PendingUnlock:
    """A queue handed back whose unlock failed: the broker may still hold its lock for us. Compared by
    identity: a record replaced while a call was asking for the old one stays pending."""

    commit: OffsetCommit | None  # its final commit, sent with the unlock
    until: float  # loop time after which the lock has expired on the broker anyway


class PendingUnlocks:
    def __init__(self, *, cluster: BrokerCluster, group: str, client_id: str, request_timeout_s: float,
                 held: Callable[[MessageQueue], bool]) -> None:
        self._cluster = cluster
        self._group = group
        self._client_id = client_id
        self._request_timeout_s = request_timeout_s
        self._held = held  # whether a queue is ours again: its pending unlock is void then
        self._pending: dict[MessageQueue, _PendingUnlock] = {}
        self._lifetime_s: dict[str, float] = {}  # per broker, as its grants tell
        # Calls under way per queue: taking a queue back waits for them (`settle`).
        self._asking: dict[MessageQueue, asyncio.Future[None]] = {}
        self._retries = TaskSet("unlock_retry_task_failed", "unlock retry failed", log, group=group)
        self._retrying: set[str] = set()  # brokers with a retry task

    def __contains__(self, mq: MessageQueue) -> bool:
        return mq in self._pending

    def learn(self, broker: str, grants: Iterable[QueueLockGrant]) -> None:
        """Note the lock lifetime a broker's grants tell."""
        wall_ms = time.time() * 1000
        for grant in grants:
            lifetime = lock_lifetime_s(grant, wall_ms)
            if lifetime is not None:
                self._lifetime_s[broker] = lifetime

    def add(self, mq: MessageQueue, commit: OffsetCommit | None, *, renewed_at: float | None) -> None:
        """Ask again for the unlock of a queue whose lock the broker last granted or may have renewed at
        loop time `renewed_at` (None: not known, count from now)."""
        if renewed_at is None:
            renewed_at = asyncio.get_running_loop().time()
        until = renewed_at + self._lifetime_s.get(mq.broker_name, LOCK_LIFETIME_S)
        self._pending[mq] = _PendingUnlock(commit, until)
        broker = mq.broker_name
        if broker not in self._retrying:
            if self._retries.spawn(self._retry(broker), name=f"unlock-retry:{broker}") is not None:
                self._retrying.add(broker)

    async def settle(self, mq: MessageQueue) -> None:
        """The queue is ours again: once no call asks for its unlock any more, forget it."""
        while (asking := self._asking.get(mq)) is not None:
            await asyncio.shield(asking)
        self._pending.pop(mq, None)

    async def wait(self) -> None:
        """Until every retry has ended on its own."""
        await self._retries.wait()

    async def close(self) -> None:
        """At shutdown: stop the retries, then ask once more for every pending unlock with its final commit
        (bounded by one request timeout), so the next owners start where we stopped and without waiting.
        A failure is only logged."""
        await self._retries.close()
        brokers = sorted({mq.broker_name for mq in self._pending})
        if not brokers:
            return
        try:
            async with asyncio.timeout(self._request_timeout_s):
                await asyncio.gather(*(self._ask(broker) for broker in brokers))
        except TimeoutError:
            log.warning("last unlocks at shutdown got no answer", event="unlock_at_shutdown_failed",
                        group=self._group, brokers=", ".join(brokers))
        self._pending.clear()

    async def _retry(self, broker: str) -> None:
        try:
            while True:
                await asyncio.sleep(LOCK_RETRY_DELAY_S)
                if not await self._ask(broker):
                    return
        finally:
            self._retrying.discard(broker)

    async def _ask(self, broker: str) -> bool:
        """One UnlockQueues of the broker's pending queues, with their final commits; whether any is left."""
        now = asyncio.get_running_loop().time()
        for mq in [mq for mq, p in self._pending.items() if mq.broker_name == broker]:
            if self._held(mq) or now > self._pending[mq].until:
                del self._pending[mq]  # ours again, or the lock expired on the broker meanwhile
        pending = {mq: p for mq, p in self._pending.items() if mq.broker_name == broker}
        if not pending:
            return False
        asking = asyncio.get_running_loop().create_future()
        for mq in pending:
            self._asking[mq] = asking
        try:
            conn = await self._cluster.connection(broker)
            refused = await conn.unlock_queues(self._group, self._client_id, sorted(pending),
                                               [p.commit for p in pending.values() if p.commit is not None])
        except TidemarkError as e:
            log.info("unlock failed again", event="unlock_retry_failed", group=self._group, broker=broker,
                     queues=len(pending), error=e)
            return True
        finally:
            for mq in pending:
                if self._asking.get(mq) is asking:
                    del self._asking[mq]
            asking.set_result(None)
        for mq, p in pending.items():
            if self._pending.get(mq) is p:  # (not one that failed again meanwhile, with a newer commit)
                del self._pending[mq]
        log.info("queues unlocked on a retry", event="unlock_retried", group=self._group, broker=broker,
                 queues=", ".join(str(mq) for mq in sorted(pending)))
        for error in refused:  # fenced: the queue passed on meanwhile, and its new owner's offset stands
            log.info("final commit refused on a retry", event="final_commit_refused", group=self._group,
                     broker=broker, error=error)
        return any(mq.broker_name == broker for mq in self._pending)
