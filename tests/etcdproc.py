"""A real etcd for tests (Debian's etcd-server, installed once when missing): one member on free
loopback ports (`EtcdProcess`) or a cluster of several (`EtcdCluster`), data in a temp dir, started
through bench.procs.orphan_safe so that nothing outlives the test run. pause()/resume() freeze a member
(SIGSTOP/SIGCONT) as a partition from every client would; stop() and kill() end one."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from brokerproc import sigstop

from bench.procs import ensure_peer_servers, free_port, orphan_safe, wait_port

ETCD_PACKAGE = {"etcd": "etcd-server"}


def etcd_binary() -> str:
    found, reason = ensure_peer_servers(packages=ETCD_PACKAGE)
    if "etcd" not in found:
        raise RuntimeError(f"etcd is needed for controller-mode tests: {reason}")
    return found["etcd"]


class EtcdProcess:
    """One etcd member; alone (the default) or one of `initial_cluster`'s members, named `name`."""

    def __init__(self, data_dir: Path, *, name: str = "t", port: int | None = None, peer_port: int | None = None,
                 initial_cluster: str = "") -> None:
        self.data_dir = data_dir
        self.name = name
        self.port = port or free_port()
        self.peer_port = peer_port or free_port()
        self.initial_cluster = initial_cluster or f"{name}={self.peer_url}"
        self.proc: subprocess.Popen | None = None
        self.log_path = data_dir.with_name(data_dir.name + ".log")

    @property
    def url(self) -> str:
        return f"etcd://127.0.0.1:{self.port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def start(self) -> EtcdProcess:
        self.launch()
        wait_port(self.port, 30, self.proc, "etcd")
        return self

    def launch(self) -> None:
        """Start the process without waiting (the members of a new cluster wait for each other)."""
        client = f"http://127.0.0.1:{self.port}"
        command = [etcd_binary(), "--name", self.name, "--data-dir", str(self.data_dir),
                   "--listen-client-urls", client, "--advertise-client-urls", client,
                   "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
                   "--initial-cluster", self.initial_cluster, "--log-level", "warn"]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(orphan_safe(command), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env={**os.environ, "ETCD_UNSUPPORTED_ARCH": ""})

    def pause(self) -> None:
        sigstop(self.proc)

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

    def kill(self) -> None:
        """kill -9."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


class EtcdCluster:
    """`size` etcd members on loopback; `url` names them all, as a broker's --controller does."""

    def __init__(self, data_dir: Path, size: int = 3) -> None:
        names = [f"m{i}" for i in range(size)]
        peers = {n: free_port() for n in names}
        initial = ",".join(f"{n}=http://127.0.0.1:{port}" for n, port in peers.items())
        self.members = [EtcdProcess(data_dir / n, name=n, peer_port=peers[n], initial_cluster=initial)
                        for n in names]

    @property
    def url(self) -> str:
        return "etcd://" + ",".join(f"127.0.0.1:{m.port}" for m in self.members)

    def start(self) -> EtcdCluster:
        for m in self.members:
            m.launch()
        for m in self.members:
            wait_port(m.port, 30, m.proc, f"etcd member {m.name}")
        return self

    def member(self, endpoint: str) -> EtcdProcess:
        """The member serving clients at host:port."""
        return next(m for m in self.members if f"127.0.0.1:{m.port}" == endpoint)

    def stop(self) -> None:
        for m in self.members:
            m.stop()


def enable_auth(member: EtcdProcess, root_password: str, users: dict[str, str]) -> None:
    """Turn on etcd's authentication: a root user, and each of `users` (name -> password) in a role that
    may read and write under /tidemark/ only, as an operator would give brokers."""
    import asyncio

    import grpc
    from aetcd import rpc

    async def enable() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{member.port}") as channel:
            auth = rpc.AuthStub(channel)
            await auth.UserAdd(rpc.AuthUserAddRequest(name="root", password=root_password))
            await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"))
            await auth.RoleAdd(rpc.AuthRoleAddRequest(name="brokers"))
            await auth.RoleGrantPermission(rpc.AuthRoleGrantPermissionRequest(
                name="brokers", perm=rpc.Permission(permType=rpc.Permission.READWRITE, key=b"/tidemark/",
                                                    range_end=b"/tidemark0")))
            for name, password in users.items():
                await auth.UserAdd(rpc.AuthUserAddRequest(name=name, password=password))
                await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user=name, role="brokers"))
            await auth.AuthEnable(rpc.AuthEnableRequest())

    asyncio.run(enable())
