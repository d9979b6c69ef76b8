"""Where a consumer resumes a queue it lost, not handed over.

A broker that has none of the locks it granted (a broker whose lock file,
broker/membership/lock_file.py, was lost or damaged; a replica promoted before
it copied its master's)
makes every consumer lose its queues (the next fetch or lock renewal is
fenced): each re-locks them under a new owner epoch and reads the group's
committed offset again. That offset is
only as fresh as the consumer's last commit that reached the broker (commits
ride on credit frames every few hundred messages and on a 5 s timer), while the
consumer's own progress (the smallest offset not yet consumed) is further
along. Starting from the broker's answer re-delivers everything in between,
after every restart.

So a queue that is *lost* (not handed over) leaves its progress behind as a
KeptProgress, and the next lease of the same queue starts from the larger of
the two, provided the queue's reset generation has not changed meanwhile: an
admin reset always wins, whatever the consumer had done before it. Taking the
larger never skips a message: everything below the kept offset was consumed by
this client (or filtered out by its subscription), everything below the
broker's by the group. The new lease then commits its start, under its new
owner epoch, so the broker knows it too.

Only when the broker has a committed offset for the queue: one with none
cannot prove it is the queue we read. A topic deleted and re-created loses its
offsets and reset generations (the generation is 0 again, as ours may be) and
its queues start again at 0; resuming at the kept offset would skip the new
queue's first messages. With the offset journal a broker restart keeps the
committed offsets, so this costs nothing in the case kept progress is for.

A queue that is handed over normally leaves nothing behind: its final commit
reached the broker with the unlock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KeptProgress:
    """A lost lease's progress: the next offset to consume, and the reset generation it was made under."""

    offset: int
    reset_generation: int | None


def resume_offset(start: int, committed: int | None, broker_generation: int | None,
                  kept: KeptProgress | None) -> int:
    """The offset a new lease starts from.

    `start`: what the consumer kind computed (the broker's committed offset, or consume_from_where for
    a group without one); `committed`: the broker's committed offset as the lock grant told it (-1:
    none; None: not told, `start` stands in); `broker_generation`: the queue's reset generation now.
    """
    if kept is None or kept.offset < 0 or kept.reset_generation != broker_generation:
        return start
    if committed is not None and committed < 0:
        return start  # no offset on the broker: maybe a re-created queue (module docstring)
    known = start if committed is None else committed
    # `start` may lie past the committed offset (messages below it expired): never start before it.
    return max(start, kept.offset) if kept.offset > known else start
