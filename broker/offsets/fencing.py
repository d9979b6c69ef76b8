"""Fencing of offset commits: what a commit quotes to prove it is current, and when it is refused.

A commit may carry the committer's owner epoch (from its queue lock) and the
reset generation it last saw (docs/architecture.md, "Offsets and fencing"), so
a consumer that lost its queue, or that has not yet seen an admin reset, cannot
move the offset. ConsumerOffsetManager keeps a FenceState per entry that was
ever fenced or reset and asks `check_fence` before it applies a fenced commit.
Pure: no I/O, no grpc.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tidemark.broker.errors import FencedError, StaleResetGenerationError


@dataclass(frozen=True, slots=True)
class Fence:
    """What a commit quotes to prove it is current; every field optional."""

    client_id: str = ""
    owner_epoch: int | None = None  # from LockGrant; None for an unfenced (RocketMQ) commit
    reset_generation: int | None = None  # the queue's generation the committer last saw

    @property
    def fenced(self) -> bool:
        """Whether the commit quotes anything to check (else the last write wins, as in RocketMQ)."""
        return self.owner_epoch is not None or self.reset_generation is not None


class OwnershipView(Protocol):
    """The lock manager as the offset manager sees it (QueueLockManager satisfies it)."""

    def current_epoch(self, group: str, topic: str, queue_id: int) -> int | None: ...


@dataclass(frozen=True, slots=True)
class FenceState:
    """Per-entry fencing memory. Replaced on change, never mutated."""

    reset_generation: int = 0
    # (owner epoch, reset generation) of the last fenced commit: a later commit
    # quoting the same pair is the same owner in the same era, so it may only
    # move forward; a late oneway commit arriving out of order must not rewind.
    last_fenced: tuple[int, int] | None = None


NO_FENCE_STATE = FenceState()


def check_fence(where: str, fence: Fence, state: FenceState, current_epoch: int | None, committed: int) -> None:
    """Raise StaleResetGenerationError when the commit quotes a generation older than the entry's, or
    FencedError when its owner epoch is older than the queue's current one (`current_epoch`, from the lock
    manager; when it knows none, the epoch of the entry's last fenced commit stands in). `where` names the
    entry and `committed` is its offset, for the messages."""
    who = f"client {fence.client_id!r}" if fence.client_id else "the committer"
    if fence.reset_generation is not None and fence.reset_generation < state.reset_generation:
        raise StaleResetGenerationError(
            f"the offset of {where} was reset by an admin (generation {state.reset_generation}); "
            f"{who} committed with generation {fence.reset_generation}, from before the reset. "
            f"The commit was ignored; continue from the reset offset {committed}"
        )
    if fence.owner_epoch is None:
        return
    current = current_epoch
    if current is None and state.last_fenced is not None:
        current = state.last_fenced[0]
    if current is not None and fence.owner_epoch < current:
        raise FencedError(
            f"commit to {where} by {who} is fenced: its owner epoch {fence.owner_epoch} is older "
            f"than the queue's current epoch {current}; another consumer owns the queue now"
        )
