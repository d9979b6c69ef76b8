"""FinalUnlocks: the final commits and unlocks of queues leaving together, in one call per broker.

A handover releases several queues at once (a rebalance that gives some of
ours to a joining member, a shutdown). Each leaving queue drains, then sends
its final commit and unlock (ownership.py). The queues of one broker whose
drains end in the same loop turn go in one UnlockQueues call: the broker
serves one request among the group's traffic instead of one per queue, and
the next owners get all of them at once. A queue whose drain ends later
goes in the next call: nothing waits for a slow drain.

Nothing of the handover rules changes: each queue in the call names its own
grant (lock token) and carries its own fenced final commit, and the broker
applies and refuses them queue by queue, as it does for a call of one. A
call refused whole (the group may no longer consume one of the topics named
in it) is asked again queue by queue, so that one queue's refusal costs no
other queue its final commit. The call is sent by a task of its own, not by
one of the queues riding on it: a queue whose release is cancelled does not
take the others' final commits down with it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tidemark.client.errors import ClientStateError, TidemarkError
from tidemark.client.message import MessageQueue
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.client.types import OffsetCommit
from tidemark.common.logs import get_logger
from tidemark.common.scheduler import TaskSet

log = get_logger("tidemark.client.final_unlocks")

# Per queue: the refusals of its final commit, or why its call failed (TidemarkError, TimeoutError).
Outcome = list[TidemarkError] | BaseException


@dataclass
class _Call:
    """One UnlockQueues call being gathered."""

    queues: list[MessageQueue] = field(default_factory=list)
    commits: list[OffsetCommit] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    task: asyncio.Task[dict[MessageQueue, Outcome]] | None = None

    def add(self, mq: MessageQueue, commit: OffsetCommit | None, token: int) -> None:
        self.queues.append(mq)
        self.tokens.append(token)
        if commit is not None:
            self.commits.append(commit)


class FinalUnlocks:
    def __init__(self, cluster: BrokerCluster, group: str, client_id: str) -> None:
        self._cluster = cluster
        self._group = group
        self._client_id = client_id
        self._gathering: dict[tuple[str, float | None], _Call] = {}  # (broker, bound) -> the call being gathered
        # The calls under way; each ends by itself (within its bound or the request timeout).
        self._calls = TaskSet("final_unlock_failed", "final commit and unlock call failed", log, group=group)

    async def send(self, mq: MessageQueue, commit: OffsetCommit | None, token: int,
                   bound: float | None) -> list[TidemarkError]:
        """Commit `commit` (if any) and release the grant `token` of `mq`; the refusals of its commit.
        The call is given up after `bound` seconds (TimeoutError; None: the request timeout); a call that
        failed raises its TidemarkError or TimeoutError for every queue it carried."""
        key = (mq.broker_name, bound)
        call = self._gathering.get(key)
        if call is None:  # else a call is being gathered: ride along
            if self._calls.closed:
                raise ClientStateError(f"{mq}: final commit and unlock after the consumer stopped")
            call = self._gathering[key] = _Call()
            call.task = self._calls.spawn(self._send(key, call, bound), name=f"final-unlock:{mq.broker_name}")
        call.add(mq, commit, token)
        outcome = (await asyncio.shield(call.task))[mq]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def close(self) -> None:
        """Once the calls under way have ended (each within its bound or the request timeout), refuse
        new ones (shutdown)."""
        await self._calls.wait()
        await self._calls.close()

    async def _send(self, key: tuple[str, float | None], call: _Call,
                    bound: float | None) -> dict[MessageQueue, Outcome]:
        try:
            await asyncio.sleep(0)  # the queues whose drains end in this loop turn join
        finally:
            if self._gathering.get(key) is call:
                del self._gathering[key]
        try:
            async with asyncio.timeout(bound):
                return await self.unlock(key[0], call.queues, call.commits, call.tokens)
        except TimeoutError as e:
            return {mq: e for mq in call.queues}

    async def unlock(self, broker: str, queues: list[MessageQueue], commits: list[OffsetCommit],
                     tokens: list[int]) -> dict[MessageQueue, Outcome]:
        """One UnlockQueues of `queues` (with their final commits and lock tokens) and each one's outcome;
        refused whole, asked again queue by queue."""
        try:
            conn = await self._cluster.connection(broker)
            refused = await conn.unlock_queues(self._group, self._client_id, queues, commits, tokens=tokens)
        except TidemarkError as e:
            if e.retriable or len(queues) == 1:
                return {mq: e for mq in queues}
            log.warning("final commits and unlocks refused together, asking queue by queue",
                        event="final_unlock_split", group=self._group, broker=broker, queues=len(queues), error=e)
            answers = await asyncio.gather(*(
                self.unlock(broker, [mq], [c for c in commits if c.queue == mq], [token])
                for mq, token in zip(queues, tokens, strict=True)))
            return {mq: outcome for answer in answers for mq, outcome in answer.items()}
        out: dict[MessageQueue, Outcome] = {mq: [] for mq in queues}
        for mq, error in refused:
            out.setdefault(mq, []).append(error)
        return out
