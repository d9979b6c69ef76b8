"""Crash points: where a test may have the broker die (SIGKILL, as kill -9) at an exact step.

`TIDEMARK_CRASH_POINT=<name>` in the broker's environment makes `crash_point(name)` kill the process
the first time it is reached; unset (always, outside tests), it is one dictionary lookup. Tests use it
for the steps no outside kill can hit reliably, such as between a transaction's op record and its
message, which are written in the same step of the event loop.
"""

from __future__ import annotations

import os
import signal

_CHOSEN = os.environ.get("TIDEMARK_CRASH_POINT", "")


def crash_point(name: str) -> None:
    if _CHOSEN and name == _CHOSEN:
        os.kill(os.getpid(), signal.SIGKILL)
