"""Child processes for the benchmarks: servers and workload clients that die with the harness.

Every child is started through a tiny launcher interpreter that asks for
PR_SET_PDEATHSIG before exec'ing the real command (tests/brokerproc.py's
`orphan_safe`), so nothing outlives `python -m bench`, and no Python runs
between fork and exec in a process that has gRPC threads.
Also: the one-time apt-get install of the peer servers.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_LAUNCHER = (
    "import ctypes, os, signal, sys; "
    "ctypes.CDLL('libc.so.6').prctl(1, signal.SIGKILL); "
    "os.getppid() == int(sys.argv[1]) or os._exit(1); "
    "os.execv(sys.argv[2], sys.argv[2:])"
)


def own_cpu_s() -> float:
    """CPU seconds (user and system) this process has used."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def orphan_safe(command: list[str]) -> list[str]:
    """command, wrapped so that the process is SIGKILLed if this process dies."""
    exe = command[0] if os.path.isabs(command[0]) else shutil.which(command[0]) or command[0]
    return [sys.executable, "-c", _LAUNCHER, str(os.getpid()), exe, *command[1:]]


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_PORTS_LOW = 20000
_PORTS_HIGH = min(_ephemeral_low(), 65536)  # (a machine whose ephemeral range starts lower: bind(0) below)
_SLICE = 1500
_next_port: int | None = None
_port_lock = threading.Lock()


def _first_port() -> int:
    """Where this process starts looking: its own slice of the range for a pytest-xdist worker (gw0,
    gw1, ...), so that two workers never pick the same port; elsewhere a place chosen by the pid."""
    span = _PORTS_HIGH - _PORTS_LOW
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():  # (slices wrap past span / 1500 workers)
        return _PORTS_LOW + (int(worker[2:]) * _SLICE) % span
    return _PORTS_LOW + (os.getpid() * 7919) % span


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on, for a server a test or benchmark starts next.

    Picked below the kernel's ephemeral range (ip_local_port_range, 32768 and up here): a port the
    kernel handed out by bind(0) may be given to some outgoing connection before the server binds it
    (a full suite saw "port ... is already in use" that way); ports below the range are never
    handed out on their own. Each process walks its own sequence, so a port is not picked twice."""
    global _next_port
    if _PORTS_HIGH - _PORTS_LOW < 2000:
        return _kernel_port()
    with _port_lock:
        if _next_port is None:
            _next_port = _first_port()
        for _ in range(_PORTS_HIGH - _PORTS_LOW):
            port = _next_port
            _next_port = _PORTS_LOW + (_next_port + 1 - _PORTS_LOW) % (_PORTS_HIGH - _PORTS_LOW)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    return _kernel_port()


def _kernel_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float, proc: subprocess.Popen | None = None, what: str = "server") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} during startup")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{what} not listening on port {port} after {timeout}s")


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GRPC_VERBOSITY", "ERROR")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)  # bench itself
    return env


class Server:
    """A long-running child (broker, redis-server, nats-server, echo server) with its log in a file."""

    def __init__(self, name: str, command: list[str], log_path: Path) -> None:
        self.name = name
        self.command = command
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> Server:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(orphan_safe(self.command), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=child_env(), cwd=str(REPO))
        return self

    def wait_log(self, pattern: str, timeout: float = 30.0) -> re.Match:
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        while time.monotonic() < deadline:
            text = self.log_path.read_text("utf-8", "replace") if self.log_path.exists() else ""
            m = rx.search(text)
            if m:
                return m
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{text[-2000:]}")
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} not ready after {timeout}s")

    def cpu_seconds(self) -> float:
        """User + system CPU the process (every thread) has used so far; 0 when it is not running."""
        if self.proc is None:
            return 0.0
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


class Worker:
    """`python -m bench.worker ROLE` child: JSON spec on stdin, JSON lines on stdout.

    The worker prints {"ready": ...} when its client is set up, waits for "go" on stdin (so that
    interpreter start and imports are never timed) and ends with one {"result": ...} line.
    """

    def __init__(self, role: str, spec: dict, log_path: Path) -> None:
        self.role = role
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                orphan_safe([sys.executable, "-m", "bench.worker", role]), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, env=child_env(), cwd=str(REPO))
        self.log_path = log_path
        self._result: dict | None = None
        self.lines: queue.Queue[dict | None] = queue.Queue()
        threading.Thread(target=self._pump, name=f"worker-{role}-stdout", daemon=True).start()
        self.proc.stdin.write((json.dumps(spec) + "\n").encode())
        self.proc.stdin.flush()

    def _pump(self) -> None:
        # One reader thread per worker: select() on the pipe would miss lines already sitting in the
        # file object's buffer when two arrive together.
        for line in self.proc.stdout:
            try:
                self.lines.put(json.loads(line))
            except ValueError:
                continue
        self.lines.put(None)

    def _line(self, timeout: float) -> dict:
        try:
            msg = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"worker {self.role} silent for {timeout}s ({self.log_path})") from None
        if msg is None:
            self.lines.put(None)
            self.proc.wait(5)
            tail = self.log_path.read_text("utf-8", "replace")[-2500:]
            raise RuntimeError(f"worker {self.role} exited with {self.proc.returncode}:\n{tail}")
        return msg

    def ready(self, timeout: float = 60.0) -> dict:
        msg = self._line(timeout)
        if "ready" not in msg:
            raise RuntimeError(f"worker {self.role}: expected ready, got {msg}")
        return msg["ready"]

    def send(self, command: str) -> None:
        try:
            self.proc.stdin.write((command + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass

    def go(self) -> None:
        self.send("go")

    def wait_for(self, key: str, timeout: float) -> dict:
        """Read lines until one has `key` (a result line met on the way is kept for result())."""
        while True:
            msg = self._line(timeout)
            if key in msg:
                return msg
            if "result" in msg:
                self._result = msg["result"]
                raise RuntimeError(f"worker {self.role} finished before {key!r}: {msg['result']}")

    def progress(self, timeout: float = 10.0) -> int:
        """Messages the worker's consumer has received so far (asks it on stdin)."""
        if self._result is not None:
            return self._result.get("count", 0)
        self.send("progress")
        while True:
            msg = self._line(timeout)
            if "result" in msg:  # it finished on its own (deadline or error)
                self._result = msg["result"]
                return self._result.get("count", 0)
            if "progress" in msg:
                return msg["progress"]

    def result(self, timeout: float) -> dict:
        while self._result is None:
            msg = self._line(timeout)
            if "result" in msg:
                self._result = msg["result"]
        self.proc.wait(30)
        return self._result

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


# -- peer servers from Debian's packages ---------------------------------------------------------

APT_PACKAGES = {"redis-server": "redis-server", "nats-server": "nats-server"}
_APT_LOCK = Path("/tmp/tidemark-bench-apt.lock")


def _apt(args: list[str], timeout: float, log: list[str]) -> bool:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "-o", "DPkg::Lock::Timeout=300", "-o", "Acquire::Retries=3", *args]
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.append(f"{' '.join(args[:2])}: {e}")
        return False
    if r.returncode != 0:
        log.append(f"{' '.join(args[:2])} exit {r.returncode}: {(r.stderr or r.stdout).strip()[-400:]}")
    return r.returncode == 0


def ensure_peer_servers(allow_install: bool = True,
                        packages: dict[str, str] = APT_PACKAGES) -> tuple[dict[str, str], str]:
    """({binary: path} of the servers available, reason for those missing ('' when none)): by default the
    benchmarks' peers; `packages` maps other binaries to their Debian packages (the tests' etcd).

    Installs missing ones with apt-get once (update, then install, three tries each) when root.
    A file lock keeps concurrent harness runs from racing on dpkg; a policy-rc.d keeps the packages'
    system services from starting.
    """
    found = {b: shutil.which(b) for b in packages}
    missing = [b for b, p in found.items() if not p]
    if not missing:
        return {b: p for b, p in found.items() if p}, ""
    if not allow_install:
        return {b: p for b, p in found.items() if p}, f"{', '.join(missing)} not installed (--no-install)"
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return {b: p for b, p in found.items() if p}, f"{', '.join(missing)} missing and apt-get unavailable (not root?)"
    log: list[str] = []
    with open(_APT_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = [b for b in missing if not shutil.which(b)]
        if missing:
            print(f"installing {' '.join(packages[b] for b in missing)} with apt-get (once)", flush=True)
            # Docker images carry a policy-rc.d that keeps postinst from starting the system services;
            # on a machine without one, add it for the duration of the install.
            policy = Path("/usr/sbin/policy-rc.d")
            added_policy = False
            if not policy.exists():
                policy.write_text("#!/bin/sh\nexit 101\n")
                policy.chmod(0o755)
                added_policy = True
            try:
                updated = False
                for attempt in range(3):
                    if not updated:
                        updated = _apt(["update", "-q"], 300, log)
                    if updated and _apt(["install", "-y", "-q", "--no-install-recommends",
                                         *(packages[b] for b in missing)], 600, log):
                        break
                    time.sleep(2 * (attempt + 1))
            finally:
                if added_policy:
                    policy.unlink(missing_ok=True)
    found = {b: shutil.which(b) for b in packages}
    still = [b for b, p in found.items() if not p]
    reason = f"apt-get could not install {', '.join(still)}: {' | '.join(log[-2:])}" if still else ""
    return {b: p for b, p in found.items() if p}, reason


def server_version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    m = re.search(r"v=(\S+)|v?(\d+\.\d+\.\d+)", out)
    return (m.group(1) or m.group(2)) if m else out.strip()[:40]
