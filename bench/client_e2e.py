"""`python -m bench.client_e2e`: producer process -> broker -> push consumer process (issue 4).

1 KiB messages on a topic of 8 queues, every client in its own process:
1. maximum end-to-end rate: the producer sends `--messages` as fast as it can
   (Producer.send_batch, 32 per request) while one PushConsumer (default
   settings) consumes them; rate = messages received / (last received - first send);
2. latency send -> listener (p50, p99) at a fixed rate of half the median
   maximum: the producer paces sends and stamps each message with the time it
   was due; the listener subtracts that from its clock (CLOCK_MONOTONIC is
   shared by every process on the machine); the first 0.5 s is warm-up.
Medians over `--rounds`; the result goes to the bench:client section of
docs/benchmarks.md (smoke mode: a temp file).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import report
from bench.harness import Context, _collect, _go_in_turn, _kill, _start_all, _wait_consumed
from bench.procs import REPO
from bench.tidemark_system import TidemarkServer
from bench.workloads import Sizes


def max_rate(ctx: Context, server: TidemarkServer, rnd: int, messages: int) -> dict:
    topic, group = f"e2e_max_{rnd}", f"e2e_max_g{rnd}"
    server.create_topic(topic, 8)
    consumer = ctx.worker("tidemark", "consume", topic=topic, group=group, instance=f"max{rnd}")
    producer = ctx.worker("tidemark", "produce", topic=topic, count=messages, batch=32)
    try:
        _start_all([consumer, producer])
        _go_in_turn([consumer])
        time.sleep(0.5)  # the consumer owns every queue before the first send
        producer.go()
        p = _collect([producer], 300)[0]
        _wait_consumed([consumer], messages, 10.0, 300)
        c = _collect([consumer], 60)[0]
    finally:
        _kill([consumer, producer])
    span = c["last"] - p["go"]
    return {"e2e_rate": c["count"] / span if span > 0 else 0.0, "producer_rate": p["count"] / p["elapsed_s"],
            "received": c["count"], "sent": p["count"]}


def latency(ctx: Context, server: TidemarkServer, rnd: int, rate: int, seconds: float) -> dict:
    topic, group = f"e2e_lat_{rnd}", f"e2e_lat_g{rnd}"
    server.create_topic(topic, 8)
    count = int(rate * seconds)
    consumer = ctx.worker("tidemark", "consume", topic=topic, group=group, instance=f"lat{rnd}", latency=True,
                          warmup=rate // 2)
    producer = ctx.worker("tidemark", "paced_produce", topic=topic, rate=rate, count=count)
    try:
        _start_all([consumer, producer])
        _go_in_turn([consumer])
        time.sleep(0.5)
        producer.go()
        p = _collect([producer], seconds + 120)[0]
        _wait_consumed([consumer], p["sent"], 5.0, 120)
        c = _collect([consumer], 60)[0]
    finally:
        _kill([consumer, producer])
    return {"p50_ms": c["p50_us"] / 1000, "p99_ms": c["p99_us"] / 1000, "achieved_rate": p["achieved_rate"],
            "received": c["count"], "sent": p["sent"], "requests": p.get("requests", 0)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.client_e2e", description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=100_000, help="messages per maximum-rate round")
    p.add_argument("--seconds", type=float, default=8.0, help="length of each fixed-rate latency round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="tiny counts, one round, report to a temp file")
    p.add_argument("--out", type=Path, help="markdown file (default docs/benchmarks.md; smoke: temp file)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir with logs")
    args = p.parse_args(argv)
    if args.smoke:
        args.messages, args.seconds, args.rounds = 2_000, 1.0, 1
    out = args.out or (Path(tempfile.mkdtemp(prefix="tidemark-e2e-report-")) / "benchmarks.md" if args.smoke
                       else REPO / "docs" / "benchmarks.md")
    workdir = Path(tempfile.mkdtemp(prefix="tidemark-e2e-"))
    machine = report.machine_facts()
    print(f"client_e2e: machine {machine}", flush=True)
    server = TidemarkServer(workdir).start()
    ctx = Context(Sizes(), workdir, {"tidemark": server}, None)
    t0 = time.monotonic()
    try:
        maxima = []
        for rnd in range(args.rounds):
            r = max_rate(ctx, server, rnd, args.messages)
            maxima.append(r)
            print(f"client_e2e: round {rnd + 1} max e2e {r['e2e_rate']:,.0f} msg/s (producer "
                  f"{r['producer_rate']:,.0f} msg/s, {r['received']:,}/{r['sent']:,} received)", flush=True)
        best = statistics.median(r["e2e_rate"] for r in maxima)
        rate = max(100, int(best / 2))
        lats = []
        for rnd in range(args.rounds):
            r = latency(ctx, server, rnd, rate, args.seconds)
            lats.append(r)
            print(f"client_e2e: round {rnd + 1} at {rate:,} msg/s: p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms "
                  f"(achieved {r['achieved_rate']:,.0f} msg/s, {r['received']:,}/{r['sent']:,} received, "
                  f"{r['requests']:,} send requests)", flush=True)
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    med = {k: statistics.median(r[k] for r in maxima) for k in ("e2e_rate", "producer_rate")}
    lmed = {k: statistics.median(r[k] for r in lats) for k in ("p50_ms", "p99_ms", "achieved_rate")}
    rows = [["max end-to-end rate (msgs/s)", med["e2e_rate"], ", ".join(f"{r['e2e_rate']:,.0f}" for r in maxima)],
            ["producer send rate in those runs (msgs/s)", med["producer_rate"],
             ", ".join(f"{r['producer_rate']:,.0f}" for r in maxima)],
            [f"latency p50 at {rate:,} msg/s (ms)", lmed["p50_ms"], ", ".join(f"{r['p50_ms']:.2f}" for r in lats)],
            [f"latency p99 at {rate:,} msg/s (ms)", lmed["p99_ms"], ", ".join(f"{r['p99_ms']:.2f}" for r in lats)]]
    command = "python -m bench.client_e2e" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    body = "\n".join([
        "### End to end: producer process -> broker -> push consumer process",
        "",
        f"`{command}`{' — SMOKE RUN, numbers meaningless' if args.smoke else ''}. 1 KiB messages, one topic of "
        f"8 queues, one producer process (Producer.send_batch, 32 per request, as fast as it goes) and one "
        f"PushConsumer process (default settings: 20 listener threads, listener batch 1). Maximum: "
        f"{args.messages:,} messages, rate = received / (last received - first send). Latency: send -> listener "
        f"at half the median maximum, {args.seconds:g} s per round, each message stamped with the time it was "
        f"due (a producer that falls behind shows as latency); messages due together share one request. "
        f"Medians of {args.rounds} rounds.",
        "",
        report.markdown_table(["Metric", "Median", "Rounds"], rows),
        "",
        f"Machine: {report.machine_line(machine)}. Took {time.monotonic() - t0:.0f} s.",
    ])
    report.write_client_part(out, "e2e", body)
    print(report.markdown_table(["Metric", "Median", "Rounds"], rows), flush=True)
    print(f"client_e2e: report written to {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
