"""MessageGroups: which messages of a queue an orderly consumer may hand to its listener, per message group.

An orderly push consumer holds a queue's broker lock and keeps its order.
RocketMQ 5 narrows "its order" to the order of each *message group* (the
stored `__SHARDINGKEY` property, Message.message_group): many groups hash to
one queue, and a group whose listener asks to wait (SUSPEND_CURRENT_QUEUE_A_MOMENT)
or is slow must hold back only its own later messages. The rule, for the
messages of one lease (one generation of the queue's ownership):

    each group with messages waiting has exactly one worker; a worker takes its
    group's messages in offset order, one batch at a time, and puts a batch it
    did not finish (suspended, or not run) back at the front of its group, so
    the next batch it takes is that one again.

Workers of different groups run side by side (up to the consume threads), so
a suspended batch, whose worker waits out the suspend time, delays nothing
but its group. Messages without a group form one group of their own per
queue (NO_GROUP): a queue of them has one worker taking offsets in order,
RocketMQ 4's per-queue orderly consumption, unchanged.

What may be committed is not decided here but by the lease's ProcessQueue,
used as concurrent consumption uses it: every message is put there when
pulled and removed when its batch succeeded or went to the dead-letter queue,
and what it returns is the smallest unfinished offset, so a slow group's
message holds the queue's committed offset back (a restart redelivers it and
the later messages of every group, never skips one), and the offset never
moves back.

Pure: no I/O, no clock; confined to the consumer's event-loop thread like
the ProcessQueue.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from tidemark.client.message import MessageExt
from tidemark.common.protocol import PropertyKey

__all__ = ["NO_GROUP", "MessageGroups", "group_of"]

# The group of messages sent without one ("" is not a valid message group, so it names no real one).
NO_GROUP = ""


def group_of(msg: MessageExt) -> str:
    return msg.properties.get(PropertyKey.SHARDING_KEY) or NO_GROUP


class MessageGroups:
    """The waiting messages of one lease by message group, and which groups have a worker."""

    def __init__(self) -> None:
        self._waiting: dict[str, deque[MessageExt]] = {}
        self._workers: set[str] = set()
        # Offsets arrive in increasing order within a lease (a stream reopens where it was); one seen
        # already (waiting, being consumed or finished) is never taken a second time.
        self._last_offset = -1

    def add(self, msgs: Iterable[MessageExt]) -> list[str]:
        """Pulled messages, in offset order. Returns the groups that need a worker started: they had
        none and now have messages; they count as having one from here."""
        started: list[str] = []
        for msg in msgs:
            if msg.queue_offset <= self._last_offset:
                continue
            self._last_offset = msg.queue_offset
            group = group_of(msg)
            waiting = self._waiting.get(group)
            if waiting is None:
                waiting = self._waiting[group] = deque()
            waiting.append(msg)
            if group not in self._workers:
                self._workers.add(group)
                started.append(group)
        return started

    def take(self, group: str, batch_size: int) -> list[MessageExt]:
        """The group worker's next batch: up to batch_size of its first waiting messages, in offset
        order. Empty when none wait: the worker then ends and says so with `stop` (until then the group
        counts as having a worker, so messages added meanwhile are the ending worker's to hand on)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        waiting = self._waiting.get(group)
        if not waiting:
            return []
        return [waiting.popleft() for _ in range(min(batch_size, len(waiting)))]

    def put_back(self, group: str, batch: Sequence[MessageExt]) -> None:
        """A batch its worker did not finish goes back to the front of its group, in order (copies
        with a higher reconsume_times may stand in for the messages)."""
        waiting = self._waiting.get(group)
        if waiting is None:
            waiting = self._waiting[group] = deque()
        waiting.extendleft(reversed(batch))

    def stop(self, group: str) -> bool:
        """The group's worker ended: its group ran dry, its batch was not run, the lease stopped counting,
        or it died. True when messages of the group wait (added after its last take, or put back): a
        new worker may `claim` it."""
        self._workers.discard(group)
        if self._waiting.get(group):
            return True
        self._waiting.pop(group, None)
        return False

    def claim(self, group: str) -> bool:
        """Start a worker for a group that has messages waiting and none (False otherwise)."""
        if group in self._workers or not self._waiting.get(group):
            return False
        self._workers.add(group)
        return True

    def unclaimed(self) -> list[str]:
        """Claim every group that has messages waiting and no worker (after the consumer resumes)."""
        return [group for group in list(self._waiting) if self.claim(group)]

    @property
    def busy(self) -> bool:
        """Whether any group has a worker."""
        return bool(self._workers)

    def has_worker(self, group: str) -> bool:
        return group in self._workers

    def waiting(self, group: str) -> int:
        """Messages of the group waiting for its worker (not counting a batch it holds)."""
        return len(self._waiting.get(group, ()))

    def __repr__(self) -> str:
        return (f"MessageGroups(groups={len(self._waiting)}, workers={len(self._workers)}, "
                f"last_offset={self._last_offset})")
