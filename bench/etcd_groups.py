"""What controller mode asks of etcd for many broker groups, measured on a real etcd.

    python -m bench.etcd_groups                       # 100 groups of 3 brokers, 20 s steady, 10 takeovers
    python -m bench.etcd_groups --groups 100 --brokers 3 --seconds 20 --takeovers 10 --json out.json

Every broker here is what a broker in controller mode runs against etcd, in
this process: an `Election` (broker/cluster/election.py) with its own etcd
client. In each group the first broker wins, keeps its lease (a renewal every
third of the TTL) and records the group's in-sync set; the others watch the
master key and stand as candidates when it goes. The figures come from etcd's
own /metrics:
- keys held, and puts and lease renewals per second in the steady state;
- watchers;
- the time until every group has a master again, after `--takeovers`
  masters resign at once (their replicas stand, compare logs and one wins).
Not included: the brokers themselves, and etcd on more than one member.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aetcd

from tidemark.broker.cluster.election import Election, parse_controller

_TESTS = Path(__file__).resolve().parent.parent / "tests"
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))
from etcdproc import EtcdProcess  # noqa: E402  (the tests' etcd: Debian's etcd-server, installed once)

TTL_S = 3  # controller_lease_s's default


def metrics(etcd: EtcdProcess) -> dict[str, float]:
    """etcd's counters this bench reads, summed over their labels."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{etcd.port}/metrics", timeout=5).read().decode()
    wanted = {
        "keys": r"^etcd_debugging_mvcc_keys_total (\S+)",
        "puts": r"^etcd_mvcc_put_total (\S+)",
        "watchers": r"^etcd_debugging_mvcc_watcher_total (\S+)",
        "renewals": r'^grpc_server_msg_received_total\{[^}]*grpc_method="LeaseKeepAlive"[^}]*\} (\S+)',
        "proposals": r"^etcd_server_proposals_committed_total (\S+)",
    }
    return {name: sum(float(v) for v in re.findall(pattern, text, re.M)) for name, pattern in wanted.items()}


class Group:
    """One broker name: `brokers` Elections, the first the master."""

    def __init__(self, clients: list[aetcd.Client], name: str) -> None:
        self.elections = [Election(c, "Bench", name, i + 1, f"127.0.0.1:{20000 + i}", ttl_s=TTL_S)
                          for i, c in enumerate(clients)]
        self.master: Election | None = None
        self.tasks: list[asyncio.Task] = []
        self.mastered = asyncio.Event()

    async def start(self) -> None:
        first = self.elections[0]
        assert await first.campaign() is not None
        await first.publish_in_sync(frozenset(e.broker_id for e in self.elections))
        self._serve(first)
        for election in self.elections[1:]:
            self.tasks.append(asyncio.create_task(self._follow(election)))

    def _serve(self, election: Election) -> None:
        self.master = election
        self.mastered.set()
        self.tasks.append(asyncio.create_task(election.keep(lambda why: None)))

    async def _follow(self, election: Election) -> None:
        async for master in election.watch():
            if master is None and await election.campaign(log_end=1000 + election.broker_id) is not None:
                await election.publish_in_sync(frozenset(e.broker_id for e in self.elections))
                self._serve(election)
                return

    async def resign(self) -> None:
        self.mastered.clear()
        old, self.master = self.master, None
        self.tasks[0].cancel()
        await old.resign()


async def run(args: argparse.Namespace, etcd: EtcdProcess) -> dict:
    [(host, port)] = parse_controller(etcd.url)
    clients = [aetcd.Client(host, port, timeout=10) for _ in range(args.groups * args.brokers)]
    for client in clients:
        await client.connect()
    groups = [Group(clients[g * args.brokers:(g + 1) * args.brokers], f"broker-{g}") for g in range(args.groups)]
    try:
        started = time.monotonic()
        await asyncio.gather(*(g.start() for g in groups))
        elected_s = time.monotonic() - started
        await asyncio.sleep(2 * TTL_S)  # watches open, a renewal round or two behind
        before, t0 = metrics(etcd), time.monotonic()
        await asyncio.sleep(args.seconds)
        after, seconds = metrics(etcd), time.monotonic() - t0
        rate = {k: round((after[k] - before[k]) / seconds, 1) for k in ("puts", "renewals", "proposals")}
        hit = groups[:args.takeovers]
        t1 = time.monotonic()
        await asyncio.gather(*(g.resign() for g in hit))
        await asyncio.wait_for(asyncio.gather(*(g.mastered.wait() for g in hit)), 60)
        takeover_s = time.monotonic() - t1
        return {"groups": args.groups, "brokers_per_group": args.brokers, "lease_s": TTL_S,
                "first_elections_s": round(elected_s, 2), "keys": int(after["keys"]),
                "watchers": int(after["watchers"]), "per_second": rate, "steady_seconds": round(seconds, 1),
                "takeovers": len(hit), "all_taken_over_s": round(takeover_s, 2)}
    finally:
        tasks = [task for g in groups for task in g.tasks]
        for task in tasks:
            task.cancel()
        # Their watches end before their clients; bounded, so that a watch stuck in etcd's client cannot
        # hold the run (and a test around it) past its results.
        await asyncio.wait([asyncio.ensure_future(asyncio.gather(*tasks, return_exceptions=True))], timeout=10)
        for client in clients:
            try:
                async with asyncio.timeout(5):
                    await client.close()
            except TimeoutError:
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--takeovers", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    etcd = EtcdProcess(Path(tempfile.mkdtemp(prefix="bench-etcd-")) / "etcd").start()
    try:
        # Bounded as a whole: elections, the steady phase, the takeovers (60 s at most) and the cleanup.
        budget = 60 + 4 * TTL_S + args.seconds + 60 + 20
        result = asyncio.run(asyncio.wait_for(run(args, etcd), budget))
    finally:
        etcd.stop()
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
