"""tidemark -> Spark -> tidemark, stopped in the middle of a micro-batch and restarted from its checkpoint:
with idempotent writes (the default) the output holds every input message exactly once; without them the
replayed batch writes its rows again."""

from __future__ import annotations

import collections
import time

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType
from workload import stored_messages

from tidemark.client import Admin, Message, Producer

pytestmark = pytest.mark.spark

QUEUES = 4
PER_QUEUE = 600  # more than one send batch (512 messages) per task, so a task can stop after its first


@F.udf(BinaryType())
def slow_copy(body, delay_s):
    time.sleep(delay_s)  # the first run's ~1.2 s per task: it can be stopped while tasks are writing
    return bytes(body)


def output_count(address: str, topic: str) -> int:
    with Admin(brokers=address) as admin:
        mqs = admin.fetch_message_queues(topic)
        return sum(high - low for low, high in admin.offsets(mqs).values())


def keys_written(address: str, topic: str) -> collections.Counter:
    return collections.Counter(m.keys for m in stored_messages(address, topic))


def run_pipeline(spark, kit, tmp_path, *, idempotent: bool) -> tuple[int, collections.Counter]:
    source, mqs = kit.topic(QUEUES, prefix="eo-in")
    sink, _ = kit.topic(QUEUES, prefix="eo-out")
    with Producer(brokers=kit.address) as producer:
        for mq in mqs:
            producer.send_batch([Message(source, b"x", keys=f"k{mq.queue_id}-{i}") for i in range(PER_QUEUE)],
                                queue=mq)
    checkpoint = str(tmp_path / f"checkpoint-{idempotent}")

    def start(delay_s: float):
        # minPartitions: a task per queue (4 tasks, two waves of local[2]) whatever the task slots, so the
        # second wave has not written when the first wave's output stops the query.
        frame = (kit.reader(spark, source, stream=True, startingOffsets="earliest", minPartitions=str(QUEUES)).load()
                 .select(slow_copy("body", F.lit(delay_s)).alias("body"), "keys"))
        return (frame.writeStream.format("tidemark").option("brokers", kit.address).option("topic", sink)
                .option("idempotent", str(idempotent).lower()).option("checkpointLocation", checkpoint)
                .trigger(availableNow=True).start())

    query = start(0.002)
    deadline = time.monotonic() + 120
    while output_count(kit.address, sink) < 512:  # a first task's first send landed
        assert query.isActive and time.monotonic() < deadline, f"no output: {query.exception()}"
        time.sleep(0.02)
    query.stop()  # mid-batch: the batch is in the offset log, not in the commit log
    at_stop = output_count(kit.address, sink)
    assert 0 < at_stop < QUEUES * PER_QUEUE, f"the query was not stopped mid-batch ({at_stop} written)"
    replay = start(0.0)  # the same rows, at full speed
    assert replay.awaitTermination(120), "the restarted query did not finish"
    assert replay.exception() is None
    return at_stop, keys_written(kit.address, sink)


def test_a_replayed_micro_batch_is_written_exactly_once(spark, kit, tmp_path):
    at_stop, counts = run_pipeline(spark, kit, tmp_path, idempotent=True)
    expected = {f"k{q}-{i}" for q in range(QUEUES) for i in range(PER_QUEUE)}
    duplicates = sum(c - 1 for c in counts.values())
    print(f"\nexactly-once sink: {at_stop} messages written before the stop, "
          f"{sum(counts.values())} in the end, {duplicates} duplicates")
    assert set(counts) == expected
    assert duplicates == 0


def test_without_idempotent_writes_the_replay_duplicates(spark, kit, tmp_path):
    """The baseline: what the mechanism removes (the test of the mechanism can fail)."""
    at_stop, counts = run_pipeline(spark, kit, tmp_path, idempotent=False)
    duplicates = sum(c - 1 for c in counts.values())
    print(f"\nat-least-once sink (idempotent=false): {at_stop} messages written before the stop, "
          f"{duplicates} duplicates after the replay")
    assert set(counts) == {f"k{q}-{i}" for q in range(QUEUES) for i in range(PER_QUEUE)}
    assert duplicates >= 512
