"""The CLI's argument parser and argument types: every number is range-checked where it is parsed, so a bad
value is one line from argparse (exit 2), never an overflow deep in a request (a traceback)."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line, `PROG: error: WHY` and exit 2 (--help shows the
    usage); unrecognised arguments are blamed on the command that was given, and an unknown option where a
    command is expected is called that. Subparsers are of this class too (argparse makes them so)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        argv = list(sys.argv[1:] if args is None else args)
        commands = next((a for a in self._actions if isinstance(a, argparse._SubParsersAction)), None)
        if commands is not None and argv and argv[0].startswith("-") and argv[0] != "-":
            found = self._parse_optional(argv[0])  # None: not an option; action None: an unknown one
            found = found[0] if isinstance(found, list) and len(found) == 1 else found  # Python 3.12+: a list
            if isinstance(found, tuple) and found[0] is None:
                what = (commands.metavar or "command").lower()
                self.error(f"unknown option {argv[0]} (options go after the {what}; {self.prog} --help lists the "
                           f"{what}s)")
        parsed, extra = super().parse_known_args(argv, namespace)
        if not hasattr(parsed, "cli_prog"):  # the innermost command's parser returns first
            parsed.cli_prog = self.prog
        return parsed, extra

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self.exit(2, f"{parsed.cli_prog}: error: unrecognized arguments: {' '.join(extra)}\n")
        return parsed


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


def from_offset(text: str) -> str | int:
    """An argparse type: `earliest`, `latest` or an offset in 0..INT64_MAX."""
    if text in ("earliest", "latest"):
        return text
    try:
        return OFFSET(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"earliest, latest or an offset: {e}") from None


def group_name(text: str) -> str:
    """An argparse type: a consumer group's name, never empty (an empty one would silently mean none)."""
    if not text:
        raise argparse.ArgumentTypeError("a group name cannot be empty")
    return text
