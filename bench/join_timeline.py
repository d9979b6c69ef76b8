"""`python -m bench.join_timeline`: where the time of a consumer's join goes, step by step.

The scenario of `python -m bench`'s membership workload: a broker, a topic of 8 queues, two consumers
(PushConsumer, default settings) under a paced producer of 2,000 msg/s, then a third consumer process
starts (PushConsumer.start(), after connect() before the clock where the package has it) and the time
to its first message is measured. Each consumer process
marks the steps of the join as they happen (wall clock, shared by every process on the machine: the
client's own start, its heartbeat, its rebalance and lock requests, the old owners' push, the end of
their drain, their final commit and unlock, the lock grant, the fetch, the broker's start of a queue
opened ahead of its lock, the first records, the listener)
by wrapping the consumer's methods; the broker's log gives the join, the old owners' release and the
lock grants. Prints each round's figure
and the median time of every step, from the start() call.

`--baseline DIR` runs every other round's consumers with the `tidemark` package found in DIR (a copy of
an older tree: an interleaved A/B of the same steps on one broker); `--current DIR` runs the other rounds
with a copy too (default: the installed package, uncommitted changes included). The broker is always the
installed one. Not installed; runs from a checkout.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QUEUES, RATE = 8, 2_000
# (process, mark) pairs printed, in the order a join goes through them.
STEPS = (
    ("joiner", "start"), ("joiner", "> broker_info"), ("joiner", "< broker_info"), ("joiner", "> heartbeat"),
    ("broker", "consumer_join"), ("old", "push"), ("old", "< drain"), ("old", "> unlock_queues"),
    ("joiner", "< heartbeat"), ("joiner", "> do_rebalance"), ("joiner", "> lock_queues"),
    ("broker", "lock_release"), ("old", "< unlock_queues"), ("broker", "lock_grant"),
    ("joiner", "< lock_queues"), ("joiner", "> granted"), ("joiner", "> fetch"), ("joiner", "started ahead"),
    ("joiner", "records"),
    ("joiner", "listener"),
)


def mark(what: str) -> None:
    sys.stderr.write(f"MARK {time.time():.6f} {what}\n")
    sys.stderr.flush()


def _instrument() -> None:
    """Wrap the consumer's steps so that each writes a mark when it begins (>) and ends (<)."""
    from tidemark.client.consumer import core, fetcher, ownership, rebalance
    from tidemark.client.remoting import connection

    def around(cls, name: str, label: str | None = None) -> None:
        orig = getattr(cls, name)

        async def wrapped(self, *args, **kwargs):
            mark(f"> {label or name}")
            try:
                return await orig(self, *args, **kwargs)
            finally:
                mark(f"< {label or name}")
        setattr(cls, name, wrapped)

    for name in ("broker_info", "heartbeat", "lock_queues", "unlock_queues"):
        around(connection.BrokerConnection, name)
    around(rebalance.RebalanceService, "do_rebalance")
    around(core.ConsumerCore, "lease_draining", "drain")
    around(ownership.QueueOwnership, "_start", "granted")
    around(fetcher.Fetcher, "start", "fetch")
    members_changed = core.ConsumerCore._members_changed

    def pushed(self) -> None:
        mark("push")
        members_changed(self)
    core.ConsumerCore._members_changed = pushed
    take_over = getattr(fetcher.Fetcher, "_take_over", None)
    if take_over is not None:  # (a package that opens queues ahead of their lock)
        def taken(self, ahead, reading) -> bool:
            ok = take_over(self, ahead, reading)
            mark("taken over" if ok else "not taken over")
            return ok
        fetcher.Fetcher._take_over = taken
        on_started = fetcher.Fetcher._on_started

        def started(self, handle, start) -> None:
            mark("started ahead")
            on_started(self, handle, start)
        fetcher.Fetcher._on_started = started
    on_records = fetcher.Fetcher._on_records

    def records(self, handle, count, data, next_offset, max_offset) -> None:
        if count:
            mark("records")
        on_records(self, handle, count, data, next_offset, max_offset)
    fetcher.Fetcher._on_records = records


def consumer(address: str, topic: str, group: str, instance: str) -> None:
    """A consumer process: ready, then start() on the first stdin line, stop on the second (once it has had
    a message, or 10 s after)."""
    _instrument()
    from tidemark.client import ConsumeConcurrentlyStatus, ConsumeFromWhere, PushConsumer
    seen: list[float] = []
    got = threading.Event()

    def listener(msgs, ctx):
        if not seen:
            seen.append(time.time())
            mark("listener")
            got.set()
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
    c = PushConsumer(group=group, brokers=address, instance_name=instance,
                     consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    c.subscribe(topic)
    c.register_message_listener(listener)
    if hasattr(c, "connect"):  # connected before the clock, as bench's membership worker (an older copy: not)
        c.connect()
    print("ready", flush=True)
    sys.stdin.readline()
    go = time.time()
    mark("start")
    c.start()
    sys.stdin.readline()
    got.wait(10)  # a join slower than the driver's pause (a loaded machine) is still measured
    print(json.dumps({"go": go, "first": seen[0] if seen else None}), flush=True)
    c.shutdown()


def producer(address: str, topic: str, seconds: float) -> None:
    from tidemark.client import Message, Producer
    with Producer(brokers=address) as p:
        p.fetch_publish_message_queues(topic)
        print("ready", flush=True)
        sys.stdin.readline()
        start, sent, total = time.monotonic(), 0, int(RATE * seconds)
        while sent < total:
            due = min(total, int((time.monotonic() - start) * RATE) + 1)
            for _ in range(due - sent):
                p.send_async(Message(topic, b"x" * 1024))
            sent = due
            time.sleep(0.0005)


def _spawn(args: list[str], log: Path, package: str | None) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package, str(REPO), env.get("PYTHONPATH")) if p)
    with open(log, "w") as err:
        return subprocess.Popen([sys.executable, "-m", "bench.join_timeline", *args], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, text=True, cwd=str(REPO), env=env)


def _tell(p: subprocess.Popen, line: str = "") -> None:
    p.stdin.write(line + "\n")
    p.stdin.flush()


def _marks(log: Path, go: float) -> dict[str, float]:
    """The first time (ms after go) of every mark in a consumer's log."""
    out: dict[str, float] = {}
    for line in log.read_text().splitlines():
        if line.startswith("MARK "):
            _, ts, what = line.split(" ", 2)
            t = (float(ts) - go) * 1000
            if t >= -1 and what not in out:
                out[what] = t
    return out


def _broker_marks(log: Path, group: str, joiner: str, go: float) -> dict[str, float]:
    """The joiner's join and first lock grant, and the first release of a lock (by an old owner) after go
    (the broker logs whole milliseconds)."""
    out: dict[str, float] = {}
    for line in log.read_text().splitlines():
        if f"group={group} " not in line:
            continue
        t = (datetime.datetime.fromisoformat(line.split(" ", 1)[0].replace("Z", "+00:00")).timestamp() - go) * 1000
        events = ("consumer_join", "lock_grant") if f"client_id={joiner}" in line else ("lock_release",) if t >= -1 else ()
        for event in events:
            if f"event={event} " in line and event not in out:
                out[event] = t
    return out


def run_round(server, work: Path, rnd: int, package: str | None) -> tuple[float, dict[tuple[str, str], float]]:
    topic, group = f"join_tl_{rnd}", f"join_tl_g{rnd}"
    server.create_topic(topic, QUEUES)
    consumers = [_spawn(["consumer", server.address, topic, group, f"m{i}"], work / f"c{rnd}-{i}.log", package)
                 for i in range(3)]
    prod = _spawn(["producer", server.address, topic, "5"], work / f"p{rnd}.log", package)
    try:
        for p in (*consumers, prod):
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a worker did not start (logs in {work})")
        for c in consumers[:2]:  # a rolling start, then load, then the join
            _tell(c)
            time.sleep(0.7)
        _tell(prod)
        time.sleep(1.5)
        _tell(consumers[2])
        time.sleep(1.5)
        results = []
        for c in consumers:
            _tell(c)
            results.append(json.loads(c.stdout.readline()))
    finally:
        for p in (*consumers, prod):
            p.stdin.close()
        for p in (*consumers, prod):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    go = results[2]["go"]
    first = (results[2]["first"] - go) * 1000 if results[2]["first"] else float("nan")
    steps = {("joiner", k): v for k, v in _marks(work / f"c{rnd}-2.log", go).items()}
    for i in range(2):  # the old owners: the earliest of the two for each mark, but the latest first
        for k, v in _marks(work / f"c{rnd}-{i}.log", go).items():  # unlock answer (both have let go)
            latest = k == "< unlock_queues"
            if v >= 0 and (("old", k) not in steps or (v > steps[("old", k)] if latest else v < steps[("old", k)])):
                steps[("old", k)] = v
    steps.update({("broker", k): v for k, v in _broker_marks(server.server.log_path, group,
                                                            "127.0.0.1@m2", go).items()})
    return first, steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.join_timeline", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--baseline", help="a directory holding an older `tidemark` package: every other round's "
                                      "consumers run it (interleaved A/B)")
    p.add_argument("--current", help="a directory holding the `tidemark` package the other rounds run (default: the "
                                     "installed one; a snapshot keeps uncommitted work out of an A/B)")
    args = p.parse_args(argv)
    from bench.tidemark_system import TidemarkServer
    work = Path(tempfile.mkdtemp(prefix="tidemark-join-"))
    server = TidemarkServer(work).start()
    variants = ({"current": args.current} if not args.baseline
                else {"baseline": args.baseline, "current": args.current})
    results: dict[str, list[tuple[float, dict]]] = {v: [] for v in variants}
    try:
        for rnd in range(args.rounds):
            name = list(variants)[rnd % len(variants)]
            first, steps = run_round(server, work, rnd, variants[name])
            results[name].append((first, steps))
            print(f"round {rnd + 1}/{args.rounds} {name}: join -> first message {first:.1f} ms "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        server.stop()
    for name, rounds in results.items():
        firsts = [f for f, _ in rounds if f == f]  # (nan: no message within 10 s)
        print(f"\n{name}: join -> first message, median of {len(firsts)}: {statistics.median(firsts):.1f} ms "
              f"(rounds: {', '.join(f'{f:.1f}' for f in firsts)})")
        print("  median ms after start()   step")
        for who, what in STEPS:
            times = [s[(who, what)] for _, s in rounds if (who, what) in s]
            if times:
                print(f"  {statistics.median(times):9.1f}                {who}: {what}")
    print(f"\nlogs in {work}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "consumer":
        consumer(*sys.argv[2:6])
    elif len(sys.argv) > 1 and sys.argv[1] == "producer":
        producer(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        sys.exit(main())
