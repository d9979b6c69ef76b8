"""Kafka's minOffsetsPerTrigger / maxTriggerDelay for streaming reads: skip a trigger until enough
messages wait or the delay has passed. Pure; the stream reader owns one gate for the query's run.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TriggerGate:
    """Admit a micro-batch once at least `min_rows` new messages wait, or once `max_delay_s` has passed
    since the last admitted batch that had something to read (then whatever waits is read).

    The first batch of a run is never held back: Kafka's source starts its delay clock at zero too,
    so a restarted query reads its backlog at once. Unlike Kafka's, the clock restarts only when a
    batch with messages is admitted, not on a trigger that found nothing, so a lone message waits at
    most max_delay_s after the previous batch however long the stream was idle.
    """

    def __init__(self, min_rows: int, max_delay_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.min_rows = min_rows
        self.max_delay_s = max_delay_s
        self._clock = clock
        self._last_batch: float | None = None

    def admit(self, waiting: int) -> bool:
        """Whether the trigger that sees `waiting` new messages runs a batch."""
        if waiting <= 0:
            return False
        now = self._clock()
        if (self._last_batch is None or waiting >= self.min_rows
                or now - self._last_batch >= self.max_delay_s):
            self._last_batch = now
            return True
        return False


__all__ = ["TriggerGate"]
