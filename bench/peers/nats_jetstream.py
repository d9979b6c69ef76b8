"""NATS JetStream in the peer benchmark: file storage, a durable pull consumer, explicit acks (nats-py).

Server: Debian's nats-server with -js and a store dir in the run's temp dir.
JetStream's file store writes every message to its block file at once and
leaves fsync to the OS, syncing on its own timer (every 2 minutes in 2.9):
that is its default flush policy. One stream per topic (R1, limits
retention); a queue (workload 3) is one subject of a stream.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from bench.procs import Server, free_port, server_version, wait_port
from bench.workloads import Pacer, Recorder, payload

NAME = "NATS JetStream"
FETCH_BATCH = 32
MAX_ACK_PENDING = 20_000


class NatsServer:
    name = NAME

    def __init__(self, workdir: Path, binary: str = "nats-server") -> None:
        self.binary = binary
        self.port = free_port()
        store = workdir / "nats-store"
        store.mkdir(parents=True, exist_ok=True)
        self.server = Server("nats-server", [binary, "-a", "127.0.0.1", "-p", str(self.port), "-js",
                                             "-sd", str(store)], workdir / "nats.log")

    @property
    def address(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> NatsServer:
        self.server.start()
        wait_port(self.port, 30, self.server.proc, "nats-server")
        self.server.wait_log(r"Server is ready", 30)
        return self

    def stop(self) -> None:
        self.server.stop()

    def version(self) -> str:
        return server_version(self.binary)

    def settings(self) -> dict[str, str]:
        return {"flush": "file store; fsync every 2 min (default sync interval)",
                "storage": "JetStream file store, R1, limits retention; writes go to the OS page cache at once, "
                           "fsync on the server's sync timer (2 min by default)",
                "producer": "js.publish_async (no batch publish in JetStream), up to 4000 acks outstanding",
                "consumer": f"durable pull consumer, ack explicit, max_ack_pending {MAX_ACK_PENDING}, "
                            f"fetch({FETCH_BATCH}), msg.ack() per message",
                "commits": "msg.ack() per message (fire-and-forget publish), timed until the consumer "
                           "reports no ack pending",
                "group changes": "none needed: another pull subscriber of the durable fetches at once"}

    def _run(self, coro):
        return asyncio.run(coro)

    def create_topic(self, topic: str, queues: int) -> None:
        async def go() -> None:
            import nats
            from nats.js.api import StorageType, StreamConfig
            nc = await nats.connect(self.address)
            try:
                await nc.jetstream().add_stream(StreamConfig(name=topic, subjects=[f"{topic}.>"],
                                                             storage=StorageType.FILE, num_replicas=1))
            finally:
                await nc.close()
        self._run(go())

    def prepare_group(self, topic: str, group: str) -> None:
        async def go() -> None:
            import nats
            nc = await nats.connect(self.address)
            try:
                await nc.jetstream().add_consumer(topic, _consumer_config(group))
            finally:
                await nc.close()
        self._run(go())

    def cleanup(self, topic: str) -> None:
        async def go() -> None:
            import nats
            nc = await nats.connect(self.address)
            try:
                await nc.jetstream().delete_stream(topic)
            finally:
                await nc.close()
        self._run(go())


def _consumer_config(group: str, max_ack_pending: int = MAX_ACK_PENDING):
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
    return ConsumerConfig(durable_name=group, ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL,
                          max_ack_pending=max_ack_pending)


async def _wait_go(ctl) -> float:
    return await asyncio.get_running_loop().run_in_executor(None, ctl.wait_go)


async def _publish_all(js, subject_of, count: int, first_seq: int = 0) -> int:
    futures = [await js.publish_async(subject_of(i), payload(first_seq + i)) for i in range(count)]
    await js.publish_async_completed()
    return sum(1 for f in futures if f.exception() is not None)


# -- workload roles ---------------------------------------------------------------------------------

def produce(spec: dict, ctl) -> dict:
    async def run() -> dict:
        import nats
        nc = await nats.connect(spec["address"])
        js = nc.jetstream()
        subject = f"{spec['topic']}.m"
        ctl.ready()
        start = await _wait_go(ctl)
        errors = await _publish_all(js, lambda i: subject, spec["count"])
        elapsed = time.monotonic() - start
        await nc.close()
        return {"count": spec["count"] - errors, "errors": errors, "elapsed_s": elapsed}
    return asyncio.run(run())


def paced_produce(spec: dict, ctl) -> dict:
    async def run() -> dict:
        import nats
        nc = await nats.connect(spec["address"])
        js = nc.jetstream()
        subject = f"{spec['topic']}.m"
        ctl.ready()
        await _wait_go(ctl)
        pacer = Pacer(spec["rate"], spec["count"])
        futures = []
        while n := await pacer.adue():
            for _ in range(n):
                seq = pacer.sent
                future = await js.publish_async(subject, pacer.next_payload())
                future.add_done_callback(lambda f, seq=seq: not f.cancelled() and f.exception() is None
                                           and pacer.acked(seq))
                futures.append(future)
        result = pacer.result()
        await js.publish_async_completed()
        await nc.close()
        return {**result, "errors": sum(1 for f in futures if f.exception() is not None)}
    return asyncio.run(run())


def consume(spec: dict, ctl) -> dict:
    rec = Recorder(latency=spec.get("latency", False), keep_seqs=bool(spec.get("seqs_path")),
                   warmup=spec.get("warmup", 0))
    ctl.progress = lambda: rec.count

    async def run() -> dict:
        import nats
        from nats.errors import TimeoutError as NatsTimeout
        nc = await nats.connect(spec["address"])
        js = nc.jetstream()
        ctl.ready()
        go = await _wait_go(ctl)
        sub = await js.pull_subscribe_bind(spec["group"], spec["topic"])
        started = time.monotonic()
        ctl.emit({"started": started})
        deadline = started + spec.get("timeout_s", 120)
        idle_s, expect = spec.get("idle_s"), spec.get("expect")
        while time.monotonic() < deadline and not ctl.stopped.is_set():
            if (expect and rec.count >= expect) or (idle_s and rec.count and rec.idle_for() >= idle_s):
                break
            try:
                msgs = await sub.fetch(FETCH_BATCH, timeout=0.5)
            except (TimeoutError, NatsTimeout):
                continue
            rec.record([m.data for m in msgs])
            for m in msgs:
                await m.ack()
        result = {**rec.result(spec.get("seqs_path"), spec.get("lat_path")), "go": go, "started": started}
        await nc.flush()
        await nc.close()
        return result
    return asyncio.run(run())


def commit(spec: dict, ctl) -> dict:
    """Acks of real delivered messages: one subject per queue, all fetched (untimed) before acking."""
    async def run() -> dict:
        import nats
        from nats.js.api import StorageType, StreamConfig
        nq, per_queue, topic, group = spec["queues"], spec["per_queue"], spec["topic"], spec["group"]
        total = nq * per_queue
        nc = await nats.connect(spec["address"])
        js = nc.jetstream()
        if spec.get("prefill"):
            await js.add_stream(StreamConfig(name=topic, subjects=[f"{topic}.>"], storage=StorageType.FILE,
                                             num_replicas=1))
            await _publish_all(js, lambda i: f"{topic}.q{i % nq}", total)
        await js.add_consumer(topic, _consumer_config(group, total + 1000))
        sub = await js.pull_subscribe_bind(group, topic)
        msgs = []
        while len(msgs) < total:
            msgs.extend(await sub.fetch(min(1000, total - len(msgs)), timeout=10))
        ctl.ready()
        start = await _wait_go(ctl)
        for m in msgs:
            await m.ack()
        await nc.flush()
        while (await js.consumer_info(topic, group)).num_ack_pending:
            await asyncio.sleep(0.001)
        elapsed = time.monotonic() - start
        await nc.close()
        return {"count": len(msgs), "rejected": 0, "elapsed_s": elapsed}
    return asyncio.run(run())
