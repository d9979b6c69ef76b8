"""`python -m bench.replication`: what replication costs a producer, and how fast a replica copies (issue 17).

    python -m bench.replication                       # about a minute: 3 x 5 s of produce + a 200 MiB backlog
    python -m bench.replication --seconds 3 --backlog-mb 50 --json /tmp/replication.json
    python -m bench.replication --smoke               # tiny sizes: proves it runs, numbers meaningless

Every broker is a throwaway child (`python -m tidemark.broker.app`, broker name broker-a,
default async flush) in a temp dir, and every phase starts from fresh data dirs:
1. produce throughput, the same workload against (a) a master with no replica,
   (b) a master with an async replica (`--replication async`), (c) a master with
   a sync replica (`--replication sync`: a send is answered once the replica
   has it). The workload is the peer benchmark's produce (`make bench`,
   workload 1): one producer process, Producer.send_async per message with the
   default batching (linger 0, 256 KiB batches, 5 requests in flight), here for
   `--seconds` (or `--messages`), timed in the child after it connected;
   rate = answered messages / (last answer - first send);
2. replica lag during (b) and (c): every `--sample-interval` s the harness reads
   the master's and the replica's topic stats at the same time (two clients)
   and takes sum over queues of (master max offset - replica max offset), in
   messages; after the producer stops, how long until the replica caught up;
3. replication throughput: `--backlog-mb` of messages produced into a master
   with no replica, then a replica started; timed from the master accepting
   its replication stream (the master's replica_connected log line) until the
   replica's max offset equals the master's on every queue (polled every
   50 ms). Reported as payload MiB/s and as commit-log MiB/s (the bytes the
   replica acknowledged, from the master's replica_disconnected line).
Prints the tables; `--json PATH` writes the results too.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

from bench.procs import REPO, Server, child_env, free_port, orphan_safe

TOPIC = "bench_replication"
BROKER_NAME = "broker-a"
MODES = ("none", "async", "sync")
MODE_LABELS = {"none": "(a) master, no replica", "async": "(b) master + async replica",
               "sync": "(c) master + sync replica"}
MIB = 1024 * 1024


# -- the producer child (`--role produce`) ----------------------------------------------------------

def produce(args: argparse.Namespace) -> None:
    """Producer.send_async per message (default batching) for args.seconds or args.count messages,
    then wait for every answer. Prints {"started": wall clock} when connected, then the result."""
    from bench.tidemark_system import _Acks
    from tidemark.client import Message, Producer

    body = os.urandom(args.size)
    acks = _Acks(1 << 62)  # the real count once sending stops
    limit = args.count if args.count > 0 else math.inf
    with Producer(brokers=args.brokers) as producer:
        producer.fetch_publish_message_queues(args.topic)
        print(json.dumps({"started": time.time()}), flush=True)
        start = time.monotonic()
        deadline = start + args.seconds if args.seconds > 0 else math.inf
        sent = 0
        while sent < limit:
            if not sent % 256 and time.monotonic() >= deadline:
                break
            producer.send_async(Message(args.topic, body), acks)
            sent += 1
        acks.expect(sent)
        acks.done.wait(180)
        elapsed, finished = time.monotonic() - start, time.time()
    print(json.dumps({"result": {"sent": sent, "ok": acks.ok, "errors": acks.errors, "elapsed_s": elapsed,
                                 "finished": finished}}), flush=True)


class ProducerProc:
    """`python -m bench.replication --role produce` in its own process, its JSON lines read by a thread."""

    def __init__(self, address: str, *, size: int, seconds: float, count: int, log_path: Path) -> None:
        cmd = [sys.executable, "-m", "bench.replication", "--role", "produce", "--brokers", address,
               "--topic", TOPIC, "--size", str(size), "--seconds", str(seconds), "--messages", str(count)]
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(orphan_safe(cmd), stdout=subprocess.PIPE, stderr=log,
                                         stdin=subprocess.DEVNULL, env=child_env(), cwd=str(REPO))
        self.lines: queue.Queue[dict | None] = queue.Queue()
        threading.Thread(target=self._pump, name="producer-stdout", daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            try:
                self.lines.put(json.loads(line))
            except ValueError:
                continue
        self.lines.put(None)

    def wait_for(self, key: str, timeout: float) -> object:
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"producer gave no {key!r} within {timeout:.0f} s ({self.log_path})") from None
            if msg is None:
                self.proc.wait(10)
                tail = self.log_path.read_text("utf-8", "replace")[-2500:]
                raise RuntimeError(f"producer exited with {self.proc.returncode} before {key!r}:\n{tail}")
            if key in msg:
                return msg[key]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


# -- brokers and what the harness reads from them ---------------------------------------------------

def start_broker(workdir: Path, name: str, *extra: str) -> tuple[Server, str]:
    """A broker child named broker-a on a free port, data in workdir/<name>-data, log workdir/<name>.log;
    returns it (not yet ready: call ready()) and its address."""
    port = free_port()
    server = Server(name, [sys.executable, "-m", "tidemark.broker.app", "--data-dir", str(workdir / f"{name}-data"),
                           "--port", str(port), "--broker-name", BROKER_NAME, *extra], workdir / f"{name}.log")
    server.start()
    return server, f"127.0.0.1:{port}"


def ready(server: Server) -> Server:
    server.wait_log(r"event=broker_ready", timeout=60)
    return server


def log_time(server: Server, event: str, timeout: float = 30.0) -> tuple[float, re.Match]:
    """Wall-clock time (s since the epoch) of the broker's first log line with this event."""
    m = server.wait_log(rf"(?m)^(\S+) .*event={event}\b.*$", timeout)
    return datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp(), m


def max_offsets(admin, topic: str) -> dict[int, int]:
    """{queue id: max offset} of the topic on the admin's broker ({} while it does not know the topic)."""
    from tidemark.client.errors import NotFoundError
    try:
        return {row.queue.queue_id: row.max_offset for row in admin.topic_stats(topic)}
    except NotFoundError:
        return {}


def lag(master: dict[int, int], replica: dict[int, int]) -> int:
    return sum(max(0, end - replica.get(q, 0)) for q, end in master.items())


def wait_until(check, timeout: float, what: str, poll: float = 0.05) -> float:
    """Poll check() until true; returns the wall-clock time it first was."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return time.time()
        time.sleep(poll)
    raise TimeoutError(f"{what} not within {timeout:.0f} s")


class LagSampler(threading.Thread):
    """Every `interval` s: both brokers' max offsets, read at the same time, and their difference."""

    def __init__(self, master: str, replica: str, interval: float) -> None:
        super().__init__(name="lag-sampler", daemon=True)
        self.addresses = (master, replica)
        self.interval = interval
        self.samples: list[tuple[float, int]] = []  # (monotonic time, lag in messages)
        self.error: BaseException | None = None
        self._done = threading.Event()

    def run(self) -> None:
        from tidemark.client import Admin
        try:
            with Admin(brokers=self.addresses[0]) as am, Admin(brokers=self.addresses[1]) as ar, \
                    ThreadPoolExecutor(2) as pool:
                while not self._done.wait(self.interval):
                    fm, fr = pool.submit(max_offsets, am, TOPIC), pool.submit(max_offsets, ar, TOPIC)
                    self.samples.append((time.monotonic(), lag(fm.result(), fr.result())))
        except BaseException as e:  # reported by finish()
            self.error = e

    def finish(self) -> list[int]:
        self._done.set()
        self.join(30)
        if self.error is not None:
            raise RuntimeError(f"lag sampling failed: {self.error!r}") from self.error
        return [n for _, n in self.samples]


# -- the phases ------------------------------------------------------------------------------------

def produce_phase(work: Path, mode: str, args: argparse.Namespace) -> dict:
    """Start the master (and its replica), produce for args.seconds, sample the lag, wait for catch-up."""
    from tidemark.client import Admin

    d = work / f"produce-{mode}"
    d.mkdir()
    servers: list[Server] = []
    producer: ProducerProc | None = None
    try:
        master, maddr = start_broker(d, "master", "--replication", "sync" if mode == "sync" else "async")
        servers.append(ready(master))
        replica = raddr = None
        if mode != "none":
            replica, raddr = start_broker(d, "replica", "--broker-id", "1", "--master", maddr)
            servers.append(ready(replica))
            log_time(master, "replica_connected")  # a sync master refuses sends until a replica streams
        with Admin(brokers=maddr) as admin:
            admin.create_topic(TOPIC, args.queues)
        if raddr is not None:
            with Admin(brokers=raddr) as ar:  # mirrored within the replica's 1 s metadata timer
                wait_until(lambda: len(max_offsets(ar, TOPIC)) == args.queues, 30, "topic on the replica", 0.1)
        cpu_before = [s.cpu_seconds() for s in servers]
        producer = ProducerProc(maddr, size=args.size, seconds=args.seconds, count=args.messages,
                                log_path=d / "producer.log")
        producer.wait_for("started", 60)
        sampler = LagSampler(maddr, raddr, args.sample_interval) if raddr is not None else None
        if sampler is not None:
            sampler.start()
        try:
            r = producer.wait_for("result", args.seconds + 240)
        finally:
            samples = sampler.finish() if sampler is not None else []
        producer.proc.wait(30)
        cpu = [s.cpu_seconds() - c for s, c in zip(servers, cpu_before, strict=True)]
        out = {"mode": mode, "messages": r["ok"], "sent": r["sent"], "errors": r["errors"],
               "seconds": r["elapsed_s"], "msgs_per_s": r["ok"] / r["elapsed_s"] if r["elapsed_s"] > 0 else 0.0,
               "master_cpu_s": cpu[0], "replica_cpu_s": cpu[1] if len(cpu) > 1 else 0.0}
        out["mib_per_s"] = out["msgs_per_s"] * args.size / MIB
        with Admin(brokers=maddr) as am:
            master_ends = max_offsets(am, TOPIC)
        out["stored"] = sum(master_ends.values())
        if raddr is not None:
            with Admin(brokers=raddr) as ar:
                caught_up = wait_until(lambda: lag(master_ends, max_offsets(ar, TOPIC)) == 0, 120,
                                       "replica catch-up after the producer stopped")
            out.update(lag_samples=len(samples), lag_max=max(samples, default=0),
                       lag_mean=sum(samples) / len(samples) if samples else 0.0,
                       catch_up_s=max(0.0, caught_up - r["finished"]))
        return out
    finally:
        if producer is not None:
            producer.kill()
        for s in reversed(servers):  # the replica first
            s.stop()


def backlog_phase(work: Path, args: argparse.Namespace) -> dict:
    """Produce args.backlog_mb into a master alone, then start a replica and time its copy."""
    from tidemark.client import Admin

    d = work / "backlog"
    d.mkdir()
    servers: list[Server] = []
    producer: ProducerProc | None = None
    try:
        master, maddr = start_broker(d, "master", "--replication", "async")
        servers.append(ready(master))
        with Admin(brokers=maddr) as admin:
            admin.create_topic(TOPIC, args.queues)
        count = max(1, int(args.backlog_mb * MIB / args.size))
        producer = ProducerProc(maddr, size=args.size, seconds=0, count=count, log_path=d / "producer.log")
        r = producer.wait_for("result", 300)
        if r["ok"] != count:
            raise RuntimeError(f"backlog: {r['ok']} of {count} messages stored ({r['errors']} errors)")
        with Admin(brokers=maddr) as am:
            master_ends = max_offsets(am, TOPIC)
        launched = time.time()
        replica, raddr = start_broker(d, "replica", "--broker-id", "1", "--master", maddr)
        servers.append(replica)
        ready(replica)
        connected, _ = log_time(master, "replica_connected")
        with Admin(brokers=raddr) as ar:
            done = wait_until(lambda: lag(master_ends, max_offsets(ar, TOPIC)) == 0, args.copy_timeout,
                              "replica copy of the backlog")
        replica.stop()
        servers.remove(replica)
        _, m = log_time(master, "replica_disconnected", 10)
        acked = re.search(r"\backed=(\d+)", m.group(0))
        seconds = done - connected
        messages = sum(master_ends.values())
        out = {"messages": messages, "payload_mib": messages * args.size / MIB,
               "produce_msgs_per_s": r["ok"] / r["elapsed_s"], "seconds": seconds,
               "seconds_with_start": done - launched,
               "commit_log_mib": int(acked.group(1)) / MIB if acked else None}
        out["mib_per_s"] = out["payload_mib"] / seconds if seconds > 0 else 0.0
        out["msgs_per_s"] = messages / seconds if seconds > 0 else 0.0
        out["commit_log_mib_per_s"] = out["commit_log_mib"] / seconds if acked and seconds > 0 else None
        out["mib_per_s_with_start"] = out["payload_mib"] / out["seconds_with_start"]
        return out
    finally:
        if producer is not None:
            producer.kill()
        for s in reversed(servers):
            s.stop()


# -- report ----------------------------------------------------------------------------------------

def machine(load_start: tuple[float, ...]) -> str:
    fmt = lambda la: " / ".join(f"{x:.1f}" for x in la)  # noqa: E731
    return (f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}, "
            f"{platform.system()}; load average {fmt(load_start)} at the start, {fmt(os.getloadavg())} at the end")


def table(head: list[str], rows: list[list[str]], left: int = 1) -> str:
    """A markdown table padded to line up in a terminal; the first `left` columns left-aligned."""
    widths = [max(len(c) for c in col) for col in zip(head, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) if i < left else c.rjust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths, strict=True))) + " |"
    rule = "|" + "|".join("-" * (w + 2) if i < left else "-" * (w + 1) + ":" for i, w in enumerate(widths)) + "|"
    return "\n".join([line(head), rule, *map(line, rows)])


def tables(res: dict) -> str:
    base = res["produce"]["none"]["msgs_per_s"]
    rows = []
    for mode in MODES:
        r = res["produce"][mode]
        errors = f" ({r['errors']:,} errors)" if r["errors"] else ""
        rows.append([MODE_LABELS[mode] + errors, f"{r['messages']:,}", f"{r['seconds']:.2f}",
                     f"{r['msgs_per_s']:,.0f}", f"{r['mib_per_s']:.1f}",
                     f"{r['msgs_per_s'] / base if base else 0.0:.2f}x",
                     f"{r['lag_max']:,}" if "lag_max" in r else "-",
                     f"{r['lag_mean']:,.0f}" if "lag_mean" in r else "-",
                     f"{r['catch_up_s']:.2f}" if "catch_up_s" in r else "-",
                     f"{r['master_cpu_s']:.1f}" + (f" + {r['replica_cpu_s']:.1f}" if mode != "none" else "")])
    produce = table(["mode", "messages", "seconds", "msgs/s", "MiB/s", "vs (a)", "lag max (msgs)",
                     "lag mean (msgs)", "caught up (s)", "CPU s master + replica"], rows)
    b = res["backlog"]
    clog = (f", {b['commit_log_mib_per_s']:.1f} MiB/s of commit log ({b['commit_log_mib']:.1f} MiB)"
            if b["commit_log_mib"] is not None else "")
    copy = table(["replica copying a backlog", "value"], [
        ["backlog on the master", f"{b['messages']:,} messages, {b['payload_mib']:.1f} MiB payload"],
        ["copy time (stream open -> caught up)", f"{b['seconds']:.2f} s"],
        ["replication throughput", f"{b['mib_per_s']:.1f} MiB/s payload, {b['msgs_per_s']:,.0f} msgs/s{clog}"],
        ["incl. replica process start", f"{b['seconds_with_start']:.2f} s, {b['mib_per_s_with_start']:.1f} MiB/s "
                                        f"payload"],
    ], left=2)
    return produce + "\n\n" + copy


def main(argv: list[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser(prog="python -m bench.replication", description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="produce time per mode (default 5; 0: --messages)")
    ap.add_argument("--messages", type=int, default=0, help="messages per mode at most (default 0: no limit)")
    ap.add_argument("--size", type=int, default=1024, help="body bytes (default 1024)")
    ap.add_argument("--queues", type=int, default=8, help="queues of the topic (default 8)")
    ap.add_argument("--backlog-mb", type=float, default=200.0, help="MiB of payload the replica copies (default 200)")
    ap.add_argument("--sample-interval", type=float, default=0.25, help="lag sampling period, s (default 0.25)")
    ap.add_argument("--copy-timeout", type=float, default=300.0, help="give up on the backlog copy after this, s")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (1 s per mode, 4 MiB backlog)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir with data and logs")
    ap.add_argument("--role", choices=["produce"], help=argparse.SUPPRESS)
    ap.add_argument("--brokers", help=argparse.SUPPRESS)
    ap.add_argument("--topic", default=TOPIC, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role == "produce":
        args.count = args.messages
        produce(args)
        return None
    if args.smoke:
        args.seconds, args.backlog_mb, args.sample_interval = 1.0, 4.0, 0.2
    if args.seconds <= 0 and args.messages <= 0:
        ap.error("give --seconds or --messages")

    load_start = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="tidemark-replication-"))
    t0 = time.monotonic()
    try:
        produced = {}
        for mode in MODES:
            produced[mode] = produce_phase(work, mode, args)
            r = produced[mode]
            print(f"replication: {MODE_LABELS[mode]}: {r['msgs_per_s']:,.0f} msg/s ({r['messages']:,} messages, "
                  f"{r['errors']:,} errors)" + (f", lag max {r['lag_max']:,} msgs" if "lag_max" in r else ""),
                  flush=True)
        backlog = backlog_phase(work, args)
        print(f"replication: backlog of {backlog['payload_mib']:.1f} MiB copied in {backlog['seconds']:.2f} s",
              flush=True)
    finally:
        if args.keep:
            print(f"replication: data and logs kept in {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    base = produced["none"]["msgs_per_s"]
    command = "python -m bench.replication" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    res = {"command": command, "machine": machine(load_start), "took_s": time.monotonic() - t0,
           "params": {"seconds": args.seconds, "messages": args.messages, "size": args.size, "queues": args.queues,
                      "backlog_mb": args.backlog_mb, "sample_interval": args.sample_interval, "smoke": args.smoke},
           "produce": produced, "backlog": backlog,
           "ratios": {"async_vs_none": produced["async"]["msgs_per_s"] / base if base else 0.0,
                      "sync_vs_none": produced["sync"]["msgs_per_s"] / base if base else 0.0}}
    print(f"Tidemark replication: {args.size} B messages, {args.queues} queues, one producer process "
          f"(Producer.send_async, default batching), {args.seconds:g} s per mode"
          f"{' — SMOKE RUN, numbers meaningless' if args.smoke else ''}; {res['machine']}")
    print(tables(res))
    print(f"cost of replication: async {res['ratios']['async_vs_none']:.2f}x, sync {res['ratios']['sync_vs_none']:.2f}x "
          f"the throughput without a replica; run took {res['took_s']:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    return res


if __name__ == "__main__":
    main()
