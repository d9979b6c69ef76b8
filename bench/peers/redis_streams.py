"""Redis Streams in the peer benchmark: XADD, XREADGROUP, XACK through redis-py (with hiredis).

Server: Debian's redis-server with appendonly yes + appendfsync everysec, the
durable setting Redis's persistence docs recommend (fsync once a second).
RDB snapshots and automatic AOF rewrites are switched off: both fork the
server in the background, which on a shared 2-core machine would slow down
whichever other system is being measured at that moment.
A Tidemark topic maps to one stream; a queue (workload 3) to one stream each.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from bench.procs import Server, free_port, server_version, wait_port
from bench.workloads import Pacer, Recorder, consume_until, payload

NAME = "Redis Streams"
FIELD = b"d"
READ_COUNT = 32
ACK_PIPELINE = 1024


class RedisServer:
    name = NAME

    def __init__(self, workdir: Path, binary: str = "redis-server") -> None:
        self.binary = binary
        self.port = free_port()
        data = workdir / "redis-data"
        data.mkdir(parents=True, exist_ok=True)
        self.args = {"bind": "127.0.0.1", "port": str(self.port), "dir": str(data), "appendonly": "yes",
                     "appendfsync": "everysec", "save": "", "auto-aof-rewrite-percentage": "0",
                     "daemonize": "no", "logfile": "", "protected-mode": "yes"}
        command = [binary] + [x for k, v in self.args.items() for x in (f"--{k}", v)]
        self.server = Server("redis-server", command, workdir / "redis.log")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> RedisServer:
        self.server.start()
        wait_port(self.port, 30, self.server.proc, "redis-server")
        return self

    def stop(self) -> None:
        self.server.stop()

    def version(self) -> str:
        return server_version(self.binary)

    def settings(self) -> dict[str, str]:
        shown = " ".join(f"{k} {v or chr(34) * 2}" for k, v in self.args.items()
                         if k in ("appendonly", "appendfsync", "save", "auto-aof-rewrite-percentage"))
        return {"flush": "AOF, appendfsync everysec (its durable default)",
                "storage": f"AOF, fsync every second ({shown})",
                "producer": "pipeline of 32 XADD per round trip (transaction=False), hiredis parser",
                "consumer": f"XREADGROUP COUNT {READ_COUNT} BLOCK 500, then one XACK of the batch's ids",
                "commits": f"one XACK per message id, {ACK_PIPELINE} commands per pipeline round trip",
                "group changes": "none needed: a new consumer name reads '>' at once"}

    def _client(self):
        import redis
        return redis.Redis(host="127.0.0.1", port=self.port)

    def create_topic(self, topic: str, queues: int) -> None:
        """Streams are created by the first XADD (or by XGROUP CREATE ... MKSTREAM)."""

    def prepare_group(self, topic: str, group: str) -> None:
        with self._client() as r:
            r.xgroup_create(topic, group, id="0", mkstream=True)

    def cleanup(self, topic: str) -> None:
        with self._client() as r:
            r.delete(topic)


def _connect(spec: dict):
    import redis
    host, port = spec["address"].rsplit(":", 1)
    return redis.Redis(host=host, port=int(port))


# -- workload roles ---------------------------------------------------------------------------------

def produce(spec: dict, ctl) -> dict:
    r = _connect(spec)
    topic, count, batch = spec["topic"], spec["count"], spec["batch"]
    r.ping()
    ctl.ready()
    start = ctl.wait_go()
    sent = 0
    while sent < count:
        k = min(batch, count - sent)
        pipe = r.pipeline(transaction=False)
        for i in range(k):
            pipe.xadd(topic, {FIELD: payload(sent + i)})
        pipe.execute()
        sent += k
    elapsed = time.monotonic() - start
    r.close()
    return {"count": sent, "elapsed_s": elapsed}


def sync_send(spec: dict, ctl) -> dict:
    """One XADD per round trip (p50/p99), then pipelines of `batch` XADD (msgs/s)."""
    from bench.workloads import round_trips
    r = _connect(spec)
    topic, count, batch = spec["topic"], spec["count"], spec["batch"]
    r.ping()
    ctl.ready()
    ctl.wait_go()
    out = round_trips(lambda: r.xadd(topic, {FIELD: payload(0)}), count)
    start = time.monotonic()
    batches = max(1, count // batch)
    for n in range(batches):
        pipe = r.pipeline(transaction=False)
        for i in range(batch):
            pipe.xadd(topic, {FIELD: payload(n * batch + i)})
        pipe.execute()
    out["batch_rate"] = batches * batch / (time.monotonic() - start)
    r.close()
    return {"count": count, **out}


def paced_produce(spec: dict, ctl) -> dict:
    """XADD one per message at a fixed rate; the messages due at one instant share a pipeline."""
    r = _connect(spec)
    topic = spec["topic"]
    r.ping()
    ctl.ready()
    ctl.wait_go()
    pacer = Pacer(spec["rate"], spec["count"])
    while n := pacer.due():
        pipe = r.pipeline(transaction=False)
        first = pacer.sent
        for _ in range(n):
            pipe.xadd(topic, {FIELD: pacer.next_payload()})
        pipe.execute()
        for seq in range(first, first + n):
            pacer.acked(seq)
    r.close()
    return {**pacer.result(), "errors": 0}


def consume(spec: dict, ctl) -> dict:
    rec = Recorder(latency=spec.get("latency", False), keep_seqs=bool(spec.get("seqs_path")),
                   warmup=spec.get("warmup", 0))
    ctl.progress = lambda: rec.count
    r = _connect(spec)
    topic, group, me = spec["topic"], spec["group"], spec["instance"]
    r.ping()
    ctl.ready()
    go = ctl.wait_go()
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            reply = r.xreadgroup(group, me, {topic: ">"}, count=READ_COUNT, block=500)
            for _stream, entries in reply or ():
                if entries:
                    rec.record([fields[FIELD] for _id, fields in entries])
                    r.xack(topic, group, *[entry_id for entry_id, _ in entries])

    thread = threading.Thread(target=loop, name="redis-consumer", daemon=True)
    started = time.monotonic()
    thread.start()
    ctl.emit({"started": started})
    consume_until(rec, ctl, spec)
    result = {**rec.result(spec.get("seqs_path"), spec.get("lat_path")), "go": go, "started": started}
    done.set()
    thread.join(5)
    r.close()
    return result


def commit(spec: dict, ctl) -> dict:
    """XACK of real pending entries: one stream per queue, one id per XACK, pipelined."""
    r = _connect(spec)
    nq, per_queue, group = spec["queues"], spec["per_queue"], spec["group"]
    streams = [f"{spec['topic']}:{q}" for q in range(nq)]
    if spec.get("prefill"):
        for s in streams:
            for i in range(0, per_queue, 32):
                pipe = r.pipeline(transaction=False)
                for j in range(min(32, per_queue - i)):
                    pipe.xadd(s, {FIELD: payload(i + j)})
                pipe.execute()
    ids: list[list[bytes]] = []
    for s in streams:  # untimed: put every entry into the group's pending list
        r.xgroup_create(s, group, id="0")
        got = r.xreadgroup(group, "acker", {s: ">"}, count=per_queue)
        ids.append([entry_id for entry_id, _ in got[0][1]])
    ctl.ready()
    start = ctl.wait_go()
    acked = 0
    pipe = r.pipeline(transaction=False)
    for i in range(per_queue):
        for q, s in enumerate(streams):
            pipe.xack(s, group, ids[q][i])
        if len(pipe) >= ACK_PIPELINE:
            acked += sum(pipe.execute())
            pipe = r.pipeline(transaction=False)
    if len(pipe):
        acked += sum(pipe.execute())
    elapsed = time.monotonic() - start
    r.close()
    return {"count": acked, "rejected": nq * per_queue - acked, "elapsed_s": elapsed}
