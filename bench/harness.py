"""`python -m bench`: Tidemark side by side with Redis Streams and NATS JetStream.

Starts every server once (Tidemark's broker, redis-server, nats-server, the
gRPC echo ceiling), then runs each workload against each system in turn
(A B C A B C ...) for several rounds, every client in its own worker process.
Prints the medians and Tidemark/peer ratios; writes the report section of
docs/benchmarks.md and a chart (smoke mode: a temp dir instead).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

from bench import report
from bench.grpc_echo import EchoServer
from bench.procs import REPO, Worker, ensure_peer_servers
from bench.workloads import PERCENTILES, WORKLOADS, Sizes, percentile

SYSTEMS = ("tidemark", "redis", "nats")
BUDGET_S = 14 * 60


@dataclasses.dataclass
class Context:
    sizes: Sizes
    workdir: Path
    servers: dict  # system key -> server object
    echo: EchoServer | None
    seq: int = 0

    def worker(self, system: str, role: str, **spec) -> Worker:
        self.seq += 1
        server = self.echo if system == "echo" else self.servers[system]
        full = {"system": system, "address": server.address, "timeout_s": self.sizes.workload_timeout_s,
                **getattr(server, "client_spec", dict)(), **spec}
        return Worker(role, full, self.workdir / f"worker-{self.seq:04d}-{system}-{role}.log")


def _run_one(w: Worker, timeout_s: float) -> dict:
    """Start one worker, let it go, and return its result; it is killed whatever happens."""
    try:
        _start_all([w])
        w.go()
        return _collect([w], timeout_s)[0]
    finally:
        _kill([w])


def _start_all(workers: list[Worker], timeout: float = 60) -> None:
    for w in workers:
        w.ready(timeout)


def _go_in_turn(workers: list[Worker], timeout: float = 60) -> None:
    """Start consumers one after the other, each once the previous one has joined: a rolling start,
    the same for every system, so the measurement is the steady group rather than the join storm."""
    for w in workers:
        w.go()
        w.wait_for("started", timeout)


def _collect(workers: list[Worker], timeout: float) -> list[dict]:
    out = []
    for w in workers:
        r = w.result(timeout)
        if "error" in r:
            raise RuntimeError(f"{w.role} worker failed: {r['error']} (log {w.log_path})")
        out.append(r)
    return out


def _kill(workers: list[Worker]) -> None:
    for w in workers:
        w.kill()


def _wait_consumed(consumers: list[Worker], expected: int, stall_s: float, timeout_s: float) -> int:
    """Poll the consumers until together they have `expected` messages, made no progress for stall_s,
    or timeout_s passed; then tell them to stop. Returns the total seen."""
    deadline = time.monotonic() + timeout_s
    total, changed = -1, time.monotonic()
    while time.monotonic() < deadline:
        now_total = sum(w.progress() for w in consumers)
        if now_total != total:
            total, changed = now_total, time.monotonic()
        if total >= expected or time.monotonic() - changed >= stall_s:
            break
        time.sleep(0.1)
    for w in consumers:
        w.send("stop")
    return total


def _rate(r: dict) -> float:
    return r["count"] / r["elapsed_s"] if r["elapsed_s"] > 0 else 0.0


# -- workloads ------------------------------------------------------------------------------------

def run_produce(ctx: Context, system: str, rnd: int) -> dict:
    s = ctx.sizes
    topic = f"bench_r{rnd}"
    if system == "echo":
        return _echo_stream(ctx, s.batch, s.messages)
    ctx.servers[system].create_topic(topic, s.queues)
    w = ctx.worker(system, "produce", topic=topic, count=s.messages, batch=s.batch)
    r = _run_one(w, s.workload_timeout_s)
    return {"rate": _rate(r), "count": r["count"]}


def run_produce_sync(ctx: Context, system: str, rnd: int) -> dict:
    """Workload 1 against a Tidemark broker with sync flush (every send acknowledged after fsync)."""
    if system != "tidemark":
        return {}
    s = ctx.sizes
    topic = f"bench_sync_r{rnd}"
    server = ctx.servers["tidemark"].sync_flush()
    server.create_topic(topic, s.queues)
    w = Worker("produce", {"system": "tidemark", "address": server.address, "timeout_s": s.workload_timeout_s,
                           "topic": topic, "count": s.messages, "batch": s.batch},
               ctx.workdir / f"worker-sync-{rnd}.log")
    cpu_before = server.server.cpu_seconds()
    r = _run_one(w, s.workload_timeout_s)
    out = {"rate": _rate(r), "count": r["count"]}
    _add_cpu_per_message(out, server.server.cpu_seconds() - cpu_before)
    return out


def run_consume(ctx: Context, system: str, rnd: int) -> dict:
    s = ctx.sizes
    if system == "echo":
        return _echo_stream(ctx, s.batch, s.messages)
    server = ctx.servers[system]
    topic, group = f"bench_r{rnd}", f"bench_g{rnd}"
    server.prepare_group(topic, group)
    workers = [ctx.worker(system, "consume", topic=topic, group=group, instance=f"c{i}")
               for i in range(s.consumers)]
    try:
        _start_all(workers)
        _go_in_turn(workers)
        _wait_consumed(workers, s.messages, 10.0, s.workload_timeout_s)
        results = _collect(workers, 60)
    finally:
        _kill(workers)
    if hasattr(server, "cleanup"):
        server.cleanup(topic)
    total = sum(r["count"] for r in results)
    go = min(r["go"] for r in results)
    last = max(r["last"] for r in results)
    return {"rate": total / (last - go) if last > go else 0.0, "count": total,
            "missing": max(0, s.messages - total), "per_consumer": [r["count"] for r in results]}


def run_commit(ctx: Context, system: str, rnd: int) -> dict:
    s = ctx.sizes
    total = s.commit_queues * s.commits_per_queue
    if system == "echo":  # frames as large as a CommitOffsets write of one commit per queue
        return _echo_stream(ctx, s.commit_queues, total, _commit_frame_bytes(s.commit_queues))
    topic = "bench_commits"
    if rnd == 0 and system == "tidemark":
        ctx.servers[system].create_topic(topic, s.commit_queues)
    w = ctx.worker(system, "commit", topic=topic, group=f"bench_c{rnd}", queues=s.commit_queues,
                   per_queue=s.commits_per_queue, prefill=rnd == 0)
    try:
        w.ready(s.workload_timeout_s + 120)  # includes the untimed prefill
        w.go()
        r = _collect([w], s.workload_timeout_s)[0]
    finally:
        _kill([w])
    return {"rate": _rate(r), "count": r["count"], "rejected": r.get("rejected", 0)}


def _paced(ctx: Context, system: str, topic: str, rate: int, count: int) -> Worker:
    return ctx.worker(system, "paced_produce", topic=topic, rate=rate, count=count)


def run_latency(ctx: Context, system: str, rnd: int) -> dict:
    s = ctx.sizes
    if system == "echo":
        w = ctx.worker("echo", "rtt", count=2000)
        r = _run_one(w, 60)
        return {"p50_ms": r["p50_us"] / 1000, "p99_ms": r["p99_us"] / 1000}
    server = ctx.servers[system]
    topic, group = f"bench_lat_r{rnd}", f"bench_lat_g{rnd}"
    server.create_topic(topic, s.queues)
    server.prepare_group(topic, group)
    count = int(s.latency_rate * s.latency_seconds)
    consumer = ctx.worker(system, "consume", topic=topic, group=group, instance="lat", latency=True,
                          warmup=s.latency_rate // 2)
    producer = _paced(ctx, system, topic, s.latency_rate, count)
    try:
        _start_all([consumer, producer])
        _go_in_turn([consumer])
        time.sleep(0.5)  # the consumer owns its queues before the first send
        producer.go()
        p = _collect([producer], s.latency_seconds + 60)[0]
        _wait_consumed([consumer], p["sent"], 5.0, 60)
        c = _collect([consumer], 60)[0]
    finally:
        _kill([consumer, producer])
    if hasattr(server, "cleanup"):
        server.cleanup(topic)
    return {"p50_ms": c["p50_us"] / 1000, "p99_ms": c["p99_us"] / 1000, "achieved_rate": p["achieved_rate"],
            "received": c["count"], "sent": p["sent"]}


def run_membership(ctx: Context, system: str, rnd: int) -> dict:
    s = ctx.sizes
    if system == "echo":
        return {}
    server = ctx.servers[system]
    topic, group = f"bench_mem_r{rnd}", f"bench_mem_g{rnd}"
    server.create_topic(topic, s.queues)
    server.prepare_group(topic, group)
    count = int(s.busy_rate * (s.join_after_s + s.after_join_s))
    seqs = [ctx.workdir / f"seqs-{system}-{rnd}-{i}.txt" for i in range(s.busy_consumers + 1)]
    consumers = [ctx.worker(system, "consume", topic=topic, group=group, instance=f"m{i}", seqs_path=str(p))
                 for i, p in enumerate(seqs)]
    old, joiner = consumers[:-1], consumers[-1]
    producer = _paced(ctx, system, topic, s.busy_rate, count)
    try:
        _start_all([*consumers, producer])
        _go_in_turn(old)
        time.sleep(0.5)
        producer.go()
        time.sleep(s.join_after_s)
        joiner.go()
        p = _collect([producer], s.after_join_s + 60)[0]
        _wait_consumed(consumers, p["sent"], 5.0, 30)
        time.sleep(0.5)  # late duplicates still count
        results = _collect(consumers, 60)
    finally:
        _kill([*consumers, producer])
    if hasattr(server, "cleanup"):
        server.cleanup(topic)
    seen = collections.Counter(int(x) for path in seqs if path.exists() for x in path.read_text().split())
    j = results[-1]
    return {"join_first_ms": (j["first"] - j["go"]) * 1000 if j["count"] else float("nan"),
            "duplicates": sum(v - 1 for v in seen.values() if v > 1), "missing": max(0, p["sent"] - len(seen)),
            "joiner_count": j["count"]}


def run_send(ctx: Context, system: str, rnd: int) -> dict:
    """Workload 6: synchronous sends from one thread, one at a time and in batches; the echo's figure is a
    blocking client's unary gRPC call of 1 KiB, the floor of a synchronous send."""
    s = ctx.sizes
    if system == "nats":
        return {}
    if system == "echo":
        r = _run_one(ctx.worker("echo", "unary", count=s.sends), s.workload_timeout_s)
        return {"p50_us": r["p50_us"], "p99_us": r["p99_us"]}
    topic = f"bench_send_r{rnd}"
    ctx.servers[system].create_topic(topic, s.queues)
    r = _run_one(ctx.worker(system, "sync_send", topic=topic, count=s.sends, batch=s.batch), s.workload_timeout_s)
    return {"p50_us": r["p50_us"], "p99_us": r["p99_us"], "batch_rate": r["batch_rate"], "count": r["count"]}


def run_latency_curve(ctx: Context, system: str, rnd: int) -> dict:
    """Workload 7, in OpenMessaging Benchmark's terms: at each fixed rate (Sizes.curve_rates), 1 KiB messages on
    one topic of 16 queues, one producer process and a group of two consumer processes; publish latency
    (due -> acknowledged) and end-to-end latency (due -> handed to the listener), p50/p99/p99.9 over both
    consumers, the first half second left out."""
    if system == "echo":
        return {}
    s = ctx.sizes
    server = ctx.servers[system]
    out: dict = {}
    for full_rate in s.curve_rates:
        rate = max(1, int(full_rate * s.curve_scale))
        topic, group = f"bench_curve_{full_rate}_r{rnd}", f"bench_curve_g{full_rate}_r{rnd}"
        server.create_topic(topic, 16)
        server.prepare_group(topic, group)
        paths = [ctx.workdir / f"curve-{system}-{full_rate}-{rnd}-{i}.txt" for i in range(2)]
        consumers = [ctx.worker(system, "consume", topic=topic, group=group, instance=f"curve{i}", latency=True,
                                warmup=rate // 2, lat_path=str(path)) for i, path in enumerate(paths)]
        producer = _paced(ctx, system, topic, rate, int(rate * s.curve_seconds))
        try:
            _start_all([*consumers, producer])
            _go_in_turn(consumers)
            time.sleep(0.5)  # the group owns its queues before the first send
            producer.go()
            p = _collect([producer], s.curve_seconds + 60)[0]
            _wait_consumed(consumers, p["sent"], 5.0, 60)
            received = sum(r["count"] for r in _collect(consumers, 60))
        finally:
            _kill([*consumers, producer])
        if hasattr(server, "cleanup"):
            server.cleanup(topic)
        samples = [float(x) for path in paths if path.exists() for x in path.read_text().split()]
        for name, q in PERCENTILES:
            out[f"e2e_{name}_ms@{full_rate}"] = percentile(samples, q) / 1000 if samples else float("nan")
            out[f"pub_{name}_ms@{full_rate}"] = p.get(f"publish_{name}_us", float("nan")) / 1000
        out[f"achieved@{full_rate}"] = p["achieved_rate"]
        out[f"missing@{full_rate}"] = max(0, p["sent"] - received)
    return out


def _commit_frame_bytes(queues: int) -> int:
    from tidemark.v1 import offsets_pb2
    commit = offsets_pb2.CommitOffsetsRequest()
    for q in range(queues):
        c = commit.commits.add()
        c.group, c.topic, c.queue_id, c.offset = "bench_c0", "bench_commits", q, 1000
    return commit.ByteSize()


def _echo_stream(ctx: Context, per_frame: int, count: int, frame_bytes: int = 0) -> dict:
    w = ctx.worker("echo", "stream", per_frame=per_frame, count=count, frame_bytes=frame_bytes)
    r = _run_one(w, ctx.sizes.workload_timeout_s)
    return {"rate": _rate(r), "count": r["count"]}


RUNNERS = {"produce": run_produce, "produce_sync": run_produce_sync, "consume": run_consume,
           "commit": run_commit, "latency": run_latency, "membership": run_membership, "send": run_send,
           "latency_curve": run_latency_curve}


# -- the suite ------------------------------------------------------------------------------------

def start_servers(systems: list[str], workdir: Path, allow_install: bool) -> tuple[dict, dict[str, str]]:
    from bench.peers.nats_jetstream import NatsServer
    from bench.peers.redis_streams import RedisServer
    from bench.tidemark_system import TidemarkServer
    servers, skipped = {}, {}
    binaries, reason = ensure_peer_servers(allow_install) if set(systems) - {"tidemark"} else ({}, "")
    for key in systems:
        missing = _missing_client(key)
        if missing:
            skipped[key] = missing
            continue
        try:
            if key == "tidemark":
                servers[key] = TidemarkServer(workdir).start()
            elif key == "redis":
                if "redis-server" not in binaries:
                    skipped[key] = reason or "redis-server not available"
                    continue
                servers[key] = RedisServer(workdir, binaries["redis-server"]).start()
            elif key == "nats":
                if "nats-server" not in binaries:
                    skipped[key] = reason or "nats-server not available"
                    continue
                servers[key] = NatsServer(workdir, binaries["nats-server"]).start()
        except Exception as e:  # a peer that cannot start is skipped, with the reason in the report
            if key == "tidemark":
                raise
            skipped[key] = f"{type(e).__name__}: {e}"
    return servers, skipped


CLIENT_PACKAGES = {"redis": ("redis", "redis==8.1.0 hiredis==3.5.0"), "nats": ("nats", "nats-py==2.16.0")}


def _missing_client(key: str) -> str:
    """Why a peer's Python client cannot be used ('' when it can)."""
    if key not in CLIENT_PACKAGES:
        return ""
    module, pins = CLIENT_PACKAGES[key]
    try:
        __import__(module)
    except ImportError:
        return f"Python client not installed ({pins}; part of the dev dependencies)"
    return ""


def run_suite(sizes: Sizes, workdir: Path, systems: list[str], workloads: list[str], *,
              allow_install: bool = True, budget_s: float = BUDGET_S) -> dict:
    t0 = time.monotonic()
    notes: list[str] = []
    servers, skipped = start_servers(systems, workdir, allow_install)
    for key, why in skipped.items():
        print(f"bench: SKIPPING {key}: {why}", flush=True)
    echo = EchoServer(workdir).start()
    ctx = Context(sizes, workdir, servers, echo)
    for server in [*servers.values(), echo]:
        print(f"bench: {server.name} {server.version()} at {server.address}", flush=True)
        for k, v in server.settings().items():
            print(f"         {k}: {v}", flush=True)
    results: dict = {w: {k: [] for k in [*servers, "echo"]} for w in workloads}
    errors: list[str] = []
    rounds = sizes.rounds
    try:
        rnd = 0
        while rnd < rounds:
            round_start = time.monotonic()
            for workload in workloads:
                for key in [*servers, "echo"]:
                    if (workload == "membership" and key == "echo") or (workload == "produce_sync"
                                                                         and key != "tidemark"):
                        continue
                    started = time.monotonic()
                    server = ctx.echo if key == "echo" else ctx.servers[key]
                    cpu_before = _cpu(server)
                    try:
                        r = RUNNERS[workload](ctx, key, rnd)
                        if workload != "produce_sync":  # that one measures its own (sync-flush) broker
                            _add_cpu_per_message(r, _cpu(server) - cpu_before)
                    except Exception as e:
                        traceback.print_exc()
                        errors.append(f"round {rnd + 1} {workload} {key}: {type(e).__name__}: {e}")
                        print(f"bench: ERROR {errors[-1]}", flush=True)
                        continue
                    results[workload][key].append(r)
                    print(f"bench: round {rnd + 1}/{rounds} {workload:<10} {key:<8} {report.brief(workload, r)}"
                          f"  ({time.monotonic() - started:.1f}s)", flush=True)
            rnd += 1
            spent, per_round = time.monotonic() - t0, time.monotonic() - round_start
            affordable = rnd + int(max(0.0, budget_s - spent) // per_round)
            if affordable < rounds:
                notes.append(f"time budget: ran {max(affordable, rnd)} rounds instead of {rounds} "
                             f"(a round took {per_round:.0f} s)")
                print(f"bench: {notes[-1]}", flush=True)
                rounds = max(affordable, rnd)
    finally:
        versions = {key: s.version() for key, s in [*servers.items(), ("echo", echo)]}
        settings = {key: s.settings() for key, s in [*servers.items(), ("echo", echo)]}
        names = {key: s.name for key, s in [*servers.items(), ("echo", echo)]}
        for s in [*servers.values(), echo]:
            s.stop()
    return {"results": results, "medians": medians(results), "skipped": skipped, "errors": errors,
            "notes": notes, "versions": versions, "settings": settings, "names": names, "rounds": rounds,
            "sizes": sizes.as_dict(), "elapsed_s": time.monotonic() - t0}


def _cpu(server) -> float:
    proc = getattr(server, "server", None)
    return proc.cpu_seconds() if proc is not None else 0.0


def _add_cpu_per_message(r: dict, cpu_s: float) -> None:
    """The server's CPU per 1,000 messages (or commits) of the run, when the run counted them."""
    count = r.get("received") or r.get("count")
    if count and cpu_s > 0:
        r["server_cpu_ms_per_1k"] = cpu_s * 1000 / (count / 1000)


def medians(results: dict) -> dict:
    out: dict = {}
    for workload, by_system in results.items():
        for key, runs in by_system.items():
            if not runs:
                continue
            fields = {k for r in runs for k, v in r.items() if isinstance(v, int | float)}
            out.setdefault(workload, {})[key] = {f: statistics.median(r[f] for r in runs if f in r) for f in fields}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny counts, one round, report to a temp dir")
    p.add_argument("--rounds", type=int, help="rounds of A B C alternation (default 3; smoke 1)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply message and commit counts")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma list of tidemark,redis,nats")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma list of " + ",".join(WORKLOADS))
    p.add_argument("--out", type=Path, help="markdown file for the report section (default docs/benchmarks.md; "
                                            "smoke: a temp dir)")
    p.add_argument("--chart", type=Path, help="PNG chart path (default beside --out, docs/benchmarks-peers.png)")
    p.add_argument("--no-install", action="store_true", help="do not apt-get install missing peer servers")
    p.add_argument("--keep", action="store_true", help="keep the temp dir with server and worker logs")
    p.add_argument("--json", type=Path, help="also write every result as JSON here")
    args = p.parse_args(argv)

    sizes = Sizes.smoke() if args.smoke else Sizes.full()
    if args.scale != 1.0:
        sizes = sizes.scaled(args.scale)
    if args.rounds:
        sizes = dataclasses.replace(sizes, rounds=args.rounds)
    systems = [s for s in args.systems.split(",") if s]
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = (set(systems) - set(SYSTEMS)) | (set(workloads) - set(WORKLOADS))
    if unknown or "tidemark" not in systems:
        p.error(f"unknown or missing names: {sorted(unknown) or 'tidemark must be included'}")
    workdir = Path(tempfile.mkdtemp(prefix="tidemark-bench-"))
    if args.out:
        out = args.out
    elif args.smoke:
        out = Path(tempfile.mkdtemp(prefix="tidemark-bench-report-")) / "benchmarks.md"
    else:
        out = REPO / "docs" / "benchmarks.md"
    chart = args.chart or out.parent / "benchmarks-peers.png"
    machine = report.machine_facts()
    print(f"bench: {'SMOKE ' if args.smoke else ''}run, sizes {sizes.as_dict()}", flush=True)
    print(f"bench: machine {machine}", flush=True)
    print(f"bench: temp dir {workdir}", flush=True)
    run: dict = {"errors": ["the suite did not finish"]}
    try:
        run = run_suite(sizes, workdir, systems, workloads, allow_install=not args.no_install)
        run["machine"] = machine
        run["machine_end_load"] = os.getloadavg()
        run["command"] = "python -m bench" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
        run["smoke"] = args.smoke
        print(report.console_table(run), flush=True)
        report.write_markdown(out, run, chart)
        written = report.write_chart(chart, run)
        report.write_curve_chart(report.curve_path(chart), run)
        if args.json:
            args.json.write_text(json.dumps(run, indent=1, default=str))
        print(f"bench: report written to {out}" + (f" and {chart}" if written else " (no chart: matplotlib "
                                                                                 "is not installed)"), flush=True)
        print(f"bench: done in {run['elapsed_s']:.0f} s", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if run["errors"] else 0
