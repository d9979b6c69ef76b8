"""`python -m bench.controller_in_sync`: how long etcd waits to hear that a replica is in sync again.

    python -m bench.controller_in_sync                    # 8 rounds
    python -m bench.controller_in_sync --rounds 12 --json /tmp/in_sync.json

Controller mode (`--controller`, a 2 s lease as the fault checker's controller scenario): an etcd, a master
and a replica, throwaway children in a temp dir. Each round kills the replica (kill -9), waits until the
master has taken it out of the in-sync set in etcd, starts it again, and measures from the replica's
`replication_connected` log line to the first read of etcd's in-sync set that holds it (read every 20 ms).
Until then the replica cannot be elected: a master lost meanwhile is waited for (it restarts and wins
again) instead of replaced.

Run with another tree's interpreter (`/tmp/base/.venv/bin/python -m bench.controller_in_sync`, from this
tree) to measure that tree's broker: the brokers are started with the interpreter that runs this.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

_TESTS = Path(__file__).resolve().parent.parent / "tests"
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

from brokerproc import BrokerProcess  # noqa: E402
from etcdproc import EtcdProcess  # noqa: E402
from faults.controller import in_sync  # noqa: E402

from bench.replica_reconnect import _stamps, _wait_for  # noqa: E402


def measure(rounds: int, workdir: Path) -> list[float]:
    etcd = EtcdProcess(workdir / "etcd").start()
    args = ("--replication", "sync", "--controller", etcd.url, "--controller-lease-s", "2")
    master = BrokerProcess(workdir / "master", args=args).start()
    replica = BrokerProcess(workdir / "replica", args=args).start()
    seconds = []
    try:
        member = json.loads((workdir / "replica" / "config" / "member.json").read_text())["memberId"]
        _wait_for(lambda: member in in_sync(etcd), 30, "the replica in sync")
        for _ in range(rounds):
            replica.kill()
            _wait_for(lambda: member not in in_sync(etcd), 30, "the replica out of the in-sync set")
            connected = len(_stamps(replica.log_text(), "replication_connected"))
            replica.start()
            _wait_for(lambda n=connected: len(_stamps(replica.log_text(), "replication_connected")) > n,
                      30, "the replica's connection")
            deadline = time.monotonic() + 30
            while member not in in_sync(etcd):
                if time.monotonic() > deadline:
                    raise TimeoutError("the replica never recorded in sync")
                time.sleep(0.02)
            recorded = time.time()
            back = _stamps(replica.log_text(), "replication_connected")[-1]
            seconds.append(round(recorded - back, 3))
            print(f"recorded in sync {recorded - back:.3f} s after the replica connected", flush=True)
    finally:
        replica.kill()
        master.kill()
        etcd.stop()
    return seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.controller_in_sync", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tidemark-in-sync-") as tmp:
        seconds = measure(args.rounds, Path(tmp))
    print(f"rounds {len(seconds)}: median {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s")
    if args.json:
        args.json.write_text(json.dumps(seconds, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
