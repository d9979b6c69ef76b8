"""`python -m bench.auth_cost`: what authentication (and TLS) costs the peer benchmark's Tidemark workloads.

Starts one broker with security off and one with `--auth` (and, with --tls, one
with TLS and auth), then runs `python -m bench`'s produce and consume workloads
against each in turn (off, auth, tls+auth, off, ...) for several rounds, with the
same worker processes and sizes as `make bench`. On the secured brokers the
clients sign every call as a plain user with only Pub/Sub on `Topic:bench*` and
Sub on `Group:bench*`, so each request also pays the ACL check. Prints the
medians, the ratio to security off and the brokers' CPU per 1,000 messages,
then what one check costs in the broker's AccessGuard (in process, no network):
the signature of a call and the ACL decision of a request or stream message.
Writes nothing; docs/benchmarks.md quotes a run by hand.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import tempfile
import time
import timeit
from pathlib import Path

from bench import harness, report
from bench.tidemark_system import CLIENT as CLIENT_USER
from bench.tidemark_system import Security, TidemarkServer
from bench.workloads import WORKLOAD_TITLES, Sizes

KEYS = {Security.OFF: "tidemark", Security.AUTH: "tidemark_auth", Security.TLS_AUTH: "tidemark_tls_auth"}
WORKLOADS = ("produce", "consume")


def run(sizes: Sizes, workdir: Path, securities: list[Security], workloads: list[str]) -> dict:
    servers = {KEYS[s]: TidemarkServer(workdir, data=f"data-{KEYS[s]}", security=s) for s in securities}
    for server in servers.values():
        server.start()
    ctx = harness.Context(sizes, workdir, servers, echo=None)
    results: dict = {w: {k: [] for k in servers} for w in workloads}
    try:
        for rnd in range(sizes.rounds):
            for workload in workloads:
                for key, server in servers.items():
                    started, cpu_before = time.monotonic(), server.server.cpu_seconds()
                    r = harness.RUNNERS[workload](ctx, key, rnd)
                    harness._add_cpu_per_message(r, server.server.cpu_seconds() - cpu_before)
                    if r.get("missing"):
                        raise RuntimeError(f"round {rnd + 1} {workload} {key}: {r['missing']} messages missing")
                    results[workload][key].append(r)
                    print(f"auth_cost: round {rnd + 1}/{sizes.rounds} {workload:<8} {key:<18} "
                          f"{report.brief(workload, r)}  ({time.monotonic() - started:.1f}s)", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    return harness.medians(results)


def table(medians: dict) -> str:
    """Markdown: per workload and security setting, msg/s, ratio to off, broker CPU ms per 1k messages."""
    lines = ["| workload | security | msgs/s (median) | vs off | broker CPU ms / 1k msgs |", "|---|---|---|---|---|"]
    for workload, by_key in medians.items():
        off = by_key.get("tidemark", {})
        for security, key in KEYS.items():
            m = by_key.get(key)
            if m is None:
                continue
            ratio = f"{m['rate'] / off['rate']:.2f}x" if off.get("rate") else "-"
            cpu = f"{m['server_cpu_ms_per_1k']:.2f}" if "server_cpu_ms_per_1k" in m else "-"
            lines.append(f"| {WORKLOAD_TITLES[workload]} | {security.value} | {m['rate']:,.0f} | {ratio} | {cpu} |")
    return "\n".join(lines)


def guard_costs(repeat: int = 20_000) -> dict[str, float]:
    """Microseconds per call of the broker's checks: signing (client side), verifying a signature (once
    per unary call or stream), and authorizing a Produce request or a Fetch open (per request or
    stream message), for a plain user with prefix rules."""
    from tidemark.broker.auth.acl import AclRule, Action, Decision, Resource
    from tidemark.broker.auth.guard import AccessGuard, on_group, on_topic
    from tidemark.broker.auth.store import AuthStore
    from tidemark.common.auth import Credentials, signed_metadata

    with tempfile.TemporaryDirectory() as config_dir:
        store = AuthStore(Path(config_dir))
        store.load()
        store.create_user(*CLIENT_USER)
        store.create_rule(AclRule(CLIENT_USER[0], Resource.parse("Topic:bench*"), frozenset({Action.PUB, Action.SUB}),
                                  Decision.ALLOW))
        store.create_rule(AclRule(CLIENT_USER[0], Resource.parse("Group:bench*"), frozenset({Action.SUB}),
                                  Decision.ALLOW))
        guard = AccessGuard(store)
        credentials = Credentials(*CLIENT_USER)
        metadata = dict(signed_metadata(credentials))
        user = guard.authenticate(metadata)
        produce = [on_topic("bench_r0", Action.PUB)]
        fetch = [on_group("bench_g0", Action.SUB), on_topic("bench_r0", Action.SUB)]
        timings = {"sign (client, per call)": lambda: signed_metadata(credentials),
                   "verify signature (per call or stream)": lambda: guard.authenticate(metadata),
                   "authorize Produce (per request)": lambda: guard.authorize(user, produce, "127.0.0.1"),
                   "authorize Fetch open (Sub on group and topic)": lambda: guard.authorize(user, fetch, "127.0.0.1")}
        return {name: min(timeit.repeat(fn, number=repeat, repeat=3)) / repeat * 1e6 for name, fn in timings.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.auth_cost", description=__doc__.splitlines()[0])
    p.add_argument("--tls", action="store_true", help="also run a broker with TLS and auth")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--scale", type=float, default=1.0, help="multiply message counts (200,000 per run)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma list of " + ",".join(WORKLOADS))
    p.add_argument("--smoke", action="store_true", help="tiny counts, one round")
    p.add_argument("--keep", action="store_true", help="keep the temp dir with broker and worker logs")
    args = p.parse_args(argv)
    sizes = Sizes.smoke() if args.smoke else dataclasses.replace(Sizes.full(), rounds=args.rounds)
    if args.scale != 1.0:
        sizes = sizes.scaled(args.scale)
    workloads = [w for w in args.workloads.split(",") if w]
    if set(workloads) - set(WORKLOADS):
        p.error(f"workloads are {', '.join(WORKLOADS)}")
    securities = [Security.OFF, Security.AUTH, *([Security.TLS_AUTH] if args.tls else [])]
    workdir = Path(tempfile.mkdtemp(prefix="tidemark-auth-cost-"))
    print(f"auth_cost: sizes messages={sizes.messages} consumers={sizes.consumers} queues={sizes.queues} "
          f"rounds={sizes.rounds}; machine {report.machine_facts()}; temp dir {workdir}", flush=True)
    try:
        medians = run(sizes, workdir, securities, workloads)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(table(medians), flush=True)
    for name, us in guard_costs().items():
        print(f"auth_cost: {name}: {us:.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
