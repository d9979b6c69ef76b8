"""`python -m bench.replica_reconnect`: how long a replica takes to copy again from a master back at its address.

    python -m bench.replica_reconnect                      # 3 rounds of down times 0.5, 2, 5 s
    python -m bench.replica_reconnect --down 1,4 --rounds 5 --json /tmp/reconnect.json

A master (`--replication async`) and its replica (`--master` naming it), throwaway children in a temp dir.
Each round kills the master (kill -9), leaves it down for a down time, and starts it again at the same port
and data dir; measured from the master's `broker_ready` log line to the replica's next
`replication_connected` line (both processes stamp their logs in UTC on one machine). A sync master takes
no sends until a replica is connected, and in controller mode a replica can be elected only once its master
recorded it in sync after a restart, so this wait is time without writes or without a standby.

Run with another tree's interpreter (`/tmp/base/.venv/bin/python -m bench.replica_reconnect`, from this
tree) to measure that tree's broker: the brokers are started with the interpreter that runs this.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

_TESTS = Path(__file__).resolve().parent.parent / "tests"
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

from brokerproc import BrokerProcess  # noqa: E402

_STAMP = re.compile(r"^(\S+Z) .*event=(broker_ready|replication_connected)\b", re.M)


def _stamps(text: str, event: str) -> list[float]:
    return [datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
            for m in _STAMP.finditer(text) if m.group(2) == event]


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout_s:g} s")
        time.sleep(0.02)


def measure(down_times: list[float], rounds: int, workdir: Path) -> dict[str, list[float]]:
    """Seconds from the master's restart (ready) to the replica's reconnection, per down time."""
    master = BrokerProcess(workdir / "master", args=("--replication", "async")).start()
    replica = BrokerProcess(workdir / "replica", args=("--broker-id", "1", "--master", master.address)).start()
    results: dict[str, list[float]] = {f"{d:g}": [] for d in down_times}
    try:
        _wait_for(lambda: _stamps(replica.log_text(), "replication_connected"), 30, "first connection")
        for _ in range(rounds):
            for down in down_times:
                connected = len(_stamps(replica.log_text(), "replication_connected"))
                master.kill()
                time.sleep(down)
                master.start()
                _wait_for(lambda n=connected: len(_stamps(replica.log_text(), "replication_connected")) > n,
                          60, "reconnection")
                ready = _stamps(master.log_text(), "broker_ready")[-1]
                back = _stamps(replica.log_text(), "replication_connected")[-1]
                results[f"{down:g}"].append(round(back - ready, 3))
                print(f"down {down:g} s: reconnected {back - ready:.3f} s after the master was ready", flush=True)
    finally:
        replica.kill()
        master.kill()
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.replica_reconnect", description=__doc__.split("\n\n")[0])
    p.add_argument("--down", default="0.5,2,5", help="comma-separated seconds the master stays down")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    down = [float(x) for x in args.down.split(",") if x.strip()]
    with tempfile.TemporaryDirectory(prefix="tidemark-reconnect-") as tmp:
        results = measure(down, args.rounds, Path(tmp))
    print("| master down s | rounds | median s | max s |\n|---|---|---|---|")
    for d, values in results.items():
        print(f"| {d} | {len(values)} | {statistics.median(values):.2f} | {max(values):.2f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
