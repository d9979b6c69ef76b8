"""One backoff policy for every retry loop of the client: exponential from a first wait up to a cap.

Used where a connection or a queue is opened again (fetch streams, the record reader, the CLI waiting
for a broker to come back) and between a producer's send attempts, where `jitter` spreads the retries
of many producers that failed at the same moment (a broker restart) instead of sending them together.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# Past this many doublings every cap in use is reached long ago; it keeps 2**n a small number.
_MAX_DOUBLINGS = 30


@dataclass(frozen=True, slots=True)
class Backoff:
    first_s: float
    max_s: float
    jitter: bool = False  # each wait drawn from [half, all] of the exponential one

    def delay(self, attempt: int) -> float:
        """The wait before retry number `attempt` (0 for the first retry): first_s, doubled per attempt, at
        most max_s."""
        wait = min(self.max_s, self.first_s * 2 ** min(max(attempt, 0), _MAX_DOUBLINGS))
        return wait * random.uniform(0.5, 1.0) if self.jitter else wait
