"""The transport ceiling: a bare gRPC bidirectional-streaming echo on loopback.

Server: `python -m bench.grpc_echo --port P`, grpc.aio on uvloop like the
broker, one raw-bytes method (no protobuf, no work). Client roles (run in a
bench.worker process, Python grpc.aio like Tidemark's client):
- `stream`: frames of `per_frame` messages (`frame_bytes`, default per_frame
  x 1 KiB) written and read back concurrently on one stream; msgs/s counts
  the messages;
- `rtt`: one 1 KiB frame at a time, round trip p50/p99;
- `unary`: a blocking client's unary calls of 1 KiB (the floor of a synchronous send).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from bench.procs import Server, free_port
from bench.workloads import MESSAGE_SIZE, percentile

METHOD = "/bench.Echo/Echo"
UNARY = "/bench.Echo/Unary"
NAME = "gRPC echo (ceiling)"


def _handler():
    import grpc

    async def echo(requests, context):
        async for frame in requests:
            yield frame

    async def unary(frame, context):
        return frame

    return grpc.method_handlers_generic_handler("bench.Echo", {
        "Echo": grpc.stream_stream_rpc_method_handler(echo),
        "Unary": grpc.unary_unary_rpc_method_handler(unary)})


async def _serve(port: int) -> None:
    import grpc
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20),
                                      ("grpc.max_send_message_length", 64 << 20)])
    server.add_generic_rpc_handlers([_handler()])
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print(f"echo ready port={port}", flush=True)
    await server.wait_for_termination()


class EchoServer:
    name = NAME

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.server = Server("grpc-echo", [sys.executable, "-m", "bench.grpc_echo", "--port", str(self.port)],
                             workdir / "grpc-echo.log")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> EchoServer:
        self.server.start()
        self.server.wait_log(r"echo ready", 30)
        return self

    def stop(self) -> None:
        self.server.stop()

    def version(self) -> str:
        import grpc
        return f"grpcio {grpc.__version__}"

    def settings(self) -> dict[str, str]:
        return {"flush": "none (no storage)",
                "transport": "grpc.aio server on uvloop, raw bytes stream-stream method, Python grpc.aio client",
                "stream": "frames written and read concurrently on one stream",
                "rtt": "one 1 KiB frame in flight, round trip time",
                "unary": "a unary method called from a blocking (synchronous) client, one 1 KiB call at a time"}


def _channel(address: str):
    import grpc
    return grpc.aio.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 << 20),
                                                       ("grpc.max_send_message_length", 64 << 20)])


def stream(spec: dict, ctl) -> dict:
    per_frame, count = spec["per_frame"], spec["count"]
    frame = bytes(spec.get("frame_bytes") or MESSAGE_SIZE * per_frame)
    frames = max(1, count // per_frame)

    async def run() -> dict:
        async with _channel(spec["address"]) as channel:
            call = channel.stream_stream(METHOD)()
            await call.write(frame)  # warm the stream up
            await call.read()
            ctl.ready()
            start = await asyncio.get_running_loop().run_in_executor(None, ctl.wait_go)

            async def writer() -> None:
                for _ in range(frames):
                    await call.write(frame)
                await call.done_writing()

            task = asyncio.create_task(writer())
            got = 0
            while got < frames:
                await call.read()
                got += 1
            await task
            elapsed = time.monotonic() - start
        return {"count": frames * per_frame, "elapsed_s": elapsed}
    return asyncio.run(run())


def rtt(spec: dict, ctl) -> dict:
    frame = bytes(MESSAGE_SIZE)

    async def run() -> dict:
        async with _channel(spec["address"]) as channel:
            call = channel.stream_stream(METHOD)()
            for _ in range(100):
                await call.write(frame)
                await call.read()
            ctl.ready()
            await asyncio.get_running_loop().run_in_executor(None, ctl.wait_go)
            samples = []
            for _ in range(spec["count"]):
                t0 = time.monotonic_ns()
                await call.write(frame)
                await call.read()
                samples.append((time.monotonic_ns() - t0) / 1000)
            await call.done_writing()
        return {"count": len(samples), "p50_us": percentile(samples, 50), "p99_us": percentile(samples, 99)}
    return asyncio.run(run())


def unary(spec: dict, ctl) -> dict:
    """A synchronous (blocking) client's unary calls of 1 KiB, one at a time: the floor of a synchronous send."""
    import grpc

    from bench.workloads import round_trips
    frame = bytes(MESSAGE_SIZE)
    with grpc.insecure_channel(spec["address"]) as channel:
        call = channel.unary_unary(UNARY)
        call(frame)
        ctl.ready()
        ctl.wait_go()
        return {"count": spec["count"], **round_trips(lambda: call(frame), spec["count"])}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    try:
        import uvloop
        uvloop.run(_serve(args.port))
    except ImportError:
        asyncio.run(_serve(args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
