"""TransactionTable: which half messages wait for their producer's decision, and when to ask again.

RocketMQ's transactional messages: a producer sends a **half message** (stored
in RMQ_SYS_TRANS_HALF_TOPIC, invisible to consumers), runs its local
transaction, and ends it: commit (the message is put on its real topic and
queue) or rollback (it never is). Either end is recorded as an **op record**
in RMQ_SYS_TRANS_OP_HALF_TOPIC. A half that stays unresolved past the
transaction timeout is **checked**: the broker asks a producer of the group
what became of it, every check interval, up to a maximum number of checks,
after which it is rolled back.

The table holds, per half (by its queue offset in the half topic): the group,
the message id, when it was stored, how many checks were sent and when the
next is due. Open halves are also found by (group, message id): a producer
that lost the answer to a half send retries it with the same message id, and
the broker answers that retry with the half it holds instead of storing a
second one, which a check would later commit as a second copy. So are the
last COMMITTED_IDS_KEPT halves that were committed: a check can commit the
first copy while the producer still retries its send, and the retry must not
store a second (a rolled-back one is forgotten: a retry after it is a new
attempt, which only its own end can commit). Everything below the **floor** is resolved; the floor and the
op-topic offset below which no op matters any more (the op floor) are what a
restart needs to rebuild the table by scanning both topics from there
(broker/transactions/service.py).

Pure: no clock reads (`now_ms` is an argument), no I/O.
"""

from __future__ import annotations

import collections
import enum
from dataclasses import dataclass

# How many committed halves are remembered by (group, message id) for retried sends; a producer's retries end
# within seconds, and 4,096 ids cost well under a megabyte.
COMMITTED_IDS_KEPT = 4096


class Outcome(enum.Enum):
    COMMIT = "commit"
    ROLLBACK = "rollback"


@dataclass(slots=True)
class Half:
    offset: int  # queue offset in the half topic
    group: str
    msg_id: str
    topic: str  # where it goes once committed
    stored_ms: int
    checks: int = 0
    next_check_ms: int = 0


@dataclass(frozen=True, slots=True)
class Due:
    half: Half
    discard: bool  # checked the maximum number of times: roll back instead of asking again


class TransactionTable:
    def __init__(self, *, timeout_ms: int, check_interval_ms: int, max_checks: int, floor: int = 0,
                 op_floor: int = 0) -> None:
        self.timeout_ms = timeout_ms
        self.check_interval_ms = check_interval_ms
        self.max_checks = max_checks
        self._open: dict[int, Half] = {}
        self._by_id: dict[tuple[str, str], int] = {}  # (group, msg id) -> offset of its open half
        # (group, msg id) -> offset of its committed half, the latest COMMITTED_IDS_KEPT.
        self._committed_by_id: collections.OrderedDict[tuple[str, str], int] = collections.OrderedDict()
        # Resolved halves at or above the floor: half offset -> (outcome, op record offset).
        self._resolved: dict[int, tuple[Outcome, int]] = {}
        self._floor = floor
        self._op_floor = op_floor
        self._end = floor  # the half topic is known up to here
        self.version = 0

    def __len__(self) -> int:
        return len(self._open)

    def halves(self) -> list[Half]:
        return sorted(self._open.values(), key=lambda h: h.offset)

    def get(self, offset: int) -> Half | None:
        return self._open.get(offset)

    def open_offset(self, group: str, msg_id: str) -> int | None:
        """The offset of the open half of this group with this message id, if there is one."""
        return self._by_id.get((group, msg_id))

    def committed_offset(self, group: str, msg_id: str) -> int | None:
        """The offset of a recently committed half of this group with this message id, if there is one."""
        return self._committed_by_id.get((group, msg_id))

    def outcome(self, offset: int) -> Outcome | None:
        """How a resolved half ended (None: open, unknown, or below the floor where outcomes are forgotten)."""
        resolved = self._resolved.get(offset)
        return resolved[0] if resolved is not None else None

    @property
    def floor(self) -> int:
        return self._floor

    @property
    def op_floor(self) -> int:
        return self._op_floor

    def add(self, offset: int, group: str, msg_id: str, topic: str, stored_ms: int) -> None:
        """A half message stored at `offset` (live, or found by the startup scan)."""
        if offset < self._floor or offset in self._resolved or offset in self._open:
            return
        self._open[offset] = Half(offset, group, msg_id, topic, stored_ms, 0, stored_ms + self.timeout_ms)
        self._by_id.setdefault((group, msg_id), offset)
        self._end = max(self._end, offset + 1)
        self.version += 1

    def resolve(self, offset: int, outcome: Outcome, op_offset: int) -> None:
        """The op record at `op_offset` ended the half at `offset`."""
        if offset < self._floor:
            return
        half = self._open.pop(offset, None)
        if half is not None and self._by_id.get((half.group, half.msg_id)) == offset:
            del self._by_id[(half.group, half.msg_id)]
        if half is not None and outcome is Outcome.COMMIT:
            committed = self._committed_by_id
            committed[(half.group, half.msg_id)] = offset
            committed.move_to_end((half.group, half.msg_id))
            if len(committed) > COMMITTED_IDS_KEPT:
                committed.popitem(last=False)
        self._resolved[offset] = (outcome, op_offset)
        self._end = max(self._end, offset + 1)
        self._advance()
        self.version += 1

    def _advance(self) -> None:
        floor = min(self._open, default=self._end)
        if floor <= self._floor:
            return
        self._floor = floor
        for offset in [o for o in self._resolved if o < floor]:
            del self._resolved[offset]
        # Ops of halves below the floor are never needed again; the oldest op still needed bounds the scan.
        self._op_floor = max(self._op_floor, min((op for _, op in self._resolved.values()), default=self._op_floor))

    def advance_op_floor(self, op_end: int) -> None:
        """Every op record below `op_end` has been applied: with nothing resolved above the floor, none of
        them is needed on the next start."""
        if not self._resolved:
            self._op_floor = max(self._op_floor, op_end)

    def due(self, now_ms: int) -> list[Due]:
        """Open halves whose check is due, oldest first (discard: the maximum number of checks was sent)."""
        return [Due(h, h.checks >= self.max_checks) for h in self.halves() if h.next_check_ms <= now_ms]

    def checked(self, offset: int, now_ms: int) -> None:
        """A check for the half was sent (or there was no producer of its group to send it to)."""
        half = self._open.get(offset)
        if half is not None:
            half.checks += 1
            half.next_check_ms = now_ms + self.check_interval_ms
            self.version += 1

    def snapshot(self) -> dict:
        """What survives a restart besides the topics: the floors and the checks already sent."""
        return {"floor": self._floor, "opFloor": self._op_floor,
                "checks": [[h.offset, h.checks] for h in self.halves() if h.checks]}

    def restore_checks(self, checks: list[list[int]]) -> None:
        for offset, count in checks:
            half = self._open.get(offset)
            if half is not None:
                half.checks = max(half.checks, count)
