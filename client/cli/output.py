"""CLI output: aligned tables (default), JSON (--json), a progress bar on a TTY."""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from client.message import MessageExt


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Rows as an aligned text table; numbers right-aligned, header in upper case."""
    header = [c.upper() for c in columns]
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(header)]
    numeric = [all(isinstance(r.get(c), int | float) and not isinstance(r.get(c), bool) for r in rows) and bool(rows)
               for c in columns]
    lines = ["  ".join(h.rjust(w) if n else h.ljust(w) for h, w, n in zip(header, widths, numeric, strict=True)).rstrip()]
    for row in cells:
        lines.append("  ".join(v.rjust(w) if n else v.ljust(w)
                               for v, w, n in zip(row, widths, numeric, strict=True)).rstrip())
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def emit(rows: Sequence[dict[str, Any]], columns: Sequence[str], *, as_json: bool, footer: str = "") -> None:
    if as_json:
        print(json.dumps(list(rows), indent=2, default=str))
        return
    print(table(rows, columns))
    if footer:
        print(footer)


def iso_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).isoformat(timespec="milliseconds") if ms else "-"


def message_json(m: MessageExt) -> dict[str, Any]:
    """One consumed message as the CLI prints it (body as UTF-8 when it is, else base64)."""
    try:
        body, encoding = m.body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        body, encoding = base64.b64encode(m.body).decode("ascii"), "base64"
    return {
        "topic": m.origin_topic, "broker": m.broker_name, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
        "msg_id": m.msg_id, "tags": m.tags, "keys": m.keys, "body": body, "body_encoding": encoding,
        "properties": dict(m.properties), "store_timestamp": m.store_timestamp,
        "reconsume_times": m.reconsume_times,
    }


def print_line(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc, ensure_ascii=False) + "\n")
    sys.stdout.flush()


class Progress:
    """`done/total` with a bar on stderr when it is a terminal; silent otherwise."""

    def __init__(self, total: int, label: str) -> None:
        self.total = total
        self.label = label
        self.enabled = sys.stderr.isatty() and total > 1
        self._last = 0.0

    def update(self, done: int) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self._last < 0.1 and done < self.total):
            return
        self._last = now
        width = 30
        filled = int(width * done / max(self.total, 1))
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{' ' * (width - filled)}] {done}/{self.total}")
        if done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    def iterate(self, items: Iterable[Any]) -> Iterable[Any]:
        for i, item in enumerate(items, 1):
            yield item
            self.update(i)
