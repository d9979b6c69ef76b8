"""The floor under a Python gRPC broker's delivery: a bare grpc.aio relay with the broker's hops.

`python -m bench.latency_split --consumer relay` runs it beside Tidemark in the
same rounds. What it relays is what the broker's delivery path moves at a
fixed rate, and nothing more:
- a producer process writes 1 KiB messages on one stream as they fall due, with
  the Tidemark producer's natural batching: a message that falls due while a
  request is unanswered waits, and goes with the others that waited in the next
  request once the answer comes (`--relay-batching none`: one request a message);
- the server (grpc.aio on uvloop, as the broker; raw bytes, no protobuf, no
  store) answers each request on the same stream and writes it whole to the
  subscriber's stream, as the broker answers a Produce request and writes the
  fetch frame that carries its records;
- a subscriber process reads the frames (1 subscriber, as latency_split's
  consumer).

So the relay makes as many gRPC messages per message as Tidemark does (one
request, one answer and one frame per batch), and the difference between
its CPU per message and the broker's (or the clients') is what each
process's own work costs on top of Python gRPC's. Latency: e2e from the
message's due time to the subscriber's read; ack from the due time to the
answer's read by the producer (the first tenth of each run left out, as
latency_split does).
"""

from __future__ import annotations

import asyncio
import json
import struct
import subprocess
import sys
import time

from bench.procs import REPO, child_env, free_port, orphan_safe, own_cpu_s

HEAD = struct.Struct("<qq")  # due time (time.time_ns()), sequence
SIZE = 1024
SERVICE = "bench.Relay"


def _pct(values: list[int], q: float) -> float:
    kept = sorted(values[len(values) // 10:])
    return kept[min(len(kept) - 1, int(q * len(kept)))] / 1e6 if kept else float("nan")


def serve(port: int) -> None:
    """The relay: each request answered with its messages' heads and written whole to every subscriber. Its
    CPU from the first request to the last one read is kept for the Stats call (a getrusage a request,
    about 0.3 us a message, is counted in it)."""
    import grpc
    import uvloop

    subscribers: list[asyncio.Queue] = []
    stats = {"messages": 0, "cpu_s": 0.0, "first_cpu_s": None}

    async def produce(requests, context) -> None:
        answers: asyncio.Queue = asyncio.Queue()

        async def read() -> None:
            async for request in requests:
                if stats["first_cpu_s"] is None:
                    stats["first_cpu_s"] = own_cpu_s()
                answers.put_nowait(b"".join(request[i:i + HEAD.size] for i in range(0, len(request), SIZE)))
                for q in subscribers:
                    q.put_nowait(request)
                stats["messages"] += len(request) // SIZE
                stats["cpu_s"] = own_cpu_s() - stats["first_cpu_s"]
            answers.put_nowait(None)

        reader = asyncio.get_running_loop().create_task(read())
        while (answer := await answers.get()) is not None:
            await context.write(answer)
        await reader

    async def subscribe(request, context) -> None:
        frames: asyncio.Queue = asyncio.Queue()
        subscribers.append(frames)
        try:
            await context.write(b"")  # (registered: the subscriber says it is ready)
            while True:
                await context.write(await frames.get())
        finally:
            subscribers.remove(frames)

    async def report(request, context) -> bytes:
        return json.dumps(stats).encode()

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {
            "Produce": grpc.stream_stream_rpc_method_handler(produce),
            "Subscribe": grpc.unary_stream_rpc_method_handler(subscribe),
            "Stats": grpc.unary_unary_rpc_method_handler(report)})])
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    uvloop.run(main())


def produce(address: str, rate: int, seconds: float, natural: bool) -> dict:
    """Messages paced at `rate` on one stream (natural batching, or a request each); ack latency and CPU."""
    import grpc
    import uvloop

    async def main() -> dict:
        count = int(rate * seconds)
        pad = bytes(SIZE - HEAD.size)
        acks: list[int] = []
        waiting: list[bytes] = []
        unanswered = 0
        requests = 0
        async with grpc.aio.insecure_channel(address) as channel:
            call = channel.stream_stream(f"/{SERVICE}/Produce")()

            async def send(messages: list[bytes]) -> None:
                nonlocal unanswered, requests
                unanswered += 1
                requests += 1
                await call.write(b"".join(messages))

            async def read_answers() -> None:
                nonlocal unanswered
                while len(acks) < count:
                    answer = await call.read()
                    now = time.time_ns()
                    acks.extend(now - HEAD.unpack_from(answer, i)[0] for i in range(0, len(answer), HEAD.size))
                    unanswered -= 1
                    if waiting:
                        batch = waiting[:]
                        waiting.clear()
                        await send(batch)

            reader = asyncio.get_running_loop().create_task(read_answers())
            cpu = own_cpu_s()
            start = time.time_ns() + 200_000_000
            for i in range(count):
                due = start + i * 1_000_000_000 // rate
                wait = (due - time.time_ns()) / 1e9
                if wait > 0:
                    await asyncio.sleep(wait)
                message = HEAD.pack(due, i) + pad
                if natural and unanswered:
                    waiting.append(message)
                else:
                    await send([message])
            await reader
            cpu = own_cpu_s() - cpu
            await call.done_writing()
        return {"ack_p50_ms": _pct(acks, 0.5), "ack_p99_ms": _pct(acks, 0.99), "cpu_us_per_msg": cpu / count * 1e6,
                "messages_per_request": count / requests}

    return uvloop.run(main())


def subscribe(address: str, count: int, seconds: float) -> dict:
    """Read `count` messages (or until seconds pass); e2e latency and CPU from the first frame."""
    import grpc
    import uvloop

    async def main() -> dict:
        latencies: list[int] = []
        cpu = None
        async with grpc.aio.insecure_channel(address) as channel:
            call = channel.unary_stream(f"/{SERVICE}/Subscribe")(b"")
            await call.read()  # the server's empty frame: this subscriber gets every request from now on
            print("ready", flush=True)
            deadline = time.monotonic() + seconds
            while (frame := await call.read()) is not grpc.aio.EOF:
                if cpu is None:
                    cpu = own_cpu_s()
                now = time.time_ns()
                latencies.extend(now - HEAD.unpack_from(frame, i)[0] for i in range(0, len(frame), SIZE))
                if len(latencies) >= count or time.monotonic() > deadline:
                    break
            cpu = own_cpu_s() - cpu if cpu is not None else 0.0
            call.cancel()
        return {"received": len(latencies), "e2e_p50_ms": _pct(latencies, 0.5), "e2e_p99_ms": _pct(latencies, 0.99),
                "cpu_us_per_msg": cpu / max(1, len(latencies)) * 1e6}

    return uvloop.run(main())


def _child(role: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(orphan_safe([sys.executable, "-m", "bench.relay_floor", role, *args]),
                            stdout=subprocess.PIPE, text=True, env=child_env(), cwd=str(REPO))


def _ready(proc: subprocess.Popen, what: str) -> None:
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise SystemExit(f"relay {what} did not start")


def one_run(rate: int, seconds: float, natural: bool = True) -> dict:
    """A relay server, subscriber and producer for one paced run; latency_split's row of it."""
    import grpc

    port = free_port()
    address = f"127.0.0.1:{port}"
    server = _child("serve", str(port))
    try:
        _ready(server, "server")
        count = int(rate * seconds)
        sub = _child("subscribe", address, str(count), str(seconds + 30))
        _ready(sub, "subscriber")
        prod = _child("produce", address, str(rate), str(seconds), "natural" if natural else "none")
        p = json.loads(prod.communicate(timeout=seconds + 60)[0].strip().splitlines()[-1])
        s = json.loads(sub.communicate(timeout=60)[0].strip().splitlines()[-1])
        with grpc.insecure_channel(address) as channel:
            stats = json.loads(channel.unary_unary(f"/{SERVICE}/Stats")(b"", timeout=10))
    finally:
        server.kill()
        server.wait()
    if s["received"] != count or stats["messages"] != count:
        raise SystemExit(f"relay at {rate} msg/s: {stats['messages']} relayed, {s['received']} received of {count}")
    return {"received": s["received"], "e2e_p50_ms": s["e2e_p50_ms"], "e2e_p99_ms": s["e2e_p99_ms"],
            "send_to_store_mean_ms": float("nan"),
            "store_to_arrival_mean_ms": float("nan"), "cpu_us_per_msg": s["cpu_us_per_msg"],
            "producer_cpu_us_per_msg": p["cpu_us_per_msg"], "consumer_cpu_us_per_msg": s["cpu_us_per_msg"],
            "broker_cpu_us_per_msg": stats["cpu_s"] / count * 1e6, "ack_p50_ms": p["ack_p50_ms"],
            "ack_p99_ms": p["ack_p99_ms"], "messages_per_request": p["messages_per_request"]}


def main() -> None:
    role, *args = sys.argv[1:]
    if role == "serve":
        serve(int(args[0]))
    elif role == "produce":
        print(json.dumps(produce(args[0], int(args[1]), float(args[2]), args[3] == "natural")), flush=True)
    elif role == "subscribe":
        print(json.dumps(subscribe(args[0], int(args[1]), float(args[2]))), flush=True)
    else:
        raise SystemExit(f"bench.relay_floor: unknown role {role!r} (run it through `python -m bench.latency_split "
                         f"--consumer relay`)")


if __name__ == "__main__":
    main()
