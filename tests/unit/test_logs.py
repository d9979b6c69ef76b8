"""Structured logs: fields survive any value, in key=value and in JSON, and cannot forge lines."""

from __future__ import annotations

import io
import json
import logging
import re

import pytest

from tidemark.common.logs import JsonFormatter, KeyValueFormatter, get_logger, logfmt_value

_PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s"]+)')
NASTY = ['two words', 'say "hi"', "a=b", "back\\slash", "line\nbreak event=forged level=ERROR", "", "tab\there",
         "ünïcode ✓", "\x00\x1b[31m"]


@pytest.fixture
def capture():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("tidemark.test.logs")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)

    def run(formatter: logging.Formatter, **fields) -> str:
        handler.setFormatter(formatter)
        stream.seek(0)
        stream.truncate()
        get_logger("tidemark.test.logs").warning("group %s joined", fields.get("group"), event="consumer_join",
                                                  **fields)
        return stream.getvalue()

    yield run
    logger.handlers.clear()


@pytest.mark.parametrize("value", NASTY)
def test_key_value_lines_keep_every_value_on_one_line(capture, value):
    out = capture(KeyValueFormatter(), group=value, members=3)
    assert out.count("\n") == 1, out  # one record, one line: a newline in a value cannot start another
    # Read back as logfmt (bare values, or JSON strings when quoted): every field exactly, nothing forged.
    _, _, rest = out.rstrip("\n").partition(" ")  # after the timestamp
    fields = {k: json.loads(v) if v.startswith('"') else v for k, v in _PAIR.findall(rest)}
    assert fields == {"level": "WARNING", "logger": "tidemark.test.logs", "msg": f"group {value} joined",
                      "event": "consumer_join", "group": value, "members": "3"}


@pytest.mark.parametrize("value", NASTY)
def test_json_lines_carry_fields_as_fields(capture, value):
    out = capture(JsonFormatter(), group=value, members=3)
    assert out.count("\n") == 1
    doc = json.loads(out)
    assert doc["event"] == "consumer_join" and doc["group"] == value and doc["members"] == 3
    assert doc["msg"] == f"group {value} joined" and doc["level"] == "WARNING"


def test_any_formatter_still_sees_the_fields():
    """An application's own handler (plain %(message)s) gets the event and fields in the message."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("tidemark.test.plain")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    get_logger("tidemark.test.plain").info("queue lost", event="queue_lost", reason="lock not renewed", epoch=7)
    assert stream.getvalue() == 'queue lost event=queue_lost reason="lock not renewed" epoch=7\n'


def test_logfmt_value_quotes_only_when_needed():
    assert logfmt_value("plain-name_1") == "plain-name_1"
    assert logfmt_value(42) == "42"
    assert logfmt_value("a b") == '"a b"'
    assert logfmt_value("x\ny") == '"x\\ny"'
