"""docker-compose.yml and the Dockerfile, checked without a container engine.

The compose file is validated against the pinned Compose Specification schema, and every service's
command runs as a plain process with the same arguments and environment, container names and
ports mapped to 127.0.0.1 and free ports: two brokers, a Spark master and worker, and the job.
tests/containers/ runs the same stack in a real engine where one can run.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pyspark
import pytest
import yaml
from brokerproc import free_port, orphan_safe
from workload import wait_until

from client import Admin

ROOT = Path(__file__).resolve().parent.parent.parent
COMPOSE = ROOT / "docker-compose.yml"
SCHEMA = ROOT / "tests" / "compose" / "compose-spec.json"
SCHEMA_SHA256 = "0dc04bd346dcfee1b1419628fff79937bbf076925f298f272a2b490e2b112bac"
BROKERS = ("broker-a", "broker-b")


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def validator() -> jsonschema.Draft201909Validator:
    return jsonschema.Draft201909Validator(json.loads(SCHEMA.read_text()))


def test_pinned_schema_is_unchanged():
    assert hashlib.sha256(SCHEMA.read_bytes()).hexdigest() == SCHEMA_SHA256


def test_compose_file_is_valid_against_the_compose_specification():
    errors = [e.message for e in validator().iter_errors(compose())]
    assert errors == []
    broken = copy.deepcopy(compose())
    broken["services"]["broker-a"]["healthcheck"]["interval"] = 5
    broken["services"]["job"]["depends_on"]["broker-a"]["condition"] = "service_ready"
    broken["services"]["broker-b"]["comand"] = ["typo"]
    assert len(list(validator().iter_errors(broken))) >= 3, "the validator accepts broken files"


def test_the_stack_has_what_the_pipeline_needs():
    services = compose()["services"]
    assert set(services) == {"broker-a", "broker-b", "spark-master", "spark-worker", "job"}
    volumes, host_ports = set(), set()
    for name in BROKERS:
        s = services[name]
        assert s["build"]["target"] == "broker"
        volumes.add(s["volumes"][0].split(":")[0])
        for p in s["ports"]:
            ip, host_port, _ = p.split(":")
            assert ip == "127.0.0.1", "published on the loopback only"
            host_ports.add(host_port)
        assert s["healthcheck"]["test"][:3] == ["CMD", "tidemark", "health"]
        assert f"--broker-name={name}" in _flags(s["command"]) and f"--advertise-addr={name}:10911" in _flags(s["command"])
    assert len(volumes) == 2 and len(host_ports) == 4, "each broker needs its own volume and ports"
    job = services["job"]
    assert {k: v["condition"] for k, v in job["depends_on"].items() if k in BROKERS} == {
        "broker-a": "service_healthy", "broker-b": "service_healthy"}
    assert "broker-a:10911,broker-b:10911" in job["command"]


def _flags(command: list[str]) -> set[str]:
    return {f"{a}={b}" for a, b in zip(command, command[1:], strict=False) if a.startswith("--")}


def test_dockerfile_broker_image():
    text = (ROOT / "Dockerfile").read_text()
    broker_stage = text.split("FROM runtime AS broker", 1)[1]
    assert "ARG BASE_IMAGE=python:3.11-slim" in text and "--no-index --find-links /wheels" in text
    assert "USER tidemark" in broker_stage and 'VOLUME ["/data"]' in broker_stage
    assert 'HEALTHCHECK' in broker_stage and '"tidemark", "health"' in broker_stage
    assert 'ENTRYPOINT ["tidemark", "broker"]' in broker_stage and "STOPSIGNAL SIGTERM" in broker_stage
    assert "AS spark" in text and "default-jre-headless" in text


class Stack:
    """The compose services as local processes."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ports = {(name, 10911): free_port() for name in BROKERS}
        self.ports[("spark-master", 7077)] = free_port()
        self.procs: list[subprocess.Popen] = []

    def translate(self, service: str, args: list[str]) -> list[str]:
        """Container names to 127.0.0.1, container ports to free ports, container paths to temp dirs."""
        out = []
        for i, a in enumerate(args):
            prev = args[i - 1] if i else ""
            if prev == "--data-dir":
                a = str(self.tmp / service / "data")
            elif prev == "--checkpoint":
                a = str(self.tmp / "checkpoint")
            elif prev in ("--host", "--driver-host") or a == "0.0.0.0":
                a = "127.0.0.1"
            elif prev in ("--webui-port", "--metrics-port"):
                a = str(free_port())
            elif prev == "--port" and service in BROKERS:
                a = str(self.ports[(service, 10911)])
            elif prev == "--port" and service == "spark-master":
                a = str(self.ports[("spark-master", 7077)])
            for (name, port), local in self.ports.items():
                a = a.replace(f"{name}:{port}", f"127.0.0.1:{local}")
            out.append(a)
        return out

    def env(self, service: dict) -> dict[str, str]:
        env = {**os.environ, **{k: str(v) for k, v in (service.get("environment") or {}).items()}}
        env["PYSPARK_PYTHON"] = sys.executable  # the image sets its own venv's python
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        env["SPARK_HOME"] = os.path.dirname(pyspark.__file__)
        return env

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "ab")
        proc = subprocess.Popen(orphan_safe(argv), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)


def _healthy(address: str) -> bool:
    check = subprocess.run([sys.executable, "-m", "client.cli.main", "health", "--broker", address],
                           capture_output=True, timeout=30)
    return check.returncode == 0


@pytest.mark.spark
def test_compose_services_run_as_processes(tmp_path):
    services = compose()["services"]
    stack = Stack(tmp_path)
    spark_class = str(Path(os.path.dirname(pyspark.__file__)) / "bin" / "spark-class")
    try:
        for name in BROKERS:
            argv = [sys.executable, "-m", "client.cli.main", "broker", *stack.translate(name, services[name]["command"])]
            stack.start(name, argv, stack.env(services[name]))
        for name in BROKERS:
            address = f"127.0.0.1:{stack.ports[(name, 10911)]}"
            wait_until(lambda a=address: _healthy(a), 60, f"{name} healthy (its compose healthcheck)")
        for name in ("spark-master", "spark-worker"):
            command = stack.translate(name, services[name]["command"])
            assert command[0] == "spark-class"
            stack.start(name, [spark_class, *command[1:]], stack.env(services[name]))
            time.sleep(2)
        job_cmd = stack.translate("job", services["job"]["command"])
        assert job_cmd[0] == "python"
        job = subprocess.run([sys.executable, *job_cmd[1:]], cwd=ROOT, env=stack.env(services["job"]),
                             capture_output=True, text=True, timeout=600)
        assert job.returncode == 0, f"job failed:\n{job.stdout[-3000:]}\n{job.stderr[-5000:]}"
        brokers = ",".join(f"127.0.0.1:{stack.ports[(n, 10911)]}" for n in BROKERS)
        with Admin(brokers=brokers) as admin:
            groups = admin.list_groups()
            assert groups, "the job committed no group progress"
            stats = admin.consume_stats(groups[0].group)
        assert {s.queue.broker_name for s in stats} == set(BROKERS), "the topic should span both brokers"
        assert sum(s.lag for s in stats) == 0 and sum(s.max_offset for s in stats) > 0
    finally:
        stack.stop()
