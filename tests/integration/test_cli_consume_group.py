"""`tidemark consume TOPIC --group G`: a push consumer of the group that prints and commits."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import forkserver
from workload import create_topic, produce, wait_until

from tidemark.client import Admin


def run_consume(address: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return forkserver.run([sys.executable, "-m", "tidemark.client.cli.main", "consume", *args, "--broker", address],
                          capture_output=True, text=True, timeout=timeout)


def lag(address: str, group: str, topic: str) -> int:
    with Admin(brokers=address) as admin:
        return sum(s.lag for s in admin.consume_stats(group, topic))


def test_count_prints_exactly_n_and_commits_only_those(broker):
    create_topic(broker.address, "Cli", 2)
    ids = produce(broker.address, "Cli", 50, batch=25)
    first = run_consume(broker.address, "Cli", "--group", "cli-g", "--from-where", "first", "--count", "20")
    assert first.returncode == 0, first.stderr
    lines = [json.loads(line) for line in first.stdout.splitlines()]
    assert len(lines) == 20
    assert {"topic", "queue_id", "queue_offset", "msg_id", "tags", "keys", "body", "store_timestamp",
            "reconsume_times"} <= set(lines[0])
    assert lag(broker.address, "cli-g", "Cli") == 30, "messages past --count were committed"
    rest = run_consume(broker.address, "Cli", "--group", "cli-g", "--count", "30")
    assert rest.returncode == 0, rest.stderr
    second = [json.loads(line)["msg_id"] for line in rest.stdout.splitlines()]
    assert sorted(second + [doc["msg_id"] for doc in lines]) == sorted(ids)
    assert lag(broker.address, "cli-g", "Cli") == 0


def test_without_count_runs_until_sigterm_then_commits_and_exits_0(broker):
    create_topic(broker.address, "CliRun", 1)
    produce(broker.address, "CliRun", 10)
    proc = subprocess.Popen([sys.executable, "-m", "tidemark.client.cli.main", "consume", "CliRun", "--group", "runner",
                             "--from-where", "first", "--tag", "*", "--broker", broker.address],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    wait_until(lambda: seen.append(proc.stdout.readline()) or len(seen) >= 10, 60, "ten lines")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.stderr.read()
    assert lag(broker.address, "runner", "CliRun") == 0
