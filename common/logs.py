"""Structured logging on the standard library: an event name and fields per line, key=value or JSON.

Code logs through an EventLogger:

    log = get_logger("tidemark.broker.consumers")
    log.info("consumer joined", event="consumer_join", group=group, members=len(ids))

The fields travel in the LogRecord (`extra`), so the JSON formatter writes them
as JSON fields, never parsing text; the record's message also ends with them in
logfmt (`event=consumer_join group="a b"`), so any formatter an application
installs still shows them. Values are quoted and escaped whenever they hold a
space, a quote, `=`, a backslash or any control character: a name chosen by a
client (a group, a topic, a client id) can never break or forge a line.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_RESERVED = ("tm_text", "tm_event", "tm_fields")


def _needs_quotes(text: str) -> bool:
    if not text:
        return True
    return any(c in ' "=\\' or not c.isprintable() for c in text)


def logfmt_value(value: Any) -> str:
    """A value as logfmt writes it: bare when it is plain, else a JSON string (quoted, escaped)."""
    text = value if isinstance(value, str) else str(value)
    return json.dumps(text, ensure_ascii=False) if _needs_quotes(text) else text


def render_fields(event: str | None, fields: dict[str, Any]) -> str:
    parts = [f"event={logfmt_value(event)}"] if event else []
    parts.extend(f"{key}={logfmt_value(value)}" for key, value in fields.items())
    return " ".join(parts)


class EventLogger:
    """A standard-library logger whose calls take an event name and fields."""

    __slots__ = ("logger",)

    def __init__(self, name: str) -> None:
        self.logger = logging.getLogger(name)

    @property
    def name(self) -> str:
        return self.logger.name

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 - the stdlib's spelling
        return self.logger.isEnabledFor(level)

    def _log(self, level: int, msg: str, args: tuple, event: str | None, fields: dict[str, Any],
             exc_info: Any = None) -> None:
        if not self.logger.isEnabledFor(level):
            return
        text = msg % args if args else msg
        kv = render_fields(event, fields)
        self.logger.log(level, f"{text} {kv}" if kv else text, exc_info=exc_info, stacklevel=3,
                        extra={"tm_text": text, "tm_event": event, "tm_fields": fields})

    def debug(self, msg: str, *args: Any, event: str | None = None, exc_info: Any = None, **fields: Any) -> None:
        self._log(logging.DEBUG, msg, args, event, fields, exc_info)

    def info(self, msg: str, *args: Any, event: str | None = None, exc_info: Any = None, **fields: Any) -> None:
        self._log(logging.INFO, msg, args, event, fields, exc_info)

    def warning(self, msg: str, *args: Any, event: str | None = None, exc_info: Any = None, **fields: Any) -> None:
        self._log(logging.WARNING, msg, args, event, fields, exc_info)

    def error(self, msg: str, *args: Any, event: str | None = None, exc_info: Any = None, **fields: Any) -> None:
        self._log(logging.ERROR, msg, args, event, fields, exc_info)

    def exception(self, msg: str, *args: Any, event: str | None = None, **fields: Any) -> None:
        self._log(logging.ERROR, msg, args, event, fields, True)


def get_logger(name: str | logging.Logger | EventLogger) -> EventLogger:
    """An EventLogger by name, or around a standard logger a caller passed in."""
    if isinstance(name, EventLogger):
        return name
    logger = EventLogger.__new__(EventLogger)
    logger.logger = name if isinstance(name, logging.Logger) else logging.getLogger(name)
    return logger


def _timestamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


class KeyValueFormatter(logging.Formatter):
    """`<ts> level=INFO logger=x msg="text" event=e k=v ...`, one line per record whatever the values hold."""

    def format(self, record: logging.LogRecord) -> str:
        text = getattr(record, "tm_text", None)
        if text is None:
            line = f"{_timestamp(record)} level={record.levelname} logger={record.name} " \
                   f"msg={logfmt_value(record.getMessage())}"
        else:
            line = f"{_timestamp(record)} level={record.levelname} logger={record.name} msg={logfmt_value(text)}"
            kv = render_fields(record.tm_event, record.tm_fields)
            if kv:
                line += " " + kv
        if record.exc_info:
            line += " exc=" + json.dumps(self.formatException(record.exc_info))
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, msg, event and every field as its own key."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {"ts": record.created, "level": record.levelname, "logger": record.name}
        text = getattr(record, "tm_text", None)
        if text is None:
            doc["msg"] = record.getMessage()
        else:
            doc["msg"] = text
            if record.tm_event:
                doc["event"] = record.tm_event
            for key, value in record.tm_fields.items():
                doc.setdefault(key, value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


class PlainFormatter(logging.Formatter):
    """For the CLI's stderr: `warning: text k=v` without timestamps."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{record.levelname.lower()}: {record.getMessage()}"
        if record.exc_info:
            line += " " + json.dumps(self.formatException(record.exc_info))
        return line


FORMATS = {"kv": KeyValueFormatter, "json": JsonFormatter, "plain": PlainFormatter}


def setup_logging(level: str = "INFO", fmt: str = "kv", stream=None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(FORMATS[fmt]())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
