"""Broker memory under a flood of large requests, and after it.

    python -m bench.memory_flood                    # the broker's default limits
    python -m bench.memory_flood -- --max-request-bytes 67108864 --max-inflight-request-bytes 1073741824

Starts `python -m tidemark.broker.app` (extra broker flags after `--`), then from 26
client threads at once: 6 send 60 MiB batches (twice each), 8 send single
5 MiB messages (5 each), 12 send 3.9 MiB batches of two messages (6 each;
within the default limits). Reports the broker's anonymous RSS at rest, its
peak (VmHWM less file-backed pages), RSS each second for 5 s after the flood, and the status
counts. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

import grpc

from bench.broker_bench import machine
from tests.brokerproc import BrokerProcess
from tidemark.v1 import admin_pb2, admin_pb2_grpc, common_pb2, messaging_pb2, messaging_pb2_grpc

MiB = 1024 * 1024
FLOOD = ((60 * MiB, 16, 2, 6), (5 * MiB, 1, 5, 8), (int(3.9 * MiB), 2, 6, 12))  # size, parts, times, threads


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _flood_one(address: str, codes: dict[str, int], lock: threading.Lock, size: int, parts: int,
               times: int) -> None:
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 128 * MiB)]) as channel:
        stub = messaging_pb2_grpc.MessagingServiceStub(channel)
        body = os.urandom(size // parts)
        for _ in range(times):
            try:
                stub.SendMessage(messaging_pb2.SendMessageRequest(
                    topic="flood", messages=[common_pb2.Message(body=body)] * parts), timeout=120)
                code = "OK"
            except grpc.RpcError as e:
                code = e.code().name
            with lock:
                codes[code] = codes.get(code, 0) + 1


def flood(address: str) -> dict[str, int]:
    """Send FLOOD to topic `flood` (which must exist) from all its threads at once; statuses counted."""
    codes: dict[str, int] = {}
    lock = threading.Lock()
    threads = [threading.Thread(target=_flood_one, args=(address, codes, lock, size, parts, times))
               for size, parts, times, count in FLOOD for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("broker_args", nargs="*", help="extra broker flags (after --)")
    args = parser.parse_args()
    broker = BrokerProcess(Path(tempfile.mkdtemp(prefix="tidemark-flood-")) / "data",
                           args=tuple(args.broker_args)).start()
    pid = broker.proc.pid
    try:
        with grpc.insecure_channel(broker.address) as channel:
            admin_pb2_grpc.AdminServiceStub(channel).CreateTopic(admin_pb2.CreateTopicRequest(name="flood",
                                                                                              queue_nums=4))
        at_rest = status_kib(pid, "RssAnon")
        began = time.monotonic()
        codes = flood(broker.address)
        took = time.monotonic() - began
        peak = status_kib(pid, "VmHWM") - status_kib(pid, "RssFile")
        settled = []
        for _ in range(5):  # what the broker holds 1..5 s after the flood
            time.sleep(1)
            settled.append(status_kib(pid, "RssAnon") // 1024)
    finally:
        broker.stop()
    print(f"Broker memory under a request flood; flags {args.broker_args or 'defaults'}; {machine()}")
    print(f"anonymous RSS at rest {at_rest / 1024:.0f} MiB, peak {peak / 1024:.0f} MiB, "
          f"1..5 s after {settled} MiB; flood took {took:.1f} s; statuses {dict(sorted(codes.items()))}")


if __name__ == "__main__":
    main()
