"""`python -m bench.rebalance`: consumer-group rebalance convergence and duplicates (issue 5).

For 2, 8 and 32 consumers of one group on a topic of 64 queues, with the
zero-duplicate handover (queue locks, the default) and RocketMQ-style
(queue_locking=False): the group forms, a producer sends 2,000 msg/s over
all queues, then a consumer joins and later leaves (gracefully), `--cycles`
times. Each join/leave is timed from the join call (PushConsumer.start()) or
leave call (shutdown()) to
- converged: every queue owned (in PULLING state) by exactly one client, and
  the ownership equals the AVG allocation of the new member list;
- first / all: the first moved queue, and every moved queue, has had a message
  consumed by its new owner (bounded by the per-queue arrival interval,
  64 queues / 2,000 msg/s ~ 32 ms).
Duplicates: deliveries beyond the first of any message over the whole run.

Consumers are PushConsumer clients spread over at most 4 host processes (plus
one process for the joining clients), 4 listener threads each, so that 32
consumers fit on 2 cores. A host polls its clients' ownership every 5 ms by
reading the consumer's queue-ownership table directly (the public
owned_queues() goes through the client's event loop, and at 32 clients
polling it would itself slow the rebalance down).
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import report
from bench.harness import Context
from bench.procs import REPO, Worker
from bench.tidemark_system import BROKER_NAME, TidemarkServer
from bench.workloads import Sizes, header

QUEUES = 64
RATE = 2_000
POLL_S = 0.005
THREADS = 4
MAX_HOSTS = 4


# -- host role: runs in a bench.worker process ------------------------------------------------------

def host(spec: dict, ctl) -> dict:
    from tidemark.client import ConsumeConcurrentlyStatus, ConsumeFromWhere, PushConsumer
    if os.environ.get("TIDEMARK_BENCH_LOG"):  # client logs in the worker's log file, for digging
        logging.basicConfig(level=os.environ["TIDEMARK_BENCH_LOG"], stream=sys.stderr,
                            format="%(asctime)s %(threadName)s %(name)s %(message)s")

    lock = threading.Lock()
    seqs: list[int] = []
    clients: dict[str, PushConsumer] = {}  # client id -> running consumer
    seen: dict[str, set[int]] = {}         # queues whose first message since acquisition was reported
    ctl.progress = lambda: len(seqs)

    def make(instance: str) -> PushConsumer:
        c = PushConsumer(group=spec["group"], brokers=spec["address"], instance_name=instance,
                         consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                         queue_locking=spec["locking"], consume_thread_max=THREADS)
        c.subscribe(spec["topic"])
        cid, mine = c.client_id, seen.setdefault(c.client_id, set())

        def listener(msgs, ctx):
            now = time.monotonic()
            with lock:
                seqs.extend(header(m.body)[1] for m in msgs)
                for m in msgs:
                    if m.queue_id not in mine:
                        mine.add(m.queue_id)
                        ctl.emit({"first": cid, "q": m.queue_id, "t": now})
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        c.register_message_listener(listener)
        return c

    def poll() -> None:
        last: dict[str, set[int]] = {}
        while not ctl.stopped.is_set():
            for cid, c in list(clients.items()):
                core = c._core
                try:
                    owned = {mq.queue_id for mq in core.ownership.pulling()} if core is not None else set()
                except RuntimeError:  # the loop thread changed the table while we read it
                    continue
                if owned != last.get(cid, set()):
                    with lock:
                        seen[cid].difference_update(owned ^ last.get(cid, set()))
                    last[cid] = owned
                    ctl.emit({"own": cid, "t": time.monotonic(), "qs": sorted(owned)})
            time.sleep(POLL_S)

    ctl.ready({"ids": {i: make(i).client_id for i in spec["instances"]}})
    ctl.wait_go()
    poller = threading.Thread(target=poll, name="ownership-poller", daemon=True)
    for instance in spec["instances"]:
        c = make(instance)
        clients[c.client_id] = c.start()
    poller.start()
    ctl.emit({"started": list(clients), "t": time.monotonic()})
    while not ctl.stopped.is_set():
        try:
            command = ctl.commands.get(timeout=0.1)
        except queue.Empty:
            continue
        verb, instance = command.split()
        if verb == "join":
            c = make(instance)
            ctl.emit({"event": "join", "cid": c.client_id, "t": time.monotonic()})
            clients[c.client_id] = c.start()
        elif verb == "leave":
            cid = next(k for k in clients if k.endswith("@" + instance))
            ctl.emit({"event": "leave", "cid": cid, "t": time.monotonic()})
            clients[cid].shutdown()
            ctl.emit({"own": cid, "t": time.monotonic(), "qs": []})
            del clients[cid]
    result = {"count": len(seqs)}
    with open(spec["seqs_path"], "w") as f:
        f.write("\n".join(map(str, seqs)))
    for c in clients.values():
        c.shutdown()
    return result


# -- the coordinator --------------------------------------------------------------------------------

class Group:
    """The host processes of one scenario and the ownership they report."""

    def __init__(self, ctx: Context, topic: str, group: str, n: int, locking: bool) -> None:
        self.ctx, self.topic = ctx, topic
        per = [[f"c{i}" for i in range(n) if i % min(n, MAX_HOSTS) == h] for h in range(min(n, MAX_HOSTS))]
        self.seqs = [ctx.workdir / f"seqs-{topic}-{h}.txt" for h in range(len(per) + 1)]
        specs = [*per, []]
        self.hosts = [ctx.worker("rebalance", "host", topic=topic, group=group, locking=locking, instances=insts,
                                 seqs_path=str(self.seqs[h])) for h, insts in enumerate(specs)]
        self.joiner = self.hosts[-1]
        self.ids: list[str] = []
        for w in self.hosts:
            self.ids += list(w.ready(120)["ids"].values())
        self.owners: dict[str, set[int]] = {}
        self.firsts: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
        self.inbox: queue.Queue = queue.Queue()
        self.results: dict[int, dict] = {}
        self.progress: dict[int, int] = {}
        for i, w in enumerate(self.hosts):
            threading.Thread(target=self._read, args=(i, w), daemon=True).start()
        from tidemark.client.consumer.allocate import strategy_by_name
        from tidemark.client.message import MessageQueue
        self._avg = strategy_by_name("AVG")
        self._mqs = [MessageQueue(topic, BROKER_NAME, q) for q in range(QUEUES)]
        self._group = group

    def _read(self, i: int, w: Worker) -> None:
        while (msg := w.lines.get()) is not None:
            self.inbox.put((i, msg))

    def expected(self, ids: list[str]) -> dict[str, set[int]]:
        ids = sorted(ids)
        return {c: {mq.queue_id for mq in self._avg.allocate(self._group, c, self._mqs, ids)} for c in ids}

    def pump(self, timeout: float) -> dict | None:
        try:
            i, msg = self.inbox.get(timeout=timeout)
        except queue.Empty:
            return None
        if "own" in msg:
            self.owners[msg["own"]] = set(msg["qs"])
        elif "first" in msg:
            self.firsts[(msg["first"], msg["q"])].append(msg["t"])
        elif "result" in msg:
            self.results[i] = msg["result"]
        elif "progress" in msg:
            self.progress[i] = msg["progress"]
        return msg

    def wait_converged(self, ids: list[str], timeout: float) -> float:
        """Monotonic time at which ownership first equalled AVG of ids (every queue exactly once)."""
        want = self.expected(ids)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.pump(0.05)
            if msg and "own" in msg and all(self.owners.get(c, set()) == want.get(c, set())
                                            for c in set(want) | set(self.owners)):
                return msg["t"]
        raise TimeoutError(f"no convergence to AVG of {len(ids)} consumers in {timeout}s")

    def change(self, host: Worker, command: str, ids_after: list[str]) -> dict:
        before = {q: c for c, qs in self.owners.items() for q in qs}
        host.send(command)
        while True:
            msg = self.pump(30)
            if msg is None:
                raise TimeoutError(f"no event after {command!r}")
            if msg.get("event"):
                t0 = msg["t"]
                break
        converged = self.wait_converged(ids_after, 60)
        after = {q: c for c, qs in self.expected(ids_after).items() for q in qs}
        moved = [q for q in range(QUEUES) if before.get(q) != after[q]]
        deadline = time.monotonic() + 10
        firsts: dict[int, float] = {}
        while time.monotonic() < deadline and len(firsts) < len(moved):
            for q in moved:
                ts = [t for t in self.firsts.get((after[q], q), []) if t >= t0]
                if ts:
                    firsts[q] = min(ts)
            self.pump(0.02)
        return {"converged_ms": (converged - t0) * 1000, "moved": len(moved),
                "first_ms": (min(firsts.values()) - t0) * 1000 if firsts else float("nan"),
                "all_ms": (max(firsts.values()) - t0) * 1000 if len(firsts) == len(moved) and firsts else float("nan")}

    def stop(self) -> int:
        for w in self.hosts:
            w.send("stop")
        deadline = time.monotonic() + 90
        while len(self.results) < len(self.hosts) and time.monotonic() < deadline:
            self.pump(0.5)
        for w in self.hosts:
            w.kill()
        return sum(r.get("count", 0) for r in self.results.values())

    def total_progress(self) -> int:
        self.progress = {}
        for w in self.hosts:
            w.send("progress")
        deadline = time.monotonic() + 10
        while len(self.progress) < len(self.hosts) and time.monotonic() < deadline:
            self.pump(0.1)
        return sum(self.progress.values())


def scenario(ctx: Context, server: TidemarkServer, n: int, locking: bool, cycles: int) -> dict:
    mode = "handover" if locking else "rocketmq"
    topic = f"rb_{n}_{mode}"
    server.create_topic(topic, QUEUES)
    g = Group(ctx, topic, f"rbg_{n}_{mode}", n, locking)
    producer = ctx.worker("tidemark", "paced_produce", topic=topic, rate=RATE, count=RATE * 3600)
    initial = list(g.ids)  # the joiners' host starts with no clients
    # The joiner's id sorts in the middle of the member list (AVG moves the queues of every member
    # after it), as a random ip@pid would on average; at the end it would move a single queue.
    mid = sorted(cid.split("@", 1)[1] for cid in initial)[(n - 1) // 2]
    joiners = [f"{mid}x{k}" for k in range(cycles)]
    try:
        producer.ready(60)
        t_go = time.monotonic()
        for w in g.hosts[:-1]:
            w.go()
        g.joiner.go()
        formed = (g.wait_converged(initial, 180) - t_go) * 1000
        producer.go()
        time.sleep(1.0)
        joins, leaves = [], []
        client_ip = initial[0].split("@")[0]
        for name in joiners:
            joins.append(g.change(g.joiner, f"join {name}", [*initial, f"{client_ip}@{name}"]))
            time.sleep(1.0)
            leaves.append(g.change(g.joiner, f"leave {name}", initial))
            time.sleep(1.0)
        producer.send("stop")
        sent = producer.result(60)["sent"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # let the backlog drain
            if g.total_progress() >= sent:
                break
            time.sleep(0.3)
        time.sleep(0.5)
        g.stop()
    finally:
        producer.kill()
        for w in g.hosts:
            w.kill()
    seen = collections.Counter(int(x) for p in g.seqs if p.exists() for x in p.read_text().split())
    return {"n": n, "mode": mode, "formed_ms": formed, "joins": joins, "leaves": leaves, "sent": sent,
            "duplicates": sum(v - 1 for v in seen.values() if v > 1), "missing": max(0, sent - len(seen))}


def _med(rows: list[dict], key: str) -> float:
    vals = [r[key] for r in rows if r[key] == r[key]]
    return statistics.median(vals) if vals else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rebalance", description=__doc__.splitlines()[0])
    p.add_argument("--consumers", default="2,8,32", help="comma list of group sizes")
    p.add_argument("--cycles", type=int, default=3, help="join/leave cycles per scenario")
    p.add_argument("--modes", default="handover,rocketmq")
    p.add_argument("--smoke", action="store_true", help="2 consumers, one cycle, report to a temp file")
    p.add_argument("--out", type=Path, help="markdown file (default docs/benchmarks.md; smoke: temp file)")
    p.add_argument("--keep", action="store_true")
    args = p.parse_args(argv)
    if args.smoke:
        args.consumers, args.cycles = "2", 1
    out = args.out or (Path(tempfile.mkdtemp(prefix="tidemark-rebalance-report-")) / "benchmarks.md"
                       if args.smoke else REPO / "docs" / "benchmarks.md")
    workdir = Path(tempfile.mkdtemp(prefix="tidemark-rebalance-"))
    machine = report.machine_facts()
    print(f"rebalance: machine {machine}", flush=True)
    server = TidemarkServer(workdir).start()
    ctx = Context(Sizes(), workdir, {"tidemark": server, "rebalance": server}, None)
    t0 = time.monotonic()
    runs = []
    try:
        for n in [int(x) for x in args.consumers.split(",")]:
            for mode in args.modes.split(","):
                r = scenario(ctx, server, n, mode == "handover", args.cycles)
                runs.append(r)
                print(f"rebalance: {n} consumers {mode}: formed in {r['formed_ms']:.0f} ms; join converged "
                      f"{[round(j['converged_ms']) for j in r['joins']]} ms, leave converged "
                      f"{[round(j['converged_ms']) for j in r['leaves']]} ms; duplicates {r['duplicates']}, "
                      f"missing {r['missing']} of {r['sent']}", flush=True)
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    rows = []
    for r in runs:
        for kind, changes in (("join", r["joins"]), ("leave", r["leaves"])):
            rows.append([str(r["n"]), r["mode"], kind, _med(changes, "converged_ms"), _med(changes, "first_ms"),
                         _med(changes, "all_ms"), _med(changes, "moved")])
    dups = [[str(r["n"]), r["mode"], r["formed_ms"], r["sent"], r["duplicates"], r["missing"]] for r in runs]
    head = ["Consumers", "Mode", "Change", "Converged ms", "1st msg by new owner ms", "All moved queues ms",
            "Queues moved"]
    command = "python -m bench.rebalance" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    body = "\n".join([
        "### Rebalance: convergence and duplicates (64 queues)",
        "",
        f"`{command}`{' — SMOKE RUN, numbers meaningless' if args.smoke else ''}. One group on a topic of "
        f"{QUEUES} queues, a producer at {RATE:,} msg/s (1 KiB), one consumer joining (its id sorts in the middle of "
        "the member list, so AVG moves the queues of every member after it) and then leaving gracefully, "
        f"{args.cycles} time(s) per row (medians). Consumers are PushConsumer clients in at most {MAX_HOSTS} "
        f"processes (+1 for the joiner), {THREADS} listener threads each, default intervals (rebalance 20 s, "
        "offset persist 5 s); the change is pushed through the membership watch. Times are from the join call "
        "(PushConsumer.start) or leave call (shutdown) to: every queue owned by exactly one client as AVG "
        "allocates (ownership polled every 5 ms); the first, and the last, moved queue consuming a message at "
        "its new owner. *handover* = zero-duplicate handover with queue locks (default); *rocketmq* = "
        "`queue_locking=False`.",
        "",
        report.markdown_table(head, rows),
        "",
        report.markdown_table(["Consumers", "Mode", "Group formed ms", "Messages sent", "Duplicates", "Missing"],
                              dups),
        "",
        "Group formed: from starting every consumer at once (in their processes) to the first convergence. "
        "Duplicates and missing messages are counted by sequence number over the whole run (formation and "
        "every join/leave).",
        "",
        f"Machine: {report.machine_line(machine)}. Took {time.monotonic() - t0:.0f} s.",
    ])
    print(report.markdown_table(head, rows))
    print(report.markdown_table(["Consumers", "Mode", "Group formed ms", "Messages sent", "Duplicates", "Missing"],
                                dups))
    report.write_client_part(out, "rebalance", body)
    print(f"rebalance: report written to {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
