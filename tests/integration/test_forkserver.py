"""The tests' brokers forked from the worker's fork server (tests/forkserver.py) are brokers as exec'd ones
are: their own pid, arguments, environment and exit codes, and they die with the server; a broker whose
environment changes the interpreter's start is exec'd. (A crash point read from the environment when
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
forking = pytest.mark.skipif(os.environ.get("TIDEMARK_TEST_EXEC_BROKERS") == "1",
                             reason="TIDEMARK_TEST_EXEC_BROKERS=1: every broker is exec'd")

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
    child = server.spawn(broker.command()[3:], env=dict(os.environ), log=broker.log_path, args=broker.command())
    wait_until(lambda: "event=broker_ready" in broker.log_text(), 30, "the forked broker serves")
    server._proc.kill()
    assert child.wait(10) == -signal.SIGKILL
    wait_until(lambda: not Path(f"/proc/{child.pid}").exists(), 10, "the broker died with its server")


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
    """The broker's modules (as the fork server imports them) whose import reads the environment either only
    set a default (set again in the child) or are in forkserver.ENV_AT_IMPORT."""
    listed = subprocess.run(
        [sys.executable, "-c", "import json, sys, tidemark.broker.app, tidemark.broker.server; "
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
