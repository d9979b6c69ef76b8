"""Start real Tidemark broker processes for tests: temp data dir, free port on 127.0.0.1.

Children are started through bench.procs.orphan_safe (PR_SET_PDEATHSIG set in a launcher, never in
a preexec_fn), so a broker never outlives the test run. A broker or name server whose command is this
Python running its module is forked from the worker's fork server instead (tests/forkserver.py `start`:
the same server in a process of its own, without importing it again), unless its environment says
otherwise.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import forkserver
import grpc
from grpc_health.v1 import health_pb2_grpc

from bench.procs import free_port, orphan_safe
from tidemark.v1 import admin_pb2_grpc, membership_pb2_grpc, messaging_pb2_grpc, offsets_pb2_grpc

__all__ = ["BrokerProcess", "BrokerStubs", "ChildProcess", "NamesrvProcess", "free_port", "orphan_safe"]

READY = re.compile(r"event=broker_ready .*port=(\d+)")


class BrokerStubs:
    """The raw gRPC stubs of one broker, for tests that check exact status codes and messages; with
    `credentials` every call is signed as RocketMQ 5 clients sign them."""

    def __init__(self, address: str, credentials=None) -> None:
        self.channel = grpc.insecure_channel(address)
        if credentials is not None:
            self.channel = grpc.intercept_channel(self.channel, _Signer(credentials))
        self.messaging = messaging_pb2_grpc.MessagingServiceStub(self.channel)
        self.offsets = offsets_pb2_grpc.OffsetServiceStub(self.channel)
        self.membership = membership_pb2_grpc.MembershipServiceStub(self.channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.channel.close()


class _Signer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
              grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds a fresh signature (tidemark.common.auth.signed_metadata) to every call of a sync channel."""

    def __init__(self, credentials) -> None:
        self._credentials = credentials

    def _signed(self, details):
        from tidemark.common.auth import signed_metadata
        return _CallDetails(details, (*(details.metadata or ()), *signed_metadata(self._credentials)))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._signed(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._signed(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._signed(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._signed(details), requests)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, base, metadata) -> None:
        self.method, self.timeout, self.credentials = base.method, base.timeout, base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)
        self.metadata = metadata


class ChildProcess:
    """A process started by a test: graceful stop (SIGTERM, then SIGKILL after a timeout), kill -9,
    SIGSTOP/SIGCONT."""

    proc: subprocess.Popen | None = None

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

    def pause(self) -> None:
        sigstop(self.proc)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)


def sigstop(proc: subprocess.Popen, timeout_s: float = 5.0) -> None:
    """SIGSTOP, returning once every thread of the process is stopped. The signal is sent at once, but each
    thread stops at its next trip through the kernel: on a loaded machine a request already taken could
    still be answered after a plain send_signal returned (a test then saw its first call after the pause
    succeed)."""
    proc.send_signal(signal.SIGSTOP)
    tasks = Path(f"/proc/{proc.pid}/task")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = []
        try:
            threads = list(tasks.iterdir())
        except FileNotFoundError:
            return  # the process is gone
        for thread in threads:
            try:
                states.append((thread / "stat").read_text().rsplit(")", 1)[1].split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue  # a thread that ended meanwhile
        if all(state in ("T", "t", "Z", "X") for state in states):
            return
        time.sleep(0.002)


class BrokerProcess(ChildProcess):
    """A broker on `host` (127.0.0.1; a fault network's host address, with `launch` its namespace's
    `ip netns exec` prefix: tests/faults/netns.py)."""

    def __init__(self, data_dir: Path, *, port: int | None = None, broker_name: str = "broker-a",
                 args: tuple[str, ...] = (), env: dict[str, str] | None = None, host: str = "127.0.0.1",
                 launch: tuple[str, ...] = ()) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.broker_name = broker_name
        self.args = tuple(args)
        self.env = env or {}
        self.host = host
        self.launch = tuple(launch)
        self.proc: subprocess.Popen | forkserver.ForkedProcess | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-{broker_name}.log"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        host = ("--host", self.host) if self.host != "127.0.0.1" else ()
        return [*self.launch, sys.executable, "-m", "tidemark.broker.app", "--data-dir", str(self.data_dir),
                "--port", str(self.port), *host, "--broker-name", self.broker_name, *self.args]

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.proc = forkserver.start(self.command(), env={**os.environ, **self.env}, log=self.log_path)
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

    def restart(self) -> BrokerProcess:
        self.stop()
        return self.start()


class NamesrvProcess(ChildProcess):
    """A `tidemark namesrv` process on a free loopback port (it keeps no files; its log goes to log_path)."""

    READY = re.compile(r"event=namesrv_ready .*port=(\d+)")

    def __init__(self, log_dir: Path, *, port: int | None = None, args: tuple[str, ...] = (),
                 host: str = "127.0.0.1", launch: tuple[str, ...] = ()) -> None:
        self.port = port or free_port()
        self.args = tuple(args)
        self.host = host
        self.launch = tuple(launch)
        self.proc: subprocess.Popen | forkserver.ForkedProcess | None = None
        self.log_path = Path(log_dir) / f"namesrv-{self.port}.log"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> NamesrvProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        host = ("--host", self.host) if self.host != "127.0.0.1" else ()
        command = [*self.launch, sys.executable, "-m", "tidemark.broker.namesrv.server", "--port", str(self.port),
                   *host, *self.args]
        self.proc = forkserver.start(command, env=dict(os.environ), log=self.log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_path.read_bytes()[offset:].decode("utf-8", "replace")
            if self.READY.search(text):
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"name server exited with {self.proc.returncode} during startup:\n{text[-3000:]}")
            time.sleep(0.05)
        self.kill()
        raise TimeoutError(f"name server not ready after {timeout}s")

    def log_text(self) -> str:
        return self.log_path.read_text("utf-8", "replace") if self.log_path.exists() else ""
