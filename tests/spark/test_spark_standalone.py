"""The read / stream / commit path on a real Spark standalone cluster (master + worker processes).

The master and the worker come from the installed pyspark (SPARK_HOME is the
package directory), listen on 127.0.0.1 with free ports, and run in their own
process group, which is killed at the end (PR_SET_PDEATHSIG as well, so they
never outlive the test run). Executors run this interpreter (PYSPARK_PYTHON).

One SparkContext per JVM: conftest orders this module last; its fixture stops
the shared local session, builds one on spark://..., and stops it afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from brokerproc import free_port, orphan_safe
from spark_testlib import BatchLog, Kit, base_builder, row_key, stop_active_session

from tidemark import spark_connector

pytestmark = [pytest.mark.spark, pytest.mark.slow]


SPARK_HOME = Path(pyspark.__file__).parent


class Daemon:
    """A spark-class process in its own process group (killed as a group); log in a file."""

    def __init__(self, name: str, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.log = log
        spark_class = str(SPARK_HOME / "bin" / "spark-class")
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(orphan_safe([spark_class, *args]),
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)
        self.name = name

    def wait_for(self, text: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log.read_text("utf-8", "replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"spark {self.name} did not log {text!r}:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        # Executors and Python workers started by the worker share its group: make sure none is left.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("spark-standalone")
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1",
           "SPARK_WORKER_DIR": str(tmp / "work"), "SPARK_LOG_DIR": str(tmp / "logs")}
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    master = Daemon("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                               "--webui-port", str(free_port())], tmp / "master.log", env)
    daemons = [master]
    try:
        master.wait_for("I have been elected leader")
        worker = Daemon("worker", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                   "--port", str(free_port()), "--webui-port", str(free_port()),
                                   "--cores", "1", "--memory", "1g", url], tmp / "worker.log", env)
        daemons.append(worker)
        worker.wait_for("Successfully registered with master")
        yield url
    finally:
        for d in reversed(daemons):
            d.stop()


@pytest.fixture(scope="module")
def cluster_spark(cluster):
    stop_active_session()
    spark = (base_builder(cluster, "tidemark-standalone-tests")
             .config("spark.executor.memory", "512m").config("spark.cores.max", "1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark_connector.register(spark)
    deadline = time.monotonic() + 90
    while _executors(spark) < 1 and time.monotonic() < deadline:  # executors register asynchronously
        time.sleep(0.2)
    yield spark
    spark.stop()


def _executors(spark) -> int:
    """Executors besides the driver."""
    return len(spark.sparkContext.statusTracker().getExecutorInfos()) - 1


def test_runs_on_a_standalone_cluster(cluster_spark):
    assert cluster_spark.sparkContext.master.startswith("spark://127.0.0.1:")
    assert _executors(cluster_spark) == 1  # the worker's executor
    pids = cluster_spark.sparkContext.parallelize(range(2), 2).map(lambda _: os.getppid()).collect()
    assert os.getpid() not in pids  # Python ran under the executor, not in this driver


def test_batch_read_on_cluster(cluster_spark, module_broker):
    kit = Kit(module_broker.address)
    topic, mqs = kit.topic(3)
    sent = kit.produce(topic, mqs, [40, 25, 10])
    rows = kit.read(cluster_spark, topic, minPartitions="4").collect()
    assert sorted(map(row_key, rows), key=lambda s: (s.queue_id, s.queue_offset)) == \
        sorted(sent, key=lambda s: (s.queue_id, s.queue_offset))


def test_stream_and_commit_on_cluster(cluster_spark, module_broker, tmp_path):
    kit = Kit(module_broker.address)
    topic, mqs = kit.topic(2)
    kit.produce(topic, mqs, [60, 40])
    group = f"{topic}-g"
    log = BatchLog()
    q = (kit.reader(cluster_spark, topic, stream=True, group=group, startingOffsets="earliest",
                    maxOffsetsPerTrigger="50").load()
         .writeStream.foreachBatch(log).option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(availableNow=True).start())
    q.awaitTermination(180)
    assert q.exception() is None
    assert all(len(rows) <= 50 for _, rows in log.deliveries)
    assert sorted((r[0], r[1]) for r in log.rows()) == sorted([(0, o) for o in range(60)] + [(1, o) for o in range(40)])
    end = json.loads(q.lastProgress["sources"][0]["endOffset"])[topic]["broker-a"]
    assert kit.committed(group, mqs) == {int(k): v for k, v in end.items()} == {0: 60, 1: 40}
