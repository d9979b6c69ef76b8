"""Start real Tidemark broker processes for tests: temp data dir, free port on 127.0.0.1.

The child gets PR_SET_PDEATHSIG, so a broker never outlives the test run.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

READY = re.compile(r"event=broker_ready .*port=(\d+)")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Runs in a fresh single-threaded interpreter: ask for SIGKILL when the parent dies (PR_SET_PDEATHSIG
# survives execve), then become the real command. Doing this in preexec_fn instead would run Python
# between fork and exec in a process full of gRPC threads, which can crash the child.
_LAUNCHER = (
    "import ctypes, os, signal, sys; "
    "ctypes.CDLL('libc.so.6').prctl(1, signal.SIGKILL); "
    "os.getppid() == int(sys.argv[1]) or os._exit(1); "
    "os.execv(sys.argv[2], sys.argv[2:])"
)


def orphan_safe(command: list[str]) -> list[str]:
    """command, wrapped so that the process is killed if the test process dies."""
    return [sys.executable, "-c", _LAUNCHER, str(os.getpid()), *command]


class BrokerProcess:
    def __init__(self, data_dir: Path, *, port: int | None = None, broker_name: str = "broker-a",
                 args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.broker_name = broker_name
        self.args = tuple(args)
        self.env = env or {}
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-{broker_name}.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "broker.app", "--data-dir", str(self.data_dir), "--port", str(self.port),
                "--broker-name", self.broker_name, *self.args]

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")
        env = {**os.environ, **self.env}
        self.proc = subprocess.Popen(orphan_safe(self.command()), stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_path.read_bytes()[offset:].decode("utf-8", "replace")
            if READY.search(text):
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode} during startup:\n{text[-3000:]}")
            time.sleep(0.05)
        self.kill()
        raise TimeoutError(f"broker not ready after {timeout}s:\n{self.log_text()[-3000:]}")

    def log_text(self) -> str:
        return self.log_path.read_text("utf-8", "replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 30.0) -> int:
        """Graceful stop (SIGTERM); returns the exit code."""
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.proc = None
        return code

    def kill(self) -> None:
        """kill -9."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def restart(self) -> BrokerProcess:
        self.stop()
        return self.start()
