"""Helpers for the Spark connector tests: topics, produced messages, streaming runs."""

from __future__ import annotations

import itertools
import os
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from tidemark.client import Admin, Message, MessageQueue, Producer

_names = itertools.count()


@dataclass(frozen=True)
class Sent:
    """What a test produced, in the shape the source returns."""

    queue_id: int
    queue_offset: int
    msg_id: str
    body: bytes
    keys: str | None
    tags: str | None
    properties: tuple[tuple[str, str], ...]


def row_key(row) -> Sent:
    """A Row of the tidemark schema, comparable with Sent."""
    return Sent(row["queue_id"], row["queue_offset"], row["msg_id"], bytes(row["body"]), row["keys"], row["tags"],
                tuple(sorted((row["properties"] or {}).items())))


class Kit:
    def __init__(self, address: str) -> None:
        self.address = address

    def admin(self) -> Admin:
        return Admin(brokers=self.address)

    def topic(self, queues: int = 4, prefix: str = "spark") -> tuple[str, list[MessageQueue]]:
        name = f"{prefix}-{os.getpid()}-{next(_names)}-{uuid.uuid4().hex[:6]}"
        with self.admin() as admin:
            admin.create_topic(name, queues)
            return name, admin.fetch_message_queues(name)

    def produce(self, topic: str, mqs: Sequence[MessageQueue], per_queue: Sequence[int], *,
                tag: Callable[[int, int], str] = lambda q, i: f"tag{i % 3}",
                body_size: int = 0) -> list[Sent]:
        """per_queue[i] messages to mqs[i] with distinct bodies, keys, tags and properties."""
        sent: list[Sent] = []
        with Producer(brokers=self.address) as producer:
            for mq, count in zip(mqs, per_queue, strict=False):
                for first in range(0, count, 256):
                    msgs = []
                    for i in range(first, min(count, first + 256)):
                        body = f"{topic}/{mq.queue_id}/{i}".encode()
                        if body_size:
                            body = body.ljust(body_size, b".")
                        props = {"n": str(i), "q": str(mq.queue_id)} if i % 2 else {}
                        msgs.append(Message(topic, body, tags=tag(mq.queue_id, i), keys=f"k{i} key-{i}",
                                            properties=props))
                    for m, r in zip(msgs, producer.send_batch(msgs, queue=mq), strict=True):
                        sent.append(Sent(mq.queue_id, r.queue_offset, r.msg_id, m.body, m.keys or None,
                                         m.tags or None, tuple(sorted(m.properties.items()))))
        return sent

    def reader(self, spark: SparkSession, topic: str, *, stream: bool = False, **options: str):
        r = (spark.readStream if stream else spark.read).format("tidemark")
        r = r.option("brokers", self.address).option("topic", topic)
        for key, value in options.items():
            r = r.option(key, value)
        return r

    def read(self, spark: SparkSession, topic: str, **options: str) -> DataFrame:
        return self.reader(spark, topic, **options).load()

    def committed(self, group: str, mqs: Sequence[MessageQueue]) -> dict[int, int]:
        with self.admin() as admin:
            return {mq.queue_id: admin.committed(group, mq) for mq in mqs}


@dataclass
class BatchLog:
    """foreachBatch sink: every delivery of every micro-batch (a batch re-run after a restart shows twice)."""

    deliveries: list[tuple[int, list[tuple[int, int, bytes]]]] = field(default_factory=list)

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        rows = [(r.queue_id, r.queue_offset, bytes(r.body)) for r in df.select("queue_id", "queue_offset", "body")
                .collect()]
        self.deliveries.append((batch_id, rows))

    def by_batch(self) -> dict[int, list[tuple[int, int, bytes]]]:
        return dict(self.deliveries)

    def rows(self) -> list[tuple[int, int, bytes]]:
        return [row for rows in self.by_batch().values() for row in rows]


def wait_for(query: StreamingQuery, condition: Callable[[StreamingQuery], bool], timeout: float = 120) -> None:
    """Wait until the query's progress satisfies condition (fails if the query dies or time runs out)."""
    deadline = time.monotonic() + timeout
    while not condition(query):
        if query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
        if not query.isActive:
            raise AssertionError("query stopped before the condition held")
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached in {timeout}s; last progress: {query.lastProgress}")
        query.awaitTermination(0.2)


def base_builder(master: str, app: str) -> SparkSession.Builder:
    return (SparkSession.builder.master(master).appName(app)
            .config("spark.ui.enabled", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.default.parallelism", "2")
            .config("spark.pyspark.python", sys.executable)
            .config("spark.pyspark.driver.python", sys.executable)
            .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
            .config("spark.sql.streaming.stopTimeout", "60s")
            .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=error")
            .config("spark.executor.extraJavaOptions", "-Dlog4j2.level=error"))


def stop_active_session() -> None:
    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    elif SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
