"""The README's promises: the quickstart runs as written, the configuration reference is current."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tidemark.broker.config import reference_table as broker_reference
from tidemark.client import Admin, Message, Producer, ResetTarget
from tidemark.client.settings import (
    ProducerSettings,
    PullConsumerSettings,
    PushConsumerSettings,
    reference_table,
)

ROOT = Path(__file__).resolve().parent.parent.parent
README = ROOT / "README.md"
BEGIN, END = "<!-- config-reference:begin -->", "<!-- config-reference:end -->"


def expected_reference() -> str:
    parts = ["### Broker (`tidemark broker`)", "", broker_reference(), ""]
    for title, cls in (("Producer", ProducerSettings), ("PushConsumer", PushConsumerSettings),
                       ("PullConsumer (lite pull)", PullConsumerSettings)):
        parts += [f"### {title}", "", reference_table(cls), ""]
    return "\n".join(parts)


def test_configuration_reference_matches_the_settings_dataclasses():
    text = README.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    wanted = "\n" + expected_reference() + "\n"
    if os.environ.get("TIDEMARK_UPDATE_DOCS") == "1":
        README.write_text(text[:start] + wanted + text[end:])
        text = README.read_text()
        start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    assert text[start:end] == wanted, "README configuration reference is stale: run with TIDEMARK_UPDATE_DOCS=1"


def quickstart_commands() -> list[str]:
    section = README.read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.spark
def test_quickstart_runs_in_order(broker, tmp_path):
    env = {**os.environ, "TIDEMARK_BROKER": broker.address, "PYSPARK_PYTHON": sys.executable}
    outputs = []
    for line in quickstart_commands():
        argv = shlex.split(line)
        if argv[0] == ".venv/bin/tidemark":
            argv = [sys.executable, "-m", "tidemark.client.cli.main", *argv[1:]]
        elif argv[0] == ".venv/bin/python":
            argv = [sys.executable, *argv[1:]]
        else:
            pytest.fail(f"quickstart line does not start with .venv/bin/...: {line}")
        argv = [broker.address if a == "127.0.0.1:10911" else a for a in argv]
        # exec'd, as a user runs them (not forked from the tests' fork server: tests/forkserver.py)
        out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, f"{line}\nstdout: {out.stdout[-2000:]}\nstderr: {out.stderr[-3000:]}"
        outputs.append(out.stdout)
    consumed = [line for line in outputs[3].splitlines() if line.startswith("{")]
    assert len(consumed) == 1001
    assert "total lag 0" in outputs[4]
    assert "total lag 0" in outputs[-1], outputs[-1]


def library_example(imports: str) -> str:
    """The python example of "Using the library" whose first line is `from tidemark.client import <imports>...`."""
    section = README.read_text().split("## Using the library", 1)[1].split("\n## ", 1)[0]
    found = [code for code in re.findall(r"```python\n(.*?)```", section, re.S)
             if re.search(rf"^from tidemark\.client import {imports}\b", code, re.M)]
    assert len(found) == 1, f"{len(found)} examples in 'Using the library' import {imports}"
    return found[0]


def run_example(code: str, broker, tmp_path) -> subprocess.CompletedProcess:
    """The example as written, against `broker`, in a fresh interpreter."""
    script = tmp_path / "example.py"
    script.write_text(code.replace("127.0.0.1:10911", broker.address))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def send_orders(broker, count: int) -> list[bytes]:
    """The Orders topic (4 queues) with `count` messages; their bodies."""
    bodies = [f'{{"id": {i}}}'.encode() for i in range(count)]
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("Orders", 4)
    with Producer(brokers=broker.address) as producer:
        for body in bodies:
            producer.send(Message("Orders", body))
    return bodies


def test_the_library_example_prints_what_it_sends(broker, tmp_path):
    """Issue 31: the example sent before its consumer started, and a new group starts at the end of the
    queues: it printed nothing. Run as written, against a broker with the Orders topic."""
    code = library_example("ConsumeConcurrentlyStatus")
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("Orders", 4)
    out = run_example(code, broker, tmp_path)
    assert '{"id": 2}' in out.stdout, f"printed nothing of the refund:\n{out.stdout}\n{out.stderr[-2000:]}"


def test_the_admin_example_creates_a_topic_shows_the_lag_and_rewinds_the_group(broker, tmp_path):
    """Run as written, with a refunds group that has read the 8 messages of Orders: it creates Invoices,
    prints the lag 0, and moves the group back to the start of every queue (lag 8 after it)."""
    send_orders(broker, 8)
    with Admin(brokers=broker.address) as admin:
        admin.reset_offset("refunds", "Orders", ResetTarget.LATEST)
    out = run_example(library_example("Admin"), broker, tmp_path).stdout
    assert "refunds lag: 0" in out, out
    changes = re.findall(r"^(\d+) (\d+) -> (\d+)$", out, re.M)
    assert sorted(int(q) for q, _old, _new in changes) == [0, 1, 2, 3], out
    assert sum(int(old) for _q, old, _new in changes) == 8 and {new for *_, new in changes} == {"0"}, out
    with Admin(brokers=broker.address) as admin:
        assert "Invoices" in admin.list_topics()
        stats = admin.consume_stats("refunds", "Orders")
    assert [q.consumer_offset for q in stats] == [0, 0, 0, 0]
    assert sum(q.lag for q in stats) == 8


def test_the_pull_consumer_example_prints_and_commits_every_message(broker, tmp_path):
    """Run as written against Orders with 10 messages: it prints each body once and leaves the audit
    group's committed offsets at the end of every queue."""
    bodies = send_orders(broker, 10)
    out = run_example(library_example("PullConsumer"), broker, tmp_path).stdout
    for body in bodies:
        assert out.count(repr(body)) == 1, f"{body!r} printed {out.count(repr(body))} times:\n{out}"
    with Admin(brokers=broker.address) as admin:
        stats = admin.consume_stats("audit", "Orders")
    assert [q.consumer_offset for q in stats] == [q.max_offset for q in stats]
    assert sum(q.max_offset for q in stats) == 10 and sum(q.lag for q in stats) == 0
