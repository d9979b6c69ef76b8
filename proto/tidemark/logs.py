"""One-line-per-event logging for broker and CLI: key=value (default) or JSON.

Log calls put the event's fields in the message as key=value pairs
(`"consumer joined event=consumer_join group=%s"`), so the kv format is
greppable as is and the JSON format lifts those pairs into fields.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time

_PAIR = re.compile(r"(\w+)=('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\S+)")


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        line = f"{ts} level={record.levelname} logger={record.name} msg={record.getMessage()}"
        if record.exc_info:
            line += " exc=" + json.dumps(self.formatException(record.exc_info))
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        doc = {"ts": record.created, "level": record.levelname, "logger": record.name}
        text = message
        for m in _PAIR.finditer(message):
            doc[m.group(1)] = m.group(2).strip("'\"")
            text = text.replace(m.group(0), "")
        doc["msg"] = " ".join(text.split())
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def setup_logging(level: str = "INFO", fmt: str = "kv", stream=None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
