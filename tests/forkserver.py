"""A fork server for the tests' brokers and CLI runs: one Python process per pytest worker that imports the
broker and the CLI once and forks from there each broker and name server the worker starts
(BrokerProcess.start, NamesrvProcess.start) and each `python -m tidemark.client.cli.main` it runs to
completion (`run`, for `subprocess.run`).

Why. A broker started as `python -m tidemark.broker.app` spends most of its start importing: start to
`broker ready` and a graceful stop took 501 ms of CPU (372 ms to ready) exec'd and 109 ms (64 ms to
ready) forked from an interpreter that had imported the broker already (8 in a row on the 2-core
machine). The suite starts about 550 brokers, and its wall time is its CPU: processes accounting of one
run put a third of the suite's CPU on broker processes. A CLI run is the same story: a `topic list`
took 255-277 ms of CPU exec'd and 31-34 ms forked (10 in a row each), and the suite makes about 270.

What a forked process is. The module's own `main(argv)` (the broker's, the name server's or the CLI's)
in a process of its own, with the environment, working directory, standard streams and arguments the
test gave it, signalled, paused and killed by its pid as an exec'd one is; its parent is this server,
which reaps it and reports its exit code (`Popen`'s: a negative signal number for a signal). A CLI run's
output goes to files the worker reads once it has exited (so `run` is `subprocess.run` with
`capture_output`, not a `Popen` with pipes to read while it runs). What it shares with the server is what
exec would have made again: the interpreter, its flags and the modules imported. So:
- a command that is not this Python running one of MODULES (a `launch` prefix, a wrapper) and an
  environment that changes what the interpreter reads at its own start (PYTHON*, the locale, the
  allocator, the linker, OpenBLAS) are exec'd as before (`forkable`); `TIDEMARK_TEST_EXEC=1` exec's
  every one;
- variables the imports set (setdefault) are set again in the child unless its environment has
  them, and modules that read the environment when imported (ENV_AT_IMPORT) are imported again there
  (tests/integration/test_forkserver.py keeps that list complete);
- the child dies with the server (PR_SET_PDEATHSIG), as the server dies with the worker (orphan_safe).

Protocol: JSON lines; the worker writes {"id", "module", "argv", "env", "cwd", "stdin", "stdout",
"stderr"} (the streams as paths, the output ones appended to) to the server's stdin, the server answers
{"id", "pid"} (or {"id", "error"}) and later {"exit": pid, "code": code} on its stdout.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib
import itertools
import json
import locale
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

BROKER_MODULE = "tidemark.broker.app"
NAMESRV_MODULE = "tidemark.broker.namesrv.server"
CLI_MODULE = "tidemark.client.cli.main"
# The `python -m` modules forked; each has main(argv) -> exit code.
MODULES = (BROKER_MODULE, NAMESRV_MODULE, CLI_MODULE)
# What the server imports once: MODULES and what their commands import when they run.
PRELOAD = (*MODULES, "tidemark.broker.server", "tidemark.client")
# Modules whose top level reads the environment: imported again in each child, after its environment is set.
ENV_AT_IMPORT = ("tidemark.broker.faults",)
# What the interpreter, the locale, the C allocator, the dynamic linker or OpenBLAS read when the process
# starts: a command whose environment differs from the server's there is exec'd.
STARTUP_PREFIXES = ("PYTHON", "LANG", "LC_", "LD_", "MALLOC_", "GLIBC_", "OPENBLAS_")
PR_SET_PDEATHSIG = 1


# ---- the server (this file run as a script) ----

def serve() -> None:
    before = dict(os.environ)
    for name in PRELOAD:
        importlib.import_module(name)
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
    """The forked process: never returns."""
    code = 1
    try:
        ctypes.CDLL("libc.so.6").prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != server:
            os._exit(1)  # the server died between the fork and the prctl
        for fd in close:
            os.close(fd)
        opened: dict[str, int] = {}
        for fd, name in enumerate(("stdin", "stdout", "stderr")):
            path = request[name]
            if path not in opened:
                flags = os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_APPEND | os.O_CREAT
                opened[path] = os.open(path, flags, 0o644)
            os.dup2(opened[path], fd)
        for fd in opened.values():
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for key, value in set_by_imports.items():
            os.environ.setdefault(key, value)
        for name in ENV_AT_IMPORT:
            importlib.reload(sys.modules[name])
        sys.path[0] = os.getcwd()  # as `python -m` has it
        module = sys.modules[request["module"]]
        sys.argv = [module.__file__, *request["argv"]]
        code = module.main(request["argv"])
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
    """A process forked by the server, with the part of `subprocess.Popen` the tests use: pid, returncode,
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

    def spawn(self, command: list[str], *, env: dict[str, str], cwd: str | Path | None = None,
              stdin: Path | str = os.devnull, stdout: Path, stderr: Path) -> ForkedProcess:
        """Fork `command` (`python -m` one of MODULES, its arguments)."""
        ask = next(self._ids)
        done, answer = threading.Event(), []
        self._answers[ask] = (done, answer)
        line = json.dumps({"id": ask, "module": command[2], "argv": command[3:], "env": env,
                           "cwd": str(cwd or os.getcwd()), "stdin": str(stdin), "stdout": str(stdout),
                           "stderr": str(stderr)})
        with self._write:
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()
        if not done.wait(30):
            raise TimeoutError("the fork server did not answer in 30 s")
        reply, child = answer
        if child is None:
            raise OSError(f"the fork server could not fork: {reply['error']}")
        child.args = command
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


def forkable(command: list[str], env: dict[str, str] | None = None) -> bool:
    """Whether this command may be forked from the server rather than exec'd (module docstring)."""
    if os.environ.get("TIDEMARK_TEST_EXEC") == "1" or not hasattr(os, "pidfd_open"):
        return False
    if len(command) < 3 or command[:2] != [sys.executable, "-m"] or command[2] not in MODULES:
        return False
    base = ForkServer._current.env if ForkServer._current is not None else os.environ

    def startup(e) -> dict[str, str]:
        return {k: v for k, v in e.items() if k.startswith(STARTUP_PREFIXES)}

    return startup(os.environ if env is None else env) == startup(base)


def start(command: list[str], *, env: dict[str, str], log: Path) -> ForkedProcess | subprocess.Popen:
    """Start the server `command` (a broker or a name server) with this environment, its output appended to
    `log` (created here): forked from the server when it is forkable, else exec'd through orphan_safe, so
    that it dies with the tests either way."""
    from bench.procs import orphan_safe
    with open(log, "ab") as out:
        if not forkable(command, env):
            return subprocess.Popen(orphan_safe(command), stdout=out, stderr=subprocess.STDOUT, env=env)
    return ForkServer.get().spawn(command, env=env, stdout=log, stderr=log)


def run(command: list[str], *, input: bytes | str | None = None, capture_output: bool = False,
        text: bool = False, timeout: float | None = None, cwd: str | Path | None = None,
        env: dict[str, str] | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """`subprocess.run` with these arguments, forked from the server when the command is forkable and its
    output captured; otherwise `subprocess.run` itself."""
    command = [str(a) for a in command]
    if not capture_output or not forkable(command, env):
        return subprocess.run(command, input=input, capture_output=capture_output, text=text, timeout=timeout,
                              cwd=cwd, env=env, check=check)
    with tempfile.TemporaryDirectory(prefix="tidemark-run-") as scratch:
        stdin, stdout, stderr = (Path(scratch) / name for name in ("stdin", "stdout", "stderr"))
        stdin.write_bytes(input.encode(locale.getpreferredencoding(False)) if isinstance(input, str) else input or b"")
        child = ForkServer.get().spawn(command, env=dict(os.environ if env is None else env), cwd=cwd,
                                       stdin=stdin, stdout=stdout, stderr=stderr)
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            raise subprocess.TimeoutExpired(command, timeout, output=_read(stdout, text),
                                            stderr=_read(stderr, text)) from None
        done = subprocess.CompletedProcess(command, code, _read(stdout, text), _read(stderr, text))
    if check:
        done.check_returncode()
    return done


def _read(path: Path, text: bool) -> bytes | str:
    data = path.read_bytes() if path.exists() else b""
    if not text:
        return data
    # as subprocess's text mode: the locale's encoding (the child's too: forkable), universal newlines
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


if __name__ == "__main__":
    serve()
