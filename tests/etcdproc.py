"""A real etcd for tests (Debian's etcd-server, installed once when missing): one member on free
loopback ports, its data in a temp dir, started through bench.procs.orphan_safe so it never outlives
the test run. pause()/resume() freeze it (SIGSTOP/SIGCONT) as a partition from every client would."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from bench.procs import ensure_peer_servers, free_port, orphan_safe, wait_port

ETCD_PACKAGE = {"etcd": "etcd-server"}


def etcd_binary() -> str:
    found, reason = ensure_peer_servers(packages=ETCD_PACKAGE)
    if "etcd" not in found:
        raise RuntimeError(f"etcd is needed for controller-mode tests: {reason}")
    return found["etcd"]


class EtcdProcess:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = data_dir.with_name(data_dir.name + ".log")

    @property
    def url(self) -> str:
        return f"etcd://127.0.0.1:{self.port}"

    def start(self) -> EtcdProcess:
        client, peer = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.peer_port}"
        command = [etcd_binary(), "--name", "t", "--data-dir", str(self.data_dir),
                   "--listen-client-urls", client, "--advertise-client-urls", client,
                   "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                   "--initial-cluster", f"t={peer}", "--log-level", "warn"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(orphan_safe(command), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env={**os.environ, "ETCD_UNSUPPORTED_ARCH": ""})
        wait_port(self.port, 30, self.proc, "etcd")
        return self

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
