"""The tests' brokers forked from the worker's fork server (tests/forkserver.py) are brokers as exec'd ones
are: their own pid, arguments, environment and exit codes, and they die with the server; a broker whose
environment changes the interpreter's start is exec'd. A CLI run forked by `forkserver.run` gives what
`subprocess.run` gives: output, exit code, its input, its timeout. (A crash point read from the environment when
tidemark.broker.faults is imported: tests/integration/test_transactions.py, the kill between the op record
and the message, which starts the same broker with and without it.)"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import forkserver
import pytest
from brokerproc import BrokerProcess
from workload import wait_until

from tidemark.client import Admin

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="the fork server needs pidfd_open (Linux)")
forking = pytest.mark.skipif(os.environ.get("TIDEMARK_TEST_EXEC") == "1",
                             reason="TIDEMARK_TEST_EXEC=1: every broker and CLI run is exec'd")

ROOT = Path(__file__).resolve().parents[2]


@forking
def test_a_forked_broker_serves_stops_with_0_and_dies_by_sigkill_with_minus_9(tmp_path):
    broker = BrokerProcess(tmp_path / "data").start()
    assert isinstance(broker.proc, forkserver.ForkedProcess)
    assert (broker.data_dir / "lock").read_text().strip() == str(broker.proc.pid)  # the broker, not the server
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("Forked", 2)
        assert "Forked" in admin.list_topics()
    assert broker.stop() == 0
    assert "event=broker_stop " in broker.log_text()
    broker.start()
    proc = broker.proc
    broker.kill()
    assert proc.returncode == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)  # reaped by the server


@forking
def test_a_forked_broker_refuses_bad_arguments_and_environment_with_exit_2(tmp_path):
    broker = BrokerProcess(tmp_path / "data", args=("--flush", "sometimes"))
    with pytest.raises(RuntimeError, match="exited with 2") as refused:
        broker.start()
    assert "invalid choice: 'sometimes'" in str(refused.value)
    broker = BrokerProcess(tmp_path / "data", env={"TIDEMARK_FLUSH": "sometimes"})
    with pytest.raises(RuntimeError, match="exited with 2") as refused:
        broker.start()
    assert "environment TIDEMARK_FLUSH" in str(refused.value)
    broker.env = {}
    broker.start().stop()  # the next child has only the environment it is given


@forking
def test_a_broker_whose_environment_changes_the_interpreter_is_execd(tmp_path):
    broker = BrokerProcess(tmp_path / "data", env={"PYTHONFAULTHANDLER": "1"}).start()
    try:
        assert isinstance(broker.proc, subprocess.Popen)
        assert b"tidemark.broker.app" in Path(f"/proc/{broker.proc.pid}/cmdline").read_bytes()
    finally:
        assert broker.stop() == 0


@forking
def test_forked_brokers_die_with_their_server(tmp_path):
    server = forkserver.ForkServer()  # a server of this test's own: the worker's serves other tests' brokers
    broker = BrokerProcess(tmp_path / "data")
    broker.data_dir.mkdir(parents=True)
    child = server.spawn(broker.command(), env=dict(os.environ), stdout=broker.log_path, stderr=broker.log_path)
    wait_until(lambda: "event=broker_ready" in broker.log_text(), 30, "the forked broker serves")
    server._proc.kill()
    assert child.wait(10) == -signal.SIGKILL
    wait_until(lambda: not Path(f"/proc/{child.pid}").exists(), 10, "the broker died with its server")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", forkserver.CLI_MODULE, *args]


@forking
def test_a_forked_cli_run_gives_what_the_execd_one_gives(tmp_path, monkeypatch):
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        with Admin(brokers=broker.address) as admin:
            admin.create_topic("Ran", 2)
        runs = [_cli("topic", "list", "--broker", broker.address),                   # 0
                _cli("topic", "describe", "Ran", "--json", "--broker", broker.address),  # 0, JSON
                _cli("topic", "describe", "NoSuch", "--broker", broker.address),      # 1, one line
                _cli("topic", "list", "--broker", "nohost"),                           # 2, argparse's error
                _cli("--version")]
        execd = [subprocess.run(c, capture_output=True, text=True, timeout=60) for c in runs]
        assert [r.returncode for r in execd] == [0, 0, 1, 2, 0]

        def no_exec(*a, **k):
            raise AssertionError(f"exec'd, not forked: {a}")
        monkeypatch.setattr(subprocess, "run", no_exec)
        monkeypatch.setattr(subprocess, "Popen", no_exec)
        forked = [forkserver.run(c, capture_output=True, text=True, timeout=60) for c in runs]
        assert [(r.returncode, r.stdout, r.stderr) for r in forked] == \
            [(r.returncode, r.stdout, r.stderr) for r in execd]
        raw = forkserver.run(runs[1], capture_output=True, timeout=60)  # bytes without text=True
        assert raw.stdout == execd[1].stdout.encode()
        with pytest.raises(subprocess.CalledProcessError):
            forkserver.run(runs[2], capture_output=True, check=True, timeout=60)

        sent = forkserver.run(_cli("send", "Ran", "--body", "-", "--lines", "--json", "--broker", broker.address),
                              input="one\ntwo\n", capture_output=True, text=True, timeout=60)
        assert sent.returncode == 0, sent.stderr
        assert len(json.loads(sent.stdout)) == 2  # a message for each line of its stdin
        with Admin(brokers=broker.address) as admin:
            assert sum(admin.max_offset(q) for q in admin.fetch_message_queues("Ran")) == 2
    finally:
        broker.kill()


@forking
def test_a_forked_cli_run_past_its_timeout_is_killed_and_reaped(tmp_path):
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        with Admin(brokers=broker.address) as admin:
            admin.create_topic("Waits", 1)
        server = forkserver.ForkServer.get()
        before = set(server._children)
        with pytest.raises(subprocess.TimeoutExpired):  # a consumer runs until it is stopped
            forkserver.run(_cli("consume", "Waits", "--group", "g", "--broker", broker.address),
                           capture_output=True, text=True, timeout=2)
        assert set(server._children) == before  # its exit came back: killed and reaped
    finally:
        broker.kill()


def test_a_cli_run_whose_environment_changes_the_interpreter_or_that_is_not_captured_is_execd(monkeypatch):
    calls = []
    real = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    out = forkserver.run(_cli("--version"), capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    assert out.returncode == 0 and calls == [_cli("--version")]
    assert forkserver.run(_cli("--version"), timeout=60).returncode == 0  # output not captured: exec'd
    assert len(calls) == 2


def _reads_environment(node: ast.AST) -> bool:
    """An expression that reads os.environ or calls os.getenv (a bare `os.environ`, such as a default
    argument bound to the mapping, reads nothing: the child changes that mapping in place)."""
    def is_environ(n: ast.AST) -> bool:
        return isinstance(n, ast.Attribute) and n.attr == "environ" and isinstance(n.value, ast.Name) \
            and n.value.id == "os"
    for n in ast.walk(node):
        if isinstance(n, ast.Subscript) and is_environ(n.value):
            return True
        if isinstance(n, ast.Call) and (isinstance(n.func, ast.Attribute) and is_environ(n.func.value)
                                        or any(is_environ(a) for a in n.args)
                                        or isinstance(n.func, ast.Attribute) and n.func.attr == "getenv"):
            return True
    return False


def _import_time_statements(tree: ast.Module):
    """What runs when a module is imported: its top level and class bodies, and functions' default values
    and decorators, but not function bodies."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from (d for d in (*node.args.defaults, *node.args.kw_defaults, *node.decorator_list) if d is not None)
        elif isinstance(node, ast.ClassDef):
            stack.extend(node.body)
            yield from (*node.bases, *node.decorator_list)
        else:
            yield node


def test_every_module_reading_the_environment_when_imported_is_imported_again_in_the_child():
    """The modules the fork server imports (the broker's, the CLI's and the client's) whose import reads the environment either only
    set a default (set again in the child) or are in forkserver.ENV_AT_IMPORT."""
    listed = subprocess.run(
        [sys.executable, "-c", f"import importlib, json, sys; [importlib.import_module(n) for n in {forkserver.PRELOAD!r}]; "
         "print(json.dumps({n: getattr(m, '__file__', None) for n, m in sys.modules.items() if n.startswith('tidemark')}))"],
        capture_output=True, text=True, check=True, cwd=ROOT)
    modules = {name: Path(path) for name, path in json.loads(listed.stdout).items() if path}
    assert "tidemark.broker.faults" in modules
    reading, defaults = set(), set()
    for name, path in modules.items():
        for statement in _import_time_statements(ast.parse(path.read_text())):
            if not _reads_environment(statement):
                continue
            calls = [n for n in ast.walk(statement) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
            if calls and all(c.func.attr == "setdefault" for c in calls):
                defaults.add(name)
            else:
                reading.add(name)
    assert reading == set(forkserver.ENV_AT_IMPORT)
    assert "tidemark.broker" in defaults  # (OPENBLAS_NUM_THREADS: the scan sees a setdefault)
