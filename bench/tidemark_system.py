"""Tidemark in the peer benchmark: the broker process and each workload's client code.

Server: `python -m tidemark.broker.app --data-dir TMP --port P` with its defaults
(async flush every 500 ms, consumerOffset.json every 5 s). Clients: the public
synchronous API (Producer.send_batch, PushConsumer with default settings),
except workload 3, which drives the streaming CommitOffsets RPC through
BrokerConnection.open_commit_stream() as fast as it accepts writes.

`TidemarkServer(..., security=Security.AUTH)` starts the broker with `--auth`
(and `Security.TLS_AUTH` with TLS too): the harness administers it as the
super user, and the workload clients sign every call as a plain user holding
only the rules a producer and a consumer group need, so each request pays for
the signature check and the ACL lookup (`python -m bench.auth_cost`).
"""

from __future__ import annotations

import asyncio
import enum
import os
import sys
import threading
import time
from pathlib import Path

from bench.procs import Server, free_port
from bench.workloads import Pacer, Recorder, consume_until, payload

NAME = "Tidemark"
BROKER_NAME = "broker-a"
# Throwaway secrets of a throwaway broker.
ROOT = ("root", "bench-root-secret")
CLIENT = ("bench", "bench-client-secret")


class Security(enum.Enum):
    OFF = "off"
    AUTH = "auth"
    TLS_AUTH = "tls+auth"


class TidemarkServer:
    name = NAME

    def __init__(self, workdir: Path, *, data: str = "tidemark-data", extra: tuple[str, ...] = (),
                 security: Security = Security.OFF) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.security = security
        self._sync: TidemarkServer | None = None
        self._ca_file = ""
        if security is not Security.OFF:
            extra = (*extra, "--auth", "--init-user", ":".join(ROOT))
        if security is Security.TLS_AUTH:
            from tests.tlslib import make_pki  # certificates made now, as the TLS tests make them
            pki = make_pki(workdir / f"{data}-pki")
            self._ca_file = str(pki.ca)
            extra = (*extra, "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key))
        self.server = Server("tidemark-broker", [sys.executable, "-m", "tidemark.broker.app", "--data-dir",
                                                 str(workdir / data), "--port", str(self.port), *extra],
                             workdir / f"{data}.log")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> TidemarkServer:
        self.server.start()
        self.server.wait_log(r"event=broker_ready", 60)
        if self.security is not Security.OFF:
            with self._admin() as admin:
                admin.create_user(*CLIENT)
                admin.create_acl(CLIENT[0], "Topic:bench*", ["Pub", "Sub"], "Allow")
                admin.create_acl(CLIENT[0], "Group:bench*", ["Sub"], "Allow")
        return self

    def client_spec(self) -> dict:
        """What a workload client needs to connect, for its spec (JSON): credentials and CA file."""
        if self.security is Security.OFF:
            return {}
        return {"credentials": list(CLIENT), "tls_ca_file": self._ca_file}

    def _admin(self):
        from tidemark.client import Admin
        if self.security is Security.OFF:
            return Admin(brokers=self.address)
        return Admin(brokers=self.address, **connect_kwargs({"credentials": ROOT, "tls_ca_file": self._ca_file}))

    def stop(self) -> None:
        self.server.stop()
        if self._sync is not None:
            self._sync.stop()

    def sync_flush(self) -> TidemarkServer:
        """A second broker with --flush sync (started on first use, stopped with this one)."""
        if self._sync is None:
            self._sync = TidemarkServer(self.workdir, data="tidemark-sync-data", extra=("--flush", "sync")).start()
        return self._sync

    def version(self) -> str:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version("tidemark")
        except PackageNotFoundError:
            return "dev"

    def settings(self) -> dict[str, str]:
        return {"flush": "async flush: fsync every 500 ms (default)",
                "storage": "commitlog + consume queues on disk, async flush every 500 ms (default)",
                "producer": "Producer.send_async per message, default batching (linger 0, batch 256 KiB, "
                            "5 requests in flight on one Produce stream; a batch under 16 KiB waits while a "
                            "request to its broker is unanswered: natural batching)",
                "consumer": "PushConsumer defaults: one Fetch stream, pull batch 32 per queue per turn, "
                            "20 listener threads, listener batch 1, offsets piggybacked on credit + persisted "
                            "every 5 s",
                "commits": "client-streaming CommitOffsets, 64 commits per CommitStream.write (gathered into messages of up to 1,024 while one is on its way), unfenced",
                "group changes": ("zero-duplicate handover (queue locks), AVG allocation, watch push; the joiner is connected "
                                  "(PushConsumer.connect()) before the clock, as the peers' workers hold their connection")}

    # -- harness-side setup (runs in the harness process) --------------------------------------

    def create_topic(self, topic: str, queues: int) -> None:
        with self._admin() as admin:
            admin.create_topic(topic, queues)

    def prepare_group(self, topic: str, group: str) -> None:
        """Nothing to do: a Tidemark group exists once a consumer of it heartbeats."""


# -- workload roles (each runs in a bench.worker process) -----------------------------------------

def connect_kwargs(spec: dict) -> dict:
    """credentials= and tls= for a client, from a spec made with TidemarkServer.client_spec()."""
    from tidemark.client import TlsSettings
    out: dict = {}
    if spec.get("credentials"):
        out["credentials"] = tuple(spec["credentials"])
    if spec.get("tls_ca_file"):
        out["tls"] = TlsSettings(ca_file=spec["tls_ca_file"])
    return out


class _Acks:
    """Counts send_async answers through callbacks, so the client keeps no future per message."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.ok = self.errors = 0
        self.done = threading.Event()
        self._lock = threading.Lock()

    def expect(self, n: int) -> None:
        with self._lock:
            self.expected = n
            if self.ok + self.errors >= n:
                self.done.set()

    def __call__(self, result, error) -> None:
        with self._lock:
            if error is None:
                self.ok += 1
            else:
                self.errors += 1
            if self.ok + self.errors >= self.expected:
                self.done.set()


def produce(spec: dict, ctl) -> dict:
    """Producer.send_async for every message, then wait for every answer: the producer batches them
    (default settings: linger 0, batch_size 256 KiB, 5 requests in flight, 10,000 messages unanswered,
    idempotent; TIDEMARK_BENCH_IDEMPOTENCE=0 turns idempotence off, to measure what it costs)."""
    from tidemark.client import Message, Producer
    topic, count = spec["topic"], spec["count"]
    acks = _Acks(count)
    idempotent = os.environ.get("TIDEMARK_BENCH_IDEMPOTENCE", "1") != "0"
    with Producer(brokers=spec["address"], enable_idempotence=idempotent, **connect_kwargs(spec)) as producer:
        producer.fetch_publish_message_queues(topic)
        ctl.ready()
        start = ctl.wait_go()
        for i in range(count):
            producer.send_async(Message(topic, payload(i)), acks)
        acks.done.wait(120)
        elapsed = time.monotonic() - start
    return {"count": acks.ok, "errors": acks.errors, "elapsed_s": elapsed, "go": start}


def sync_send(spec: dict, ctl) -> dict:
    """Producer.send one message at a time (p50/p99), then Producer.send_batch of `batch` (msgs/s): the
    synchronous API with default settings (idempotent)."""
    from bench.workloads import round_trips
    from tidemark.client import Message, Producer
    topic, count, batch = spec["topic"], spec["count"], spec["batch"]
    with Producer(brokers=spec["address"], **connect_kwargs(spec)) as producer:
        producer.send(Message(topic, payload(0)))
        ctl.ready()
        ctl.wait_go()
        out = round_trips(lambda: producer.send(Message(topic, payload(0))), count)
        start = time.monotonic()
        batches = max(1, count // batch)
        for n in range(batches):
            producer.send_batch([Message(topic, payload(n * batch + i)) for i in range(batch)])
        out["batch_rate"] = batches * batch / (time.monotonic() - start)
    return {"count": count, **out}


def paced_produce(spec: dict, ctl) -> dict:
    """A fixed rate with Producer.send_async per message: due messages leave at once (linger 0), and
    those that fall due together share a batch."""
    from tidemark.client import Message, Producer
    topic = spec["topic"]
    acks = _Acks(spec["count"])
    with Producer(brokers=spec["address"], **connect_kwargs(spec)) as producer:
        producer.fetch_publish_message_queues(topic)
        ctl.ready()
        ctl.wait_go()
        pacer = Pacer(spec["rate"], spec["count"])

        def acked(result, error, seq: int) -> None:
            acks(result, error)
            if error is None:
                pacer.acked(seq)
        while not ctl.stopped.is_set() and (n := pacer.due()):
            for _ in range(n):
                seq = pacer.sent
                producer.send_async(Message(topic, pacer.next_payload()),
                                    lambda result, error, seq=seq: acked(result, error, seq))
        acks.expect(pacer.sent)
        acks.done.wait(30)
        result = pacer.result()
    return {**result, "errors": acks.errors, "requests": pacer.sent}


def consume(spec: dict, ctl) -> dict:
    from tidemark.client import ConsumeConcurrentlyStatus, ConsumeFromWhere, PushConsumer
    rec = Recorder(latency=spec.get("latency", False), keep_seqs=bool(spec.get("seqs_path")),
                   warmup=spec.get("warmup", 0))
    ctl.progress = lambda: rec.count

    def listener(msgs, ctx):
        rec.record([m.body for m in msgs])
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = PushConsumer(group=spec["group"], brokers=spec["address"], instance_name=spec["instance"],
                            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                            queue_locking=spec.get("queue_locking", True), **connect_kwargs(spec))
    consumer.subscribe(spec["topic"])
    consumer.register_message_listener(listener)
    # Connected before the clock, as the peers' workers hold their connection (bench/peers/redis_streams.py
    # connects before wait_go()): what the clock measures is the join, not opening a process's first channel.
    consumer.connect()
    ctl.ready()
    go = ctl.wait_go()
    consumer.start()
    started = time.monotonic()
    ctl.emit({"started": started})
    consume_until(rec, ctl, spec)
    result = {**rec.result(spec.get("seqs_path"), spec.get("lat_path")), "go": go, "started": started}
    consumer.shutdown()
    return result


def commit(spec: dict, ctl) -> dict:
    """Streaming CommitOffsets: commits_per_queue rounds of one commit per queue, 64 per stream write."""
    from tidemark.client import Message, MessageQueue, Producer
    from tidemark.client.remoting.connection import BrokerConnection
    from tidemark.client.types import OffsetCommit

    topic, nq, per_queue = spec["topic"], spec["queues"], spec["per_queue"]
    if spec.get("prefill"):
        with Producer(brokers=spec["address"]) as producer:
            for q in producer.fetch_publish_message_queues(topic):
                for i in range(0, per_queue, 32):
                    producer.send_batch([Message(topic, payload(i + j)) for j in range(min(32, per_queue - i))],
                                        queue=q)

    async def run() -> dict:
        conn = BrokerConnection(spec["address"], timeout_s=30)
        try:
            await conn.broker_info()
            mqs = [MessageQueue(topic, conn.broker_name, q) for q in range(nq)]
            batches = [[OffsetCommit(spec["group"], mq, offset) for mq in mqs] for offset in range(1, per_queue + 1)]
            # Untimed, as Redis's XGROUP CREATE: the group's first commit registers it (and writes its config).
            first = conn.open_commit_stream(timeout=60)
            await first.write([OffsetCommit(spec["group"], mq, 0) for mq in mqs])
            await first.close()
            ctl.ready()
            start = await asyncio.get_running_loop().run_in_executor(None, ctl.wait_go)
            stream = conn.open_commit_stream(timeout=600)
            for b in batches:
                await stream.write(b)
            summary = await stream.close()
            elapsed = time.monotonic() - start
            return {"count": summary.applied, "rejected": summary.rejected, "elapsed_s": elapsed}
        finally:
            await conn.close()

    return asyncio.run(run())
