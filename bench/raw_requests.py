"""Undecodable and random request bytes against every RPC: the statuses, tracebacks and log lines.

    python -m bench.raw_requests [--count 2000] [--seed 1]

Starts a broker, sends --count requests of 1 to 40 random bytes, round-robin
over every method of the four services (tests/integration/rpc_fuzzlib.py), and
prints how many got each status, how many tracebacks the broker logged and how
many `request_undecodable` lines (at most one per 10 s). Asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import tempfile
from pathlib import Path

import grpc

from tests.brokerproc import BrokerProcess

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))
from rpc_fuzzlib import call, methods  # noqa: E402 - a test helper module, found on the path above


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    broker = BrokerProcess(Path(tempfile.mkdtemp(prefix="tidemark-raw-")) / "data").start()
    rng = random.Random(args.seed)
    every = methods(include_auth_only=True)
    codes: collections.Counter[str] = collections.Counter()
    try:
        with grpc.insecure_channel(broker.address) as channel:
            for i in range(args.count):
                method = every[i % len(every)]
                payload = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 41)))
                codes[call(channel, method, [payload], timeout=0.5 if method.server_streaming else 2.0).name] += 1
    finally:
        broker.stop()
    text = broker.log_text()
    print(f"{args.count} random requests over {len(every)} methods: {dict(codes.most_common())}; "
          f"tracebacks in the broker log: {text.count('Traceback')}; "
          f"request_undecodable lines: {text.count('event=request_undecodable')}")


if __name__ == "__main__":
    main()
