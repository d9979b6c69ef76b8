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
applies and refuses them queue by queue, as it does for a call of one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tidemark.client.errors import TidemarkError
from tidemark.client.message import MessageQueue
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.client.types import OffsetCommit

Refusals = list[tuple[MessageQueue, TidemarkError]]


@dataclass
class _Call:
    """One UnlockQueues call being gathered."""

    done: asyncio.Future[Refusals]
    queues: list[MessageQueue] = field(default_factory=list)
    commits: list[OffsetCommit] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

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

    async def send(self, mq: MessageQueue, commit: OffsetCommit | None, token: int,
                   bound: float | None) -> list[TidemarkError]:
        """Commit `commit` (if any) and release the grant `token` of `mq`; the refusals of its commit.
        The call is given up after `bound` seconds (TimeoutError; None: the request timeout); its
        TidemarkError or TimeoutError is raised for every queue it carried."""
        key = (mq.broker_name, bound)
        call = self._gathering.get(key)
        if call is not None:  # a call is being gathered: ride along
            call.add(mq, commit, token)
            refused = await asyncio.shield(call.done)
        else:
            call = self._gathering[key] = _Call(asyncio.get_running_loop().create_future())
            call.add(mq, commit, token)
            try:
                await asyncio.sleep(0)  # the queues whose drains end in this loop turn join
            except asyncio.CancelledError:
                call.done.cancel()  # (the riders are not left waiting)
                raise
            finally:
                if self._gathering.get(key) is call:
                    del self._gathering[key]
            refused = await self._send(call, bound)
        return [error for queue, error in refused if queue == mq]

    async def _send(self, call: _Call, bound: float | None) -> Refusals:
        try:
            async with asyncio.timeout(bound):
                conn = await self._cluster.connection(call.queues[0].broker_name)
                refused = await conn.unlock_queues(self._group, self._client_id, call.queues, call.commits,
                                                   tokens=call.tokens)
        except asyncio.CancelledError:
            call.done.cancel()
            raise
        except BaseException as e:
            call.done.set_exception(e)
            call.done.exception()  # (retrieved here: every rider has it raised)
            raise
        call.done.set_result(refused)
        return refused
