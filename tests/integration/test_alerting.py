"""deploy/prometheus alert rules and the deploy/grafana dashboard against real brokers: every metric they
name is one a broker (or a replica) exposes, lag in seconds follows store timestamps, and promtool checks
the rules and runs their unit tests (`make test` installs Debian's prometheus package for promtool)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml
from brokerproc import free_port
from workload import metric, wait_until

from tidemark.client import Admin, Message, MessageQueue, Producer

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "tidemark-alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "tidemark-alerts.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "tidemark-dashboard.json"
NAME = re.compile(r"\btidemark_[a-z_]+")


def expressions() -> list[str]:
    rules = [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return rules + [t["expr"] for p in panels for t in p["targets"]]


def exposed(port: int) -> set[str]:
    """Metric names a broker's /metrics declares, with a counter's and a histogram's sample names."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names.add(name)
            if kind == "histogram":
                names.update(f"{name}_{suffix}" for suffix in ("bucket", "sum", "count"))
    return names


def test_every_metric_the_rules_and_the_dashboard_use_is_exposed(broker_factory):
    master_port, replica_port = free_port(), free_port()
    master = broker_factory("broker-a", args=("--metrics-port", str(master_port)))
    broker_factory("broker-a", args=("--broker-id", "1", "--master", master.address, "--metrics-port",
                                     str(replica_port)))
    with Admin(brokers=master.address) as admin:
        admin.create_topic("Alerted", 1)
        with Producer(brokers=master.address) as producer:
            producer.send_batch([Message("Alerted", b"m%d" % i) for i in range(10)])
        admin.commit("slow", {MessageQueue("Alerted", "broker-a", 0): 4})
    used = {name for expr in expressions() for name in NAME.findall(expr)}
    assert len(used) >= 12
    missing = used - exposed(master_port) - exposed(replica_port)
    assert missing == set(), f"named in deploy/ but exposed by no broker: {sorted(missing)}"
    # Lag in seconds: the age of the oldest unconsumed message (offset 4), from its store timestamp.
    labels = dict(group="slow", topic="Alerted", queue="0")
    wait_until(lambda: metric(master_port, "tidemark_consumer_lag_seconds", **labels) >= 1.0, 15,
               "the unconsumed message to be a second old")
    assert metric(master_port, "tidemark_consumer_lag", **labels) == 6
    assert metric(master_port, "tidemark_consumer_offset", **labels) == 4
    assert metric(master_port, "tidemark_queue_max_offset", topic="Alerted", queue="0") == 10
    with Admin(brokers=master.address) as admin:
        admin.commit("slow", {MessageQueue("Alerted", "broker-a", 0): 10})
    wait_until(lambda: metric(master_port, "tidemark_consumer_lag_seconds", **labels) == 0, 15, "no lag, no age")


def test_the_dashboard_is_a_grafana_dashboard():
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["title"] == "Tidemark" and doc["panels"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for p in doc["panels"]:
        assert p["type"] == "timeseries" and p["targets"] and all(t["expr"] and t["refId"] for t in p["targets"])
        assert p["datasource"]["uid"] == "${datasource}"


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not installed (as root: apt-get install prometheus; `make test` does it)")
def test_promtool_checks_the_rules_and_runs_their_unit_tests():
    check = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 8 rules found" in check.stdout
    tested = subprocess.run(["promtool", "test", "rules", str(RULE_TESTS)], capture_output=True, text=True,
                            timeout=60, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
