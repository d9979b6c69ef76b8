"""OwnershipHooks: what a consumer kind decides when QueueOwnership (ownership.py) takes or lets go of a queue.

What differs between a push and a lite pull consumer is left to these hooks,
as RocketMQ's RebalanceImpl leaves computePullFromWhere, dispatchPullRequest
and removeUnnecessaryMessageQueue to its subclasses. A hook that raises is a
fault ownership survives: the queue is asked for again or let go, never left
held with nothing fetching it.
"""

from __future__ import annotations

from typing import Protocol

from tidemark.client.consumer.lease import QueueLease
from tidemark.client.message import MessageQueue


class OwnershipHooks(Protocol):
    """What a consumer kind decides (RocketMQ's RebalanceImpl hooks)."""

    #: Record the computed start of a queue as its progress (push: a group that owned a queue and
    #: consumed nothing resumes there; lite pull commits only what the application polled).
    commit_start_offset: bool

    #: A leaving queue is kept, locked, until its running listener calls return, however long past the
    #: drain timeout (orderly push: RocketMQ's rule); otherwise it is handed back at the timeout.
    orderly: bool

    async def start_offset(self, mq: MessageQueue, committed: int | None) -> int:
        """computePullFromWhere: where reading a newly owned queue starts (`committed`: the group's
        offset when the lock grant told it; None: ask the broker)."""

    async def lease_started(self, lease: QueueLease) -> None:
        """dispatchPullRequest: start fetching the lease from its start offset."""

    async def lease_draining(self, lease: QueueLease) -> None:
        """removeUnnecessaryMessageQueue: stop fetching; return once the lease's running work is done
        (bounded by the drain timeout; called again while an orderly lease's work runs)."""

    def lease_ended(self, lease: QueueLease) -> None:
        """Forget the lease: stop fetching, drop what is buffered for it."""

    def queue_lost(self, mq: MessageQueue) -> None:
        """Ownership was taken away (or, after a pause, a lease could not start; or a kept orderly queue
        was handed back, and may have come back meanwhile): heartbeat and rebalance now rather than at the
        next timer."""
