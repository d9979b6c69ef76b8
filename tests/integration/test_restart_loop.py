"""A group consumer rides through a loop of broker kill -9 and restart (issue 14, items 8 and 10).

One `tidemark consume --group` process reads a topic while the broker (sync flush) is killed with
SIGKILL and started again on the same port, a dozen times, at random points. Its stdout is a pipe
the test reads at a bounded pace, so consumption spans the whole loop (a printed line is an
acknowledged message, even while it waits in the pipe).

What must hold:
- the consumer process never exits by itself, and every message is consumed at least once;
- the group's committed offsets read right after a restart are never behind those read before the
  kill (the broker's offset journal keeps every applied commit across kill -9);
- re-deliveries stay near what was in flight at each kill: the broker's offsets no longer fall back
  to the last 5 s snapshot, and a consumer that gets its queue back keeps its own further position.
  (Before the journal: several re-deliveries per message.)
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

from brokerproc import BrokerProcess, orphan_safe
from workload import create_topic, produce, wait_until

from tidemark.client import Admin
from tidemark.client.errors import RequestTimeoutError, UnavailableError

MESSAGES = 3000
QUEUES = 4
RESTARTS = 15
# Lines per second the test takes from the consumer's stdout: consumption then spans the restarts.
READ_RATE = 250.0
# Re-deliveries allowed per message (the old behaviour: more than 5 per message).
MAX_REDELIVERY_RATE = 0.2


class PacedReader(threading.Thread):
    """Reads JSON lines from the consumer's stdout at READ_RATE lines per second."""

    def __init__(self, stream) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.docs: list[dict] = []
        self.lock = threading.Lock()

    def run(self) -> None:
        started = time.monotonic()
        for n, line in enumerate(self.stream, 1):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                self.docs.append(doc)
            ahead = started + n / READ_RATE - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)  # pacing the reader, not waiting for a condition

    def ids(self) -> list[str]:
        with self.lock:
            return [d["msg_id"] for d in self.docs]


def committed(address: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets; asks again while a busy, just started broker does not answer."""
    answer: dict[int, int] = {}

    def ask() -> bool:
        try:
            with Admin(brokers=address, request_timeout_s=5.0) as admin:
                answer.update({s.queue.queue_id: s.consumer_offset for s in admin.consume_stats(group, topic)})
            return True
        except (UnavailableError, RequestTimeoutError):
            return False

    wait_until(ask, 60, f"committed offsets from {address}", interval=0.2)
    return answer


def lag(address: str, group: str, topic: str) -> int:
    with Admin(brokers=address, request_timeout_s=5.0) as admin:
        return sum(s.lag for s in admin.consume_stats(group, topic))


def test_group_consumer_rides_through_broker_kill_9_loop(tmp_path: Path):
    seed = int(os.environ.get("RESTART_LOOP_SEED", time.time_ns() % 10_000))
    rng = random.Random(seed)
    broker = BrokerProcess(tmp_path / "data", args=("--flush", "sync")).start()
    consumer = None
    try:
        create_topic(broker.address, "Loop", QUEUES)
        ids = produce(broker.address, "Loop", MESSAGES)
        consumer = subprocess.Popen(
            orphan_safe([sys.executable, "-m", "tidemark.client.cli.main", "consume", "Loop", "--group", "loop",
                         "--from-where", "first", "--broker", broker.address]),
            stdout=subprocess.PIPE, stderr=open(tmp_path / "consumer.err", "wb"), text=True, bufsize=1)
        reader = PacedReader(consumer.stdout)
        reader.start()
        wait_until(lambda: len(reader.ids()) >= 50, 60, "the consumer to get going")

        backwards = []
        for _ in range(RESTARTS):
            time.sleep(rng.uniform(0.3, 2.0))  # the broker's lifetime (the kill point), not a wait
            before = committed(broker.address, "loop", "Loop")
            broker.kill()
            assert consumer.poll() is None, "the consumer exited while the broker was down"
            broker.start()
            after = committed(broker.address, "loop", "Loop")
            backwards += [(q, before[q], after[q]) for q in before if after[q] < before[q]]
            assert consumer.poll() is None, "the consumer exited across a broker restart"

        wait_until(lambda: set(reader.ids()) >= set(ids) or consumer.poll() is not None, 90,
                   "every message consumed")
        assert consumer.poll() is None, f"the consumer exited: {(tmp_path / 'consumer.err').read_text()[-2000:]}"
        assert set(reader.ids()) >= set(ids), "messages were lost"
        wait_until(lambda: lag(broker.address, "loop", "Loop") == 0, 30, "the group's lag to reach 0")

        seen = reader.ids()
        redelivered = len(seen) - len(set(seen))
        print(f"seed {seed}: {MESSAGES} messages, {RESTARTS} broker kill -9 restarts, {len(seen)} deliveries, "
              f"{redelivered} re-deliveries ({redelivered / MESSAGES:.3f} per message)")
        assert not backwards, f"committed offsets went backwards across a restart (queue, before, after): {backwards}"
        assert redelivered <= MAX_REDELIVERY_RATE * MESSAGES, f"{redelivered} re-deliveries (seed {seed})"
    finally:
        if consumer is not None and consumer.poll() is None:
            consumer.kill()
            consumer.wait()
        broker.kill()


def test_group_consumer_started_while_the_broker_is_down_waits_for_it(tmp_path: Path):
    broker = BrokerProcess(tmp_path / "data").start()
    consumer = None
    err = tmp_path / "consumer.err"
    try:
        create_topic(broker.address, "Late", 2)
        ids = produce(broker.address, "Late", 100)
        broker.kill()
        consumer = subprocess.Popen(
            orphan_safe([sys.executable, "-m", "tidemark.client.cli.main", "consume", "Late", "--group", "late",
                         "--from-where", "first", "--timeout", "1", "--broker", broker.address]),
            stdout=subprocess.PIPE, stderr=open(err, "wb"), text=True, bufsize=1)
        wait_until(lambda: consumer.poll() is not None or "retrying" in err.read_text(), 30,
                   "the consumer to find no broker")
        assert consumer.poll() is None, f"the consumer gave up: {err.read_text()[-2000:]}"
        broker.start()
        reader = PacedReader(consumer.stdout)
        reader.start()
        wait_until(lambda: set(reader.ids()) >= set(ids) or consumer.poll() is not None, 60,
                   "every message consumed")
        assert consumer.poll() is None and set(reader.ids()) >= set(ids)
    finally:
        if consumer is not None and consumer.poll() is None:
            consumer.kill()
            consumer.wait()
        broker.kill()


def test_record_reader_reads_on_through_a_broker_restart(tmp_path: Path):
    from tidemark.client.consumer.record_reader import RecordReader
    from tidemark.client.message import MessageQueue

    broker = BrokerProcess(tmp_path / "data", args=("--flush", "sync")).start()
    try:
        create_topic(broker.address, "Range", 1)
        produce(broker.address, "Range", 100)
        mq = MessageQueue("Range", "broker-a", 0)
        got = 0
        restarted = False
        with RecordReader(brokers=broker.address, request_timeout_s=2.0) as reader:
            for chunk in reader.read(mq, 0, 200, poll_timeout_s=0.2):
                if chunk is not None:
                    got = chunk.next_offset
                if got >= 100 and not restarted:
                    # The first half is read; the reader now waits for the rest across a kill -9.
                    broker.kill()
                    broker.start()
                    produce(broker.address, "Range", 100)
                    restarted = True
        assert restarted and got == 200
    finally:
        broker.kill()
