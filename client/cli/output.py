"""CLI output: aligned tables (default), JSON (--json), a progress bar on a TTY."""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from tidemark.client.message import MessageExt

# The footer of every changing command run without --execute.
DRY_RUN = "dry run: nothing changed; add --execute to apply"


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
    """Rows as a table with its footer, or as JSON on stdout; a dry run's JSON says so on stderr (a
    plan's rows look like the change they describe, and a script must not take one for the other)."""
    if as_json:
        print(json.dumps(list(rows), indent=2, default=str))
        if DRY_RUN in footer:
            print(DRY_RUN, file=sys.stderr)
        return
    print(table(rows, columns))
    if footer:
        print(footer)


def iso_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).isoformat(timespec="milliseconds") if ms else "-"


BODY_FORMATS = ("text", "hex", "base64")

# Characters a one-line text rendering writes as escapes: the backslash itself (so an escape is never
# ambiguous), C0 controls and DEL.
_ESCAPES = {ord("\\"): "\\\\", ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t",
            **{c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F) if c not in (0x09, 0x0A, 0x0D)}}


def escaped_text(data: bytes) -> str:
    """Bytes as one line of text: UTF-8 where they decode, every other byte as \\xNN, controls and the
    backslash escaped (\\n, \\x1b, \\\\)."""
    out = []
    while data:
        try:
            out.append(data.decode("utf-8").translate(_ESCAPES))
            break
        except UnicodeDecodeError as e:
            out.append(data[:e.start].decode("utf-8").translate(_ESCAPES))
            out.append("".join(f"\\x{b:02x}" for b in data[e.start:e.end]))
            data = data[e.end:]
    return "".join(out)


def render_body(body: bytes, body_format: str | None = None, max_bytes: int = 0) -> tuple[str, str, int]:
    """(shown body, its encoding, bytes cut). body_format None: UTF-8 when the body is, else base64 (the
    JSON default); "text": escaped_text. max_bytes > 0 keeps at most that many bytes, never half a
    UTF-8 character of a body that is text."""
    shown = body[:max_bytes] if 0 < max_bytes < len(body) else body
    if len(shown) < len(body):
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:  # text: drop a character the cut split
            shown = shown.decode("utf-8", "ignore").encode("utf-8")
    cut = len(body) - len(shown)
    if body_format == "text":
        return escaped_text(shown), "text", cut
    if body_format == "hex":
        return shown.hex(), "hex", cut
    if body_format is None:
        try:
            return shown.decode("utf-8"), "utf-8", cut
        except UnicodeDecodeError:
            pass
    return base64.b64encode(shown).decode("ascii"), "base64", cut


def message_json(m: MessageExt, *, body_format: str | None = None, max_body_bytes: int = 0) -> dict[str, Any]:
    """One consumed message as the CLI prints it (body as UTF-8 when it is, else base64, unless
    body_format says; "body_cut_bytes" when max_body_bytes cut it)."""
    body, encoding, cut = render_body(m.body, body_format, max_body_bytes)
    doc = {
        "topic": m.origin_topic, "broker": m.broker_name, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
        "msg_id": m.msg_id, "tags": m.tags, "keys": m.keys, "body": body, "body_encoding": encoding,
        "properties": dict(m.properties), "store_timestamp": m.store_timestamp,
        "reconsume_times": m.reconsume_times,
    }
    if cut:
        doc["body_cut_bytes"] = cut
    return doc


def message_fields(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A message_json document as `field value` rows for a person: times as local ISO times, each property
    a `key=value` row of its own (the JSON keeps the raw numbers and the properties object)."""
    rows: list[dict[str, Any]] = []
    for field, value in doc.items():
        if field == "properties":
            lines = [f"{escaped_text(k.encode())}={escaped_text(v.encode())}" for k, v in sorted(value.items())]
            rows += [{"field": "properties" if i == 0 else "", "value": line} for i, line in enumerate(lines or ["-"])]
        else:
            rows.append({"field": field, "value": iso_ms(value) if field.endswith("_timestamp") else value})
    return rows


def message_line(m: MessageExt, *, body_format: str = "text", max_body_bytes: int = 0) -> str:
    """One consumed message on one readable line: where it is, when it was stored, tags and keys when it
    has them, then the body (cut after max_body_bytes, saying by how much)."""
    body, _, cut = render_body(m.body, body_format, max_body_bytes)
    parts = [m.origin_topic, f"{m.broker_name}/{m.queue_id}@{m.queue_offset}", iso_ms(m.store_timestamp)]
    labels = [f"{k}={escaped_text(v.encode())}" for k, v in (("tags", m.tags), ("keys", m.keys)) if v]
    if m.reconsume_times:
        labels.append(f"retries={m.reconsume_times}")
    if labels:
        parts.append(" ".join(labels))
    parts.append(body + (f"... [{cut} bytes cut]" if cut else ""))
    return "  ".join(parts)


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
