"""The CLI never shows a traceback: generated arguments for the commands that take numbers, durations and
names, run against a real broker. Every run ends in a one-line usage error (exit 2), a one-line
`tidemark: ...` error (exit 1) or success (exit 0)."""

from __future__ import annotations

import contextlib
import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemark.client import Admin
from tidemark.client.cli.main import main

NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1", "", "1e30", "0x10", " 5", "4" * 30]),
    st.text(max_size=8),
)
DURATIONS = st.one_of(st.sampled_from(["PT99999999999999H", "P99999999D", "PT10M", "P", "PT", "PT1.5S", ""]),
                      st.text(max_size=12))
NAMES = st.one_of(st.sampled_from(["FuzzTopic", "fuzz-group", "%RETRY%g", "a b", ""]), st.text(max_size=8))


@st.composite
def command(draw) -> list[str]:
    n, name = draw(NUMBERS), draw(NAMES)
    return draw(st.sampled_from([
        ["topic", "create", name, "--queues", n],
        ["topic", "update", "FuzzTopic", "--read-queues", n],
        ["topic", "list", "--timeout", n],
        ["group", "reset-offset", name, "--topic", "FuzzTopic", "--to-offset", n],
        ["group", "reset-offset", "fuzz-group", "--topic", "FuzzTopic", "--shift-by", n, "--execute"],
        ["group", "reset-offset", "fuzz-group", "--topic", "FuzzTopic", "--by-duration", draw(DURATIONS)],
        ["group", "reset-offset", "fuzz-group", "--topic", "FuzzTopic", "--to-datetime", draw(NAMES)],
        ["message", "get", "--topic", name, "--queue", n, "--offset", draw(NUMBERS)],
        ["message", "search", "--topic", "FuzzTopic", "--key", name, "--max", n],
        ["send", name, "--body", "x", "--delay-level", n],
        ["send", "FuzzTopic", "--count", "1", "--size", n],
        ["dlq", "list", name, "--max", n],
        ["cluster", "list", "--namesrv", f"127.0.0.1:{n}"],  # loopback only: no name lookups
        ["broker", "promote", "--broker", f"127.0.0.1:{n}"],
    ]))


@pytest.fixture(autouse=True)
def _logging_untouched(monkeypatch):
    """main() configures the process's root logger (ERROR, its own handler) as the command line wants; in
    this process that would silence the warnings later tests count (tests/spark/test_fetch_restart.py)."""
    monkeypatch.setattr("tidemark.client.cli.main.setup_logging", lambda *args, **kwargs: None)


@pytest.fixture(scope="module")
def fuzz_broker(module_broker):
    with Admin(brokers=module_broker.address) as admin:
        admin.create_topic("FuzzTopic", 2)
    return module_broker


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=command())
def test_generated_arguments_never_end_in_a_traceback(fuzz_broker, argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main([*argv, "--broker", fuzz_broker.address] if argv[0] != "broker" else argv)
        except SystemExit as e:  # argparse: usage and one error line
            code = e.code
    text = err.getvalue()
    assert "Traceback" not in text, (argv, text)
    assert code in (0, 1, 2), (argv, code, text)
    if code:  # one line saying why (issue 31: no usage block before a range error)
        lines = text.strip().splitlines()
        assert len(lines) == 1, (argv, text)
        assert lines[0].startswith("tidemark"), (argv, text)
