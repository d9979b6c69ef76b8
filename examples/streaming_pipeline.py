"""Example pipeline: produce events, aggregate them with Spark Structured Streaming, watch the lag drain.

    python examples/streaming_pipeline.py --brokers 127.0.0.1:10911       # a running broker (make run)
    python examples/streaming_pipeline.py --start-broker                  # or start a throwaway one
    python examples/streaming_pipeline.py --namesrv 127.0.0.1:9876        # brokers found through name servers

1. Produces --events JSON events ({"user": ..., "kind": "click"|"buy", "amount": ...}) to a topic.
2. Runs a streaming aggregation (count and sum of amount per kind) over format("tidemark") with a
   checkpoint, maxOffsetsPerTrigger and Trigger.AvailableNow. The source commits each finished
   micro-batch's end offsets to the consumer group, like any consumer.
3. Prints the group's lag (Admin.consume_stats) while the query runs, until it reaches zero,
   then `tidemark group progress GROUP` and the aggregate.

Run it again with the same --checkpoint (or a new one: startingOffsets=committed picks up from the
group) and only the new events are read.

Against brokers with TLS and auth (docker-compose.yml), every client here takes its credentials and CA
from TIDEMARK_ACCESS_KEY, TIDEMARK_SECRET_KEY and TIDEMARK_TLS_CA_FILE, and the Spark source gets them
as options (accessKey, secretKey, tlsCaFile), since its executors may run in another process or host.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tidemark.client import Admin, AlreadyExistsError, Message, NotFoundError, Producer
from tidemark.client.cli.main import main as tidemark_cli
from tidemark.client.security import credentials_from_env, tls_from_env


def produce(where: dict[str, str], topic: str, events: int) -> None:
    rng = random.Random(7)
    with Producer(**where) as producer:
        batch = []
        for i in range(events):
            kind = "buy" if rng.random() < 0.2 else "click"
            event = {"user": f"user-{rng.randrange(50)}", "kind": kind, "amount": rng.randrange(1, 100), "seq": i}
            batch.append(Message(topic, json.dumps(event).encode(), tags=kind, keys=event["user"]))
            if len(batch) == 200:
                producer.send_batch(batch)  # one batch per queue, queues round-robin
                batch = []
        if batch:
            producer.send_batch(batch)
    print(f"produced {events} events to {topic}")


def lag(where: dict[str, str], group: str, topic: str) -> tuple[int, str]:
    with Admin(**where) as admin:
        try:
            stats = admin.consume_stats(group, topic)
        except NotFoundError:  # nothing committed yet: the whole backlog
            offsets = admin.offsets(admin.fetch_message_queues(topic))
            return sum(hi - lo for lo, hi in offsets.values()), "no offsets committed yet"
    total = sum(s.lag for s in stats)
    return total, "  ".join(f"q{s.queue.queue_id}: {max(s.consumer_offset, 0)}/{s.max_offset}" for s in stats)


def progress(where: dict[str, str], group: str, topic: str) -> None:
    flag, value = ("--namesrv", where["namesrv"]) if "namesrv" in where else ("--broker", where["brokers"])
    argv = ["group", "progress", group, flag, value, "--topic", topic]
    print("$ tidemark " + " ".join(argv))
    tidemark_cli(argv)


def security_options() -> dict[str, str]:
    """The source's credential and TLS options, from the same environment the other clients here read:
    executors read options, not the driver's environment. The CA path must exist where they run."""
    options = {}
    credentials = credentials_from_env()
    if credentials is not None:
        options.update(accessKey=credentials.access_key, secretKey=credentials.secret_key)
    tls = tls_from_env()
    if tls is not None:
        options["tls"] = "true"
        for option, path in (("tlsCaFile", tls.ca_file), ("tlsCertFile", tls.cert_file), ("tlsKeyFile", tls.key_file)):
            if path:
                options[option] = path
    return options


def run_pipeline(where: dict[str, str], topic: str, group: str, checkpoint: str, per_trigger: int, *,
                 master: str, driver_host: str) -> int:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from tidemark import spark_connector

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(master).appName("tidemark-demo")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.host", driver_host).config("spark.driver.bindAddress", driver_host)
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark_connector.register(spark)

    events = (spark.readStream.format("tidemark")
              .options(**where).option("topic", topic).option("group", group)
              .option("startingOffsets", "committed").option("maxOffsetsPerTrigger", str(per_trigger))
              .options(**security_options())
              .load()
              .select(F.from_json(F.col("body").cast("string"), "user string, kind string, amount int").alias("e"))
              .select("e.*"))
    totals = events.groupBy("kind").agg(F.count("*").alias("events"), F.sum("amount").alias("amount"))
    query = (totals.writeStream.outputMode("complete").format("memory").queryName("totals_by_kind")
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())

    shown = None
    while query.isActive:
        query.awaitTermination(1)
        total, detail = lag(where, group, topic)
        if (total, detail) != shown:
            print(f"group {group} lag {total:>6}   {detail}")
            shown = (total, detail)
    if query.exception() is not None:
        print(f"query failed: {query.exception()}", file=sys.stderr)
        return 1
    total, detail = lag(where, group, topic)
    print(f"group {group} lag {total:>6}   {detail}   (query finished after "
          f"{len(query.recentProgress)} micro-batches)")
    progress(where, group, topic)
    spark.sql("select * from totals_by_kind order by kind").show()
    spark.stop()
    return 0 if total == 0 else 1


def start_broker(data_dir: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(data_dir.parent / "broker.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "tidemark.broker.app", "--data-dir", str(data_dir), "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while b"event=broker_ready" not in (data_dir.parent / "broker.log").read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"broker did not start:\n{(data_dir.parent / 'broker.log').read_text()[-2000:]}")
        time.sleep(0.1)
    return proc, f"127.0.0.1:{port}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--brokers", default=os.environ.get("TIDEMARK_BROKER", "127.0.0.1:10911"))
    parser.add_argument("--namesrv", default=os.environ.get("TIDEMARK_NAMESRV", ""),
                        help="name servers host:port[,host:port]: the brokers are found through them")
    parser.add_argument("--start-broker", action="store_true", help="run a throwaway broker in a temp dir")
    parser.add_argument("--topic", default="demo-events")
    parser.add_argument("--group", default="demo-pipeline")
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--seed-once", action="store_true",
                        help="produce the events only when this run creates the topic (a job run again, as "
                             "`docker-compose start` does, then adds nothing)")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=1000)
    parser.add_argument("--checkpoint", default=None, help="default: a new temp dir (the group's offsets remain)")
    parser.add_argument("--master", default="local[2]", help="Spark master URL, e.g. spark://spark-master:7077")
    parser.add_argument("--driver-host", default="127.0.0.1",
                        help="address executors use to reach this driver (the job's host name in compose)")
    args = parser.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="tidemark-demo-"))
    broker = None
    try:
        if args.start_broker:
            broker, args.brokers = start_broker(scratch / "data")
            args.namesrv = ""
            print(f"started a broker at {args.brokers} (data in {scratch / 'data'})")
        # How every client here finds the brokers: the name servers when given, else the broker list.
        where = {"namesrv": args.namesrv} if args.namesrv else {"brokers": args.brokers}
        created = False
        with Admin(**where) as admin:
            try:
                admin.create_topic(args.topic, 4)
                created = True
                print(f"created topic {args.topic} with 4 queues")
            except AlreadyExistsError:
                pass
        if created or not args.seed_once:
            produce(where, args.topic, args.events)
        else:
            print(f"topic {args.topic} exists and --seed-once: no new events")
        total, detail = lag(where, args.group, args.topic)
        print(f"group {args.group} lag {total:>6}   {detail}")
        return run_pipeline(where, args.topic, args.group, args.checkpoint or str(scratch / "checkpoint"),
                            args.max_offsets_per_trigger, master=args.master, driver_host=args.driver_host)
    finally:
        if broker is not None:
            broker.terminate()
            broker.wait(30)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
