"""A fork server for the tests' brokers: one Python process per pytest worker that imports the broker
once and forks each broker process the worker starts from there (BrokerProcess.start).

Why. A broker started as `python -m tidemark.broker.app` spends most of its start importing: start to
`broker ready` and a graceful stop took 501 ms of CPU (372 ms to ready) exec'd and 109 ms (64 ms to
ready) forked from an interpreter that had imported the broker already (8 in a row on the 2-core
machine). The suite starts about 550 brokers, and its wall time is its CPU: processes accounting of one
run put a third of the suite's CPU on broker processes.

What a forked broker is. The broker's own `main(argv)` in a process of its own, with the environment,
working directory, log file and arguments the test gave it, signalled, paused and killed by its pid as
an exec'd one is; its parent is this server, which reaps it and reports its exit code (`Popen`'s: a
negative signal number for a signal). What it shares with the server is what exec would have made
again: the interpreter, its flags and the modules imported. So:
- a command that is not this Python running the broker module (a `launch` prefix, a wrapper) and an
  environment that changes what the interpreter reads at its own start (PYTHON*, the allocator, the
  linker, OpenBLAS) are exec'd as before (`forkable`); `TIDEMARK_TEST_EXEC_BROKERS=1` exec's every one;
- variables the broker's imports set (setdefault) are set again in the child unless its environment has
  them, and modules that read the environment when imported (ENV_AT_IMPORT) are imported again there
  (tests/integration/test_forkserver.py keeps that list complete);
- the child dies with the server (PR_SET_PDEATHSIG), as the server dies with the worker (orphan_safe).

Protocol: JSON lines; the worker writes {"id", "argv", "env", "cwd", "log"} to the server's stdin, the
server answers {"id", "pid"} (or {"id", "error"}) and later {"exit": pid, "code": code} on its stdout.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib
import itertools
import json
import os
import select
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path

BROKER_MODULE = "tidemark.broker.app"
# Modules whose top level reads the environment: imported again in each child, after its environment is set.
ENV_AT_IMPORT = ("tidemark.broker.faults",)
# What the interpreter, the C allocator, the dynamic linker or OpenBLAS read when the process starts: a
# broker whose environment differs from the server's there is exec'd.
STARTUP_PREFIXES = ("PYTHON", "LD_", "MALLOC_", "GLIBC_", "OPENBLAS_")
PR_SET_PDEATHSIG = 1


# ---- the server (this file run as a script) ----

def serve() -> None:
    before = dict(os.environ)
    import tidemark.broker.app  # noqa: F401  the broker's modules, once
    import tidemark.broker.server  # noqa: F401
    set_by_imports = {k: v for k, v in os.environ.items() if k not in before}
    waiting: dict[int, int] = {}  # pidfd -> pid of a child not yet reaped
    me = os.getpid()
    poller = select.poll()
    poller.register(0, select.POLLIN)
    pending = b""
    while True:
        for fd, _ in poller.poll():
            if fd != 0:
                pid = waiting.pop(fd)
                poller.unregister(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                _send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
                continue
            data = os.read(0, 65536)
            if not data:
                return  # the worker is gone: the children die with this process (PR_SET_PDEATHSIG)
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                try:
                    pid = os.fork()
                except OSError as e:
                    _send({"id": request["id"], "error": str(e)})
                    continue
                if pid == 0:
                    _child(request, set_by_imports, server=me, close=list(waiting))
                pidfd = os.pidfd_open(pid)  # (a child that already ended is a zombie until reaped: readable)
                waiting[pidfd] = pid
                poller.register(pidfd, select.POLLIN)
                _send({"id": request["id"], "pid": pid})


def _send(message: dict) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def _child(request: dict, set_by_imports: dict[str, str], *, server: int, close: list[int]) -> None:
    """The forked broker: never returns."""
    code = 1
    try:
        ctypes.CDLL("libc.so.6").prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != server:
            os._exit(1)  # the server died between the fork and the prctl
        for fd in close:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for key, value in set_by_imports.items():
            os.environ.setdefault(key, value)
        for name in ENV_AT_IMPORT:
            importlib.reload(sys.modules[name])
        sys.path[0] = os.getcwd()  # as `python -m` has it
        app = sys.modules[BROKER_MODULE]
        sys.argv = [app.__file__, *request["argv"]]
        code = app.main(request["argv"])
    except SystemExit as e:  # argparse's refusals, sys.exit()
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:  # what the interpreter's own exit does: wait for non-daemon threads, atexit, flush
            threading._shutdown()
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


# ---- the worker's side ----

class ForkedProcess:
    """A broker forked by the server, with the part of `subprocess.Popen` the tests use: pid, returncode,
    poll, wait, send_signal, terminate, kill."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # (as Popen: never signal a pid that may have been given to another)
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The worker's handle on its server, started on first use (`spawn`)."""

    _current: ForkServer | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        from bench.procs import orphan_safe
        self.env = dict(os.environ)
        self._proc = subprocess.Popen(orphan_safe([sys.executable, str(Path(__file__).resolve())]),
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env)
        self._ids = itertools.count()
        self._write = threading.Lock()
        self._answers: dict[int, tuple[threading.Event, list]] = {}
        self._children: dict[int, ForkedProcess] = {}
        self._alive = True
        self._pid = os.getpid()
        threading.Thread(target=self._read, name="forkserver-reader", daemon=True).start()

    @classmethod
    def get(cls) -> ForkServer:
        with cls._lock:
            server = cls._current
            if server is None or not server._alive or server._pid != os.getpid():
                server = cls._current = ForkServer()
            return server

    def spawn(self, argv: list[str], *, env: dict[str, str], log: Path, args: list[str]) -> ForkedProcess:
        ask = next(self._ids)
        done, answer = threading.Event(), []
        self._answers[ask] = (done, answer)
        line = json.dumps({"id": ask, "argv": argv, "env": env, "cwd": os.getcwd(), "log": str(log)})
        with self._write:
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()
        if not done.wait(30):
            raise TimeoutError("the broker fork server did not answer in 30 s")
        reply, child = answer
        if child is None:
            raise OSError(f"the broker fork server could not fork: {reply['error']}")
        child.args = args
        return child

    def _read(self) -> None:
        for line in self._proc.stdout:
            message = json.loads(line)
            if "exit" in message:
                child = self._children.pop(message["exit"], None)
                if child is not None:
                    child._exited(message["code"])
                continue
            child = None
            if "pid" in message:  # registered before the caller sees it, so its exit always finds it
                child = self._children[message["pid"]] = ForkedProcess(message["pid"], [])
            done, answer = self._answers.pop(message["id"])
            answer.extend((message, child))
            done.set()
        # The server is gone, and its children with it (PR_SET_PDEATHSIG): say so to whoever waits.
        self._alive = False
        for child in list(self._children.values()):
            child._exited(-signal.SIGKILL)
        for done, answer in list(self._answers.values()):
            answer.extend(({"error": "the server exited"}, None))
            done.set()


def forkable(command: list[str], env: dict[str, str]) -> bool:
    """Whether this broker command may be forked from the server rather than exec'd (module docstring)."""
    if os.environ.get("TIDEMARK_TEST_EXEC_BROKERS") == "1" or not hasattr(os, "pidfd_open"):
        return False
    if command[:3] != [sys.executable, "-m", BROKER_MODULE]:
        return False
    base = ForkServer._current.env if ForkServer._current is not None else os.environ

    def startup(e) -> dict[str, str]:
        return {k: v for k, v in e.items() if k.startswith(STARTUP_PREFIXES)}

    return startup(env) == startup(base)


def start(command: list[str], *, env: dict[str, str], log: Path) -> ForkedProcess:
    """Fork the broker `command` (forkable) with this environment, its output appended to `log`."""
    return ForkServer.get().spawn(command[3:], env=env, log=log, args=command)


if __name__ == "__main__":
    serve()
