"""Broker-wide source of owner epochs and offset reset generations.

Owner epochs are kept with the lock table (broker/membership/lock_file.py) and
reset generations with the offsets, but a new value must still be larger than
any an earlier broker process issued, including ones whose file is gone, because
a consumer that survived the restart may still carry one. Seeding the counter
with the wall clock in microseconds at startup makes every value this process
issues larger than any value an earlier process issued, as long as the earlier
process issued fewer than one value per microsecond of its uptime (it cannot
come close) and the wall clock did not step back across the restart.
"""

from __future__ import annotations

import time


class EpochSequence:
    """A strictly increasing integer sequence, seeded with the wall clock in microseconds.

    Not thread-safe: the broker calls it from its event-loop thread only.
    """

    __slots__ = ("_last",)

    def __init__(self, seed: int | None = None) -> None:
        """`seed` is the value just before the first one issued; tests pass it for
        predictable numbers, the broker leaves it to the wall clock."""
        self._last = time.time_ns() // 1000 if seed is None else int(seed)

    def next(self) -> int:
        """Return a value larger than every value returned before."""
        self._last += 1
        return self._last

    def advance_past(self, value: int) -> None:
        """Issue only values larger than `value` from now on (values another process issued, taken over)."""
        self._last = max(self._last, int(value))

    @property
    def last(self) -> int:
        """The most recent value issued (the seed before the first call)."""
        return self._last

    def __repr__(self) -> str:
        return f"EpochSequence(last={self._last})"
