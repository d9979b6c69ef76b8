"""PendingUnlocks: queues handed back whose unlock failed, asked again until the broker hears of it.

A handover ends with the old owner's final commit and unlock (`hand_back`,
bounded while the consumer runs: FINAL_UNLOCK_WAIT_S). When that call fails
(a partition, a timeout) the broker may never have had it: it keeps the lock
for us until the lock expires (60 s), while the queue's next owner waits and
nobody consumes the queue. So the call is asked again,
every LOCK_RETRY_DELAY_S, one UnlockQueues per broker with the final commits
it carries, until the broker answers, the lock has expired there anyway, or
the queue is ours again (its new grant is then ours to keep, and an unlock of
the old grant's token could not release it: the broker keeps the latest).

The retries run outside the ownership lock: a call to a broker cut off waits
its whole request timeout, and rebalances must not wait with it. Only for a
broker that names no grants (older than lock tokens) is the ownership lock
taken around the call: nothing else keeps its late unlock from releasing a
lock that came back to us meanwhile.

At shutdown nothing asks again in the background (`close`), but what is left
is asked once more with the full request time (`sweep`, beside the final
calls of the queues handed back then): each entry carries a final commit that
is lost otherwise. After those calls, what failed is asked once more
(`last_sweep`), except of a broker that just did not answer within a full
request time: a broker that does not answer holds a shutdown up for one
request timeout, not one per round.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from tidemark.client.consumer.final_unlocks import FinalUnlocks
from tidemark.client.errors import RequestTimeoutError, TidemarkError
from tidemark.client.message import MessageQueue
from tidemark.client.types import OffsetCommit
from tidemark.common.logs import get_logger
from tidemark.common.scheduler import TaskSet

log = get_logger("tidemark.client.ownership")

# Pause before asking again.
LOCK_RETRY_DELAY_S = 1.0
# How long an unlock that failed is asked again: by then the broker has let the lock expire by itself
# (RocketMQ's REBALANCE_LOCK_MAX_LIVE_TIME, the broker's default lock_expiry_ms).
LOCK_LIFETIME_S = 60.0
# How long a handover's final commit and unlock may hold up the consumer's other queue changes (a rebalance
# waits for its releases): to a broker cut off, the call would wait a whole request timeout. Past it the
# call is asked again here, outside the ownership lock, where the grant's lock token keeps a late one
# harmless (a broker without tokens keeps the request timeout: only the lock keeps its late unlocks harmless).
FINAL_UNLOCK_WAIT_S = 1.0
# A call that got no answer within its time (the broker paused, cut off, overloaded), not one refused or
# broken off at once.
UNANSWERED = (RequestTimeoutError, TimeoutError)


@dataclass(frozen=True)
class PendingUnlock:
    """A queue handed back whose unlock failed: the broker may still hold its lock for us."""

    commit: OffsetCommit | None  # its final commit, sent with the unlock
    token: int  # the grant released (0: any)
    until: float  # loop time after which the lock has expired on the broker anyway


class PendingUnlocks:
    def __init__(self, finals: FinalUnlocks, group: str, *, lock: asyncio.Lock,
                 ours: Callable[[MessageQueue], bool], stopping: Callable[[], bool]) -> None:
        self._finals = finals
        self._group = group
        self._lock = lock  # the ownership lock (for brokers that name no grants)
        self._ours = ours  # whether a queue is ours again
        self._stopping = stopping  # whether the consumer is shutting down (nothing asks again then)
        self._pending: dict[MessageQueue, PendingUnlock] = {}
        self._retries = TaskSet("unlock_retry_task_failed", "unlock retry failed", log, group=group)
        self._retrying: set[str] = set()  # brokers with a retry task
        self.retries = 0  # UnlockQueues calls asked again
        # Brokers whose last unlock got no answer in time (UNANSWERED). Every failed call tells, a final
        # call's (add) as a retry's (_ask): a retry may find nothing left to ask (the queue ours again) or
        # never run (shutdown), and a silence it did not clear kept last_sweep from asking once more a
        # broker that had refused at once since (its final commit lost).
        self._silent: set[str] = set()

    def __len__(self) -> int:
        return len(self._pending)

    def queues(self) -> list[MessageQueue]:
        return sorted(self._pending)

    def add(self, mq: MessageQueue, commit: OffsetCommit | None, token: int,
            error: BaseException | None = None) -> None:
        """Ask again for `mq`'s unlock (and its final commit) until the broker answers (`error`: why the
        call failed). After close(), only the next sweep() asks."""
        if isinstance(error, UNANSWERED):
            self._silent.add(mq.broker_name)
        elif error is not None:  # refused or broken off at once: it answers
            self._silent.discard(mq.broker_name)
        self._pending[mq] = PendingUnlock(commit, token, asyncio.get_running_loop().time() + LOCK_LIFETIME_S)
        broker = mq.broker_name
        if broker not in self._retrying:
            if self._retries.spawn(self._retry(broker), name=f"unlock-retry:{broker}") is not None:
                self._retrying.add(broker)

    async def hand_back(self, mq: MessageQueue, commit: OffsetCommit | None, token: int) -> list[TidemarkError]:
        """A leaving queue's final commit and unlock (FinalUnlocks.send): the refusals of its commit. Bounded
        by FINAL_UNLOCK_WAIT_S while the consumer runs, and asked again here when it fails; at shutdown
        nothing asks again, so the call gets its full time. Refused for good, the broker lets the lock
        expire."""
        bound = FINAL_UNLOCK_WAIT_S if token and not self._stopping() else None
        try:
            try:
                return await self._finals.send(mq, commit, token, bound)
            except (TidemarkError, TimeoutError) as e:
                if not self._stopping() or bound is None or (isinstance(e, TidemarkError) and not e.retriable):
                    raise
                # stop() ran while the bounded call was pending: nothing asks again from now on, so once
                # more with the full request time (the rule at shutdown).
                return await self._finals.send(mq, commit, token, None)
        except (TidemarkError, TimeoutError) as e:
            if isinstance(e, TidemarkError) and not e.retriable:
                # Refused for good (asked again it would be refused again): the broker lets the lock expire.
                log.warning("final commit and unlock refused", event="final_commit_failed", group=self._group,
                            queue=mq, error=e)
            else:
                log.warning("final commit and unlock failed, asking again", event="final_commit_failed",
                            group=self._group, queue=mq, error=str(e) or f"no answer within {bound} s")
                self.add(mq, commit, token, e)
            return []

    def take(self, mq: MessageQueue) -> PendingUnlock | None:
        """The queue is ours again: its old unlock must not go out (it would not release the new grant,
        but its final commit is news to hand to the new lease)."""
        return self._pending.pop(mq, None)

    async def wait(self) -> None:
        """Until the background retries have ended by themselves (each when its broker has nothing
        pending left)."""
        await self._retries.wait()

    async def close(self) -> None:
        """Stop asking in the background (shutdown)."""
        await self._retries.close()

    async def sweep(self, *, answering: bool = False) -> None:
        """Ask once for every pending queue, each broker's at once, with the full request time (with
        `answering`, not of the brokers whose last call got no answer in time)."""
        brokers = {mq.broker_name for mq in self._pending} - (self._silent if answering else set())
        await asyncio.gather(*(self._ask(broker) for broker in brokers))

    async def last_sweep(self) -> None:
        """At shutdown, once every queue's final call is done: what failed is asked once more, unless its
        broker just did not answer within a full request time (it would hold the shutdown up once more);
        then the final commits still undelivered are told."""
        await self.sweep(answering=True)
        lost = [mq for mq, p in sorted(self._pending.items()) if p.commit is not None]
        if lost:
            # The broker lets these locks expire by itself; the commits are lost, and the queues' next
            # owners resume from the group's last committed offsets (some messages consumed again).
            log.warning("final commits and unlocks not delivered at shutdown", event="final_commit_lost",
                        group=self._group, queues=", ".join(str(mq) for mq in lost))
        if len(lost) < len(self._pending):  # (no commit to lose: their next owners wait for the locks' expiry)
            log.info("unlocks not delivered at shutdown", event="unlock_lost", group=self._group,
                     queues=", ".join(str(mq) for mq in sorted(self._pending) if mq not in lost))

    async def _retry(self, broker: str) -> None:
        try:
            while True:
                await asyncio.sleep(LOCK_RETRY_DELAY_S)
                if any(p.token == 0 for mq, p in self._pending.items() if mq.broker_name == broker):
                    async with self._lock:
                        more = await self._ask(broker)
                else:
                    more = await self._ask(broker)
                if not more:
                    return
        finally:
            self._retrying.discard(broker)

    async def _ask(self, broker: str) -> bool:
        """One UnlockQueues of the broker's pending queues, with their final commits; whether any is left."""
        now = asyncio.get_running_loop().time()
        for mq in [mq for mq, p in self._pending.items() if mq.broker_name == broker]:
            if self._ours(mq) or now > self._pending[mq].until:
                del self._pending[mq]  # ours again, or the lock expired on the broker meanwhile
        pending = {mq: p for mq, p in sorted(self._pending.items()) if mq.broker_name == broker}
        if not pending:
            return False
        self.retries += 1
        outcomes = await self._finals.unlock(broker, list(pending),
                                             [p.commit for p in pending.values() if p.commit is not None],
                                             [p.token for p in pending.values()])
        if any(isinstance(outcome, UNANSWERED) for outcome in outcomes.values()):
            self._silent.add(broker)
        else:
            self._silent.discard(broker)
        for mq, p in pending.items():
            outcome = outcomes[mq]
            if isinstance(outcome, TidemarkError) and outcome.retriable:
                log.info("unlock failed again", event="unlock_retry_failed", group=self._group, queue=mq,
                         error=outcome)
                continue
            if self._pending.get(mq) is p:  # (not one that failed again meanwhile, with a newer commit)
                del self._pending[mq]
            # Fenced: the queue passed on (or came back to us) meanwhile, its offset stands; or refused for good.
            for error in [outcome] if isinstance(outcome, BaseException) else outcome:
                log.info("final commit refused on a retry", event="final_commit_refused", group=self._group,
                         queue=mq, error=error)
        log.info("unlocks asked again", event="unlock_retried", group=self._group, broker=broker,
                 queues=", ".join(str(mq) for mq in pending))
        return any(mq.broker_name == broker for mq in self._pending)
