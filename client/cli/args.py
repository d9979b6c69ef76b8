"""Argument types of the CLI: every number is range-checked where it is parsed, so a bad value is one
line from argparse (exit 2), never an overflow deep in a request (a traceback)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

INT64_MAX = 2**63 - 1
QUEUE_ID_MAX = 65535


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low}..{high}")
        return value
    parse.__name__ = "integer"  # argparse names the type in its messages
    return parse


def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0, at most a day."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds in (0, 86400]")
    return value


QUEUE_ID = int_in(0, QUEUE_ID_MAX)
OFFSET = int_in(0, INT64_MAX)
SHIFT = int_in(-INT64_MAX, INT64_MAX)
QUEUE_COUNT = int_in(1, QUEUE_ID_MAX + 1)
