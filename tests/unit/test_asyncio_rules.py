"""Rules of asyncio use in the shipped code, read from the source files with `ast`.

No `asyncio.wait_for`: on Python 3.11 a call that finishes just as the awaiting task is cancelled is
returned by wait_for, and the cancellation is lost (fixed in 3.12, where wait_for is built on
asyncio.timeout). A broker's stop cancels its tasks and waits for them: a master's lease keeper went on
renewing while its stop waited for it (tests/unit/test_controller_cancel.py). `async with
asyncio.timeout(...)` around the await cancels only what it started and keeps a cancellation from outside.
"""

from __future__ import annotations

import ast
from pathlib import Path

from layout import PACKAGE_FOLDERS

ROOT = Path(__file__).resolve().parents[2]


def _wait_for_calls() -> list[str]:
    found = []
    for folder in PACKAGE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text("utf-8"), str(path))
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "wait_for"
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "asyncio"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
                elif isinstance(node, ast.ImportFrom) and node.module == "asyncio" and any(
                        alias.name == "wait_for" for alias in node.names):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} (imported)")
    return found


def test_no_asyncio_wait_for_in_the_shipped_code():
    assert _wait_for_calls() == []


def test_the_rule_reads_the_shipped_code():
    assert sum(1 for folder in PACKAGE_FOLDERS for _ in (ROOT / folder).rglob("*.py")) > 100
