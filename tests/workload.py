"""Test workloads: produce quickly, wait on a condition, run consumer processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from brokerproc import ChildProcess, orphan_safe

from tidemark.client import Admin, Message, MessageQueue, NotFoundError, Producer

CONSUMER_SCRIPT = Path(__file__).parent / "consumer_proc.py"


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05,
               details: Callable[[], str] | None = None) -> None:
    """Poll predicate until it holds; on timeout fail saying what was awaited and, when given, what
    `details` says of the state then (read only on failure)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    message = f"timed out after {timeout}s waiting for {what}"
    if details is not None:
        try:
            message += "\n" + details()
        except Exception as e:  # the diagnostics must not hide the timeout
            message += f"\n(diagnostics failed: {e!r})"
    raise AssertionError(message)


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """A broker's Prometheus metrics: (name, sorted labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def metric(port: int, name: str, **labels: str) -> float:
    return scrape(port).get((name, tuple(sorted(labels.items()))), 0.0)


def settled(address: str, group: str, *topics: str) -> bool:
    """Whether the group has committed everything stored in these topics (and its retry topic): nothing
    it is going to consume is left, so nothing more can reach its listener."""
    from tidemark.common.protocol import retry_topic

    with Admin(brokers=address) as admin:
        for topic in (*topics, retry_topic(group)):
            try:
                if any(s.lag for s in admin.consume_stats(group, topic)):
                    return False
            except NotFoundError:
                continue
    return True


def create_topic(address: str, topic: str, queues: int) -> None:
    with Admin(brokers=address) as admin:
        admin.create_topic(topic, queues)


def produce(address: str, topic: str, count: int, *, batch: int = 50, body: bytes = b"x" * 100,
            tags: str = "", prefix: str = "m") -> list[str]:
    """Send count messages spread over every queue in batches; returns their msg ids in send order."""
    ids: list[str] = []
    with Producer(brokers=address) as producer:
        queues = producer.fetch_publish_message_queues(topic)
        sent = 0
        while sent < count:
            n = min(batch, count - sent)
            q = queues[(sent // batch) % len(queues)]
            msgs = [Message(topic, body, tags=tags, keys=f"{prefix}{sent + i}") for i in range(n)]
            ids.extend(r.msg_id for r in producer.send_batch(msgs, queue=q))
            sent += n
    return ids


def stored_messages(address: str, topic: str) -> list:
    """Every message of the topic as a consumer can read it, queue by queue, in queue order."""
    with Admin(brokers=address) as admin:
        out = []
        for mq in admin.fetch_message_queues(topic):
            offset, high = admin.offsets([mq])[mq]
            while offset < high:
                messages = admin.pull(mq, offset, max_nums=256).messages
                out += messages
                offset += len(messages)
        return out


def queue(topic: str, queue_id: int, broker: str = "broker-a") -> MessageQueue:
    return MessageQueue(topic, broker, queue_id)


class ConsumerProcess(ChildProcess):
    """tests/consumer_proc.py as a child process; every consumed message is a line in `out`."""

    def __init__(self, out: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.out = out
        self.args = args
        self.env = env
    def start(self, timeout: float = 30.0) -> ConsumerProcess:
        with open(f"{self.out}.log", "ab") as log:
            self.proc = subprocess.Popen(
                orphan_safe([sys.executable, str(CONSUMER_SCRIPT), "--out", str(self.out), *self.args]),
                stdout=subprocess.PIPE, stderr=log, env={**os.environ, **(self.env or {})})
        line = self.proc.stdout.readline().decode().strip()
        if line != "READY":
            self.proc.kill()
            raise RuntimeError(f"consumer process did not start: {line!r}\n{Path(f'{self.out}.log').read_text()[-3000:]}")
        return self

    def stop(self, timeout: float = 60.0) -> int:
        return super().stop(timeout)

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the process's stderr (the client's log)."""
        path = Path(f"{self.out}.log")
        return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"

    def records(self) -> list[tuple[str, int, int, str]]:
        """(msg_id, queue_id, queue_offset, client_id) per consumed message."""
        if not self.out.exists():
            return []
        rows = []
        for line in self.out.read_text().splitlines():
            parts = line.split(" ")
            if len(parts) >= 4:
                rows.append((parts[0], int(parts[1]), int(parts[2]), parts[3]))
        return rows


class SlowStartProxy:
    """A loopback TCP proxy to `target` that holds back everything the server sends during the first
    `delay_s` of each connection: a broker slow to finish a handshake, as on a busy machine."""

    def __init__(self, target: str, delay_s: float) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._delay_s = delay_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._sockets: list[socket.socket] = []
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, name="slow-proxy", daemon=True).start()

    def __enter__(self) -> SlowStartProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        for s in [self._listener, *self._sockets]:
            try:
                s.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                server = socket.create_connection(self._target)
            except OSError:
                return
            self._sockets += [client, server]
            hold_until = time.monotonic() + self._delay_s
            threading.Thread(target=self._pipe, args=(client, server, 0.0), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, hold_until), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, hold_until: float) -> None:
        try:
            while data := src.recv(65536):
                time.sleep(max(0.0, hold_until - time.monotonic()))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
