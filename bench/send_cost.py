"""`python -m bench.send_cost`: what one synchronous send costs, per call, against the gRPC floor.

Starts a broker (async flush) and the bare gRPC echo server (bench/grpc_echo.py),
then runs, in rounds, one client process per case doing N one-at-a-time calls of
1 KiB after a warm-up, and reads the server's CPU from /proc/PID/stat (per
thread with --threads) around them:

- `echo-unary`: a blocking client's unary call to the echo server (the floor
  `send` is held to);
- `echo-stream`: one message written and read back on a grpc.aio stream;
- `produce-stream`: one record batch on the broker's Produce stream from a bare
  grpc.aio client (the broker's own cost per stream message, no client library);
- `send`: `Producer.send` (idempotent, the default);
- `batch`: `Producer.send_batch` of 32 (N / 4 calls).

Prints each round and the medians: p50/p99 us, client CPU us per call
(getrusage of the client process) and server CPU us per call.
`--baseline DIR` runs every Producer case a second time per round with the
`tidemark` package in DIR (a copy of an older tree), interleaved with the
current one, on the same broker:

    python -m bench.send_cost --rounds 5 --calls 2000
    python -m bench.send_cost --cases send,batch --baseline /tmp/old --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.broker_bench import start_broker
from bench.grpc_echo import EchoServer
from bench.procs import REPO, child_env

CASES = ("echo-unary", "echo-stream", "produce-stream", "send", "batch")
TOPIC = "bench"
_TICK = os.sysconf("SC_CLK_TCK")

# The client side of a case, in its own process: warm up, say READY, wait for "go", run, print JSON.
_CLIENT = r'''
import asyncio, json, resource, sys, time
case, address, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
frame = bytes(1024)

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

def timed(one):
    for _ in range(200):
        one()
    print("READY", flush=True)
    sys.stdin.readline()
    c0, lat = cpu(), []
    for _ in range(n):
        t = time.perf_counter_ns()
        one()
        lat.append(time.perf_counter_ns() - t)
    return lat, cpu() - c0

def streamed(write, read, open_call):
    async def run():
        call = await open_call()
        async def one():
            t = time.perf_counter_ns()
            await write(call)
            await read(call)
            return time.perf_counter_ns() - t
        for _ in range(200):
            await one()
        print("READY", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        c0 = cpu()
        lat = [await one() for _ in range(n)]
        return lat, cpu() - c0
    return asyncio.run(run())

if case == "echo-unary":
    import grpc
    call = grpc.insecure_channel(address).unary_unary("/bench.Echo/Unary")
    lat, used = timed(lambda: call(frame))
elif case == "echo-stream":
    import grpc
    async def open_call():
        return grpc.aio.insecure_channel(address).stream_stream("/bench.Echo/Echo")()
    async def write(call):
        await call.write(frame)
    async def read(call):
        await call.read()
    lat, used = streamed(write, read, open_call)
elif case == "produce-stream":
    import grpc
    from tidemark.client import Message
    from tidemark.client.producer.encoding import encode_message
    from tidemark.common.protocol import MessageIdGenerator
    from tidemark.common.records import RecordBatchBuilder
    from tidemark.v1 import messaging_pb2, messaging_pb2_grpc
    ids, sent = MessageIdGenerator(), [0]
    async def open_call():
        return messaging_pb2_grpc.MessagingServiceStub(grpc.aio.insecure_channel(address)).Produce()
    async def write(call):
        _, props, tags_code = encode_message(Message("bench", frame), ids)
        builder = RecordBatchBuilder("bench", "127.0.0.1")
        builder.append(frame, props, tags_code=tags_code, flag=0, born_timestamp=0)
        sent[0] += 1
        await call.write(messaging_pb2.ProduceRequest(request_id=sent[0], topic="bench", queue_id=sent[0] % 4,
                                                      count=1, records=bytes(builder.buffer)))
    async def read(call):
        assert not (await call.read()).code
    lat, used = streamed(write, read, open_call)
else:
    from tidemark.client import Message, Producer
    producer = Producer(brokers=address).start()
    if case == "send":
        lat, used = timed(lambda: producer.send(Message("bench", frame)))
    else:
        lat, used = timed(lambda: producer.send_batch([Message("bench", frame) for _ in range(32)]))
    producer.shutdown()
lat.sort()
print(json.dumps({"p50": lat[len(lat) // 2] / 1000, "p99": lat[int(len(lat) * 0.99)] / 1000,
                  "client_us": used / n * 1e6}), flush=True)
'''


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds per thread of a process, by 'name:tid'."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        fields = raw.rsplit(")", 1)[1].split()
        out[f"{raw[raw.index('(') + 1:raw.rindex(')')]}:{tid}"] = (int(fields[11]) + int(fields[12])) / _TICK
    return out


def run_case(case: str, address: str, calls: int, server_pid: int, package: str | None, threads: bool) -> dict:
    env = child_env()
    if package:
        env["PYTHONPATH"] = os.pathsep.join((package, env["PYTHONPATH"]))
    proc = subprocess.Popen([sys.executable, "-c", _CLIENT, case, address, str(calls)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env, cwd=str(REPO))
    try:
        if proc.stdout.readline().strip() != "READY":
            raise SystemExit(f"{case}: the client did not start (exit {proc.wait()})")
        before, per_thread = cpu_s(server_pid), thread_cpu_s(server_pid) if threads else {}
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = json.loads(proc.stdout.readline())
        result["server_us"] = (cpu_s(server_pid) - before) / calls * 1e6
        if threads:
            after = thread_cpu_s(server_pid)
            result["server_threads_us"] = {k: round((v - per_thread.get(k, 0.0)) / calls * 1e6)
                                           for k, v in after.items() if v > per_thread.get(k, 0.0)}
    finally:
        proc.wait(timeout=60)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=2000, help="calls per case and round (batch: a quarter)")
    p.add_argument("--baseline", help="a directory holding an older `tidemark` package for the Producer cases")
    p.add_argument("--threads", action="store_true", help="also print the server's CPU per thread")
    args = p.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(CASES)
    if unknown:
        p.error(f"unknown cases: {', '.join(sorted(unknown))}")
    work = Path(tempfile.mkdtemp(prefix="send-cost-"))
    echo = EchoServer(work).start()
    (work / "data").mkdir()
    broker, address = start_broker(work / "data")
    results: dict[str, list[dict]] = {}
    try:
        from tidemark.client import Admin
        with Admin(brokers=address) as admin:
            admin.create_topic(TOPIC, 4)
        for rnd in range(args.rounds):
            line = [f"round {rnd + 1} load {os.getloadavg()[0]:.1f}"]
            for case in cases:
                echo_case = case.startswith("echo")
                variants = [("", None)]
                if args.baseline and case in ("send", "batch"):
                    variants = [(" (baseline)", args.baseline), ("", None)]
                    variants = variants if rnd % 2 == 0 else variants[::-1]
                for label, package in variants:
                    calls = args.calls // 4 if case == "batch" else args.calls
                    r = run_case(case, echo.address if echo_case else address, calls,
                                 (echo.server if echo_case else broker).proc.pid, package, args.threads)
                    results.setdefault(case + label, []).append(r)
                    line.append(f"{case}{label} p50 {r['p50']:.0f} cli {r['client_us']:.0f} srv {r['server_us']:.0f}"
                                + (f" {r['server_threads_us']}" if args.threads else ""))
            print(" | ".join(line), flush=True)
    finally:
        broker.stop()
        echo.stop()
    print(f"medians of {args.rounds} rounds (us per call):")
    floor = statistics.median(r["p50"] for r in results["echo-unary"]) if "echo-unary" in results else None
    for name, rs in results.items():
        med = {f: statistics.median(r[f] for r in rs) for f in ("p50", "p99", "client_us", "server_us")}
        ratio = f"  {med['p50'] / floor:.2f}x the unary echo" if floor and name != "echo-unary" else ""
        print(f"  {name:26} p50 {med['p50']:7.0f}  p99 {med['p99']:7.0f}  client CPU {med['client_us']:5.0f}"
              f"  server CPU {med['server_us']:5.0f}{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
