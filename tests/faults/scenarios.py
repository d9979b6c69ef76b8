"""The fault scenarios: a cluster, a workload and a set of faults, each run from a seed.

Every scenario runs the same workload (below) against its cluster while the
nemesis draws faults from its set:

- producers: `prod` (4 threads of synchronous sends, 400/s, or 6 threads
  as fast as they go under resets; idempotence as the mode says) on topic T;
  under resets and kill also `burst` (send_async, bursts of 10 one-message
  batches to one queue: several batches of a queue in flight) on T; `fifo` (keyed sends: 8 keys over every queue of F, each key one queue,
  sent one after another) on topic F; in some scenarios `txn`
  (transactional: commits 3 of 4) on topic X;
- consumers: `push` (two concurrent PushConsumers) and `pull` (a lite
  PullConsumer) on T and X, `orderly` (an orderly PushConsumer) on F; in
  some scenarios `pop` (the official RocketMQ 5 client's SimpleConsumer,
  receive and ack through RocketMQ 5's protocol) on T;
- an observer reading every group's committed offsets twice a second.

Scenarios and their faults:
- resets: RST of every client connection, new connections refused, half-closed
  connections, 0.2-1 s of added latency;
- partition: the broker in its own network namespace, every packet between it
  and the clients dropped for up to 5 s (needs root; skipped elsewhere);
- kill: broker kill -9 and restart (flush sync or async);
- failover: a name server, a master and a replica (replication sync or async);
  the master paused (SIGSTOP) longer than the clients' timeouts, then killed
  with -9 and its replica promoted;
- namesrv: two name servers killed and restarted, alone or together, and the
  broker's registrations with them blackholed;
- replica_link: the replication link of a sync master reset and blackholed;
- disk_full: the broker's data dir on a 48 MiB tmpfs that fills up and frees;
- controller, takeover (controller.py): two brokers in controller mode on an etcd; the master killed with
  -9, paused (SIGSTOP), or cut from etcd, etcd paused; a replica takes over by itself, the old master
  restarts and rejoins as a replica;
- members: faults of one member of a group, not of the broker: an orderly group of two, each member
  behind a proxy of its own, one cut off (longer than the broker's lock expiry, so that its queues pass
  to the other) or reset, or cut off while the broker restarts (kill -9); the checker's `overlap` holds
  the group to one member at a time calling a listener with a queue's messages.

`mode` holds the choices that change what a run promises (flush,
replication, idempotence); `modes_for(scenario, rng)` draws them from the
seed unless the caller fixes them. docs/guarantees.md maps each mode to
what it promises; the Expect built here is that promise.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidemark.client import Admin, TidemarkError

from . import controller
from .checker import Expect
from .controller import Kit
from .nemesis import Fault
from .netns import available as netns_available
from .proxy import Direction
from .run import Outcome, Run
from .workloads import (
    Clients,
    PipelinedProducerWorkload,
    PopGroup,
    ProducerWorkload,
    PullGroup,
    PushGroup,
    TransactionalWorkload,
)

__all__ = ["SCENARIOS", "SHORT_DURATION", "SHORT_SET", "default_mode", "modes_for", "run_scenario", "skip_reason"]

TOPICS = {"T": 4, "F": 2, "X": 2}
GROUPS = {"push": ["T", "X"], "pull": ["T", "X"], "orderly": ["F"], "pop": ["T"]}
# Client settings of every workload: what users run, with retries that outlast a short fault.
CLIENT = {"request_timeout_s": 3.0}


def _workload(run: Run, clients: Clients, *, transactions: bool = False, prod_threads: int = 4,
              prod_rate: float = 400, pop_via: str = "", pipelined: bool = False) -> None:
    idem = run.mode.get("idempotence", True)
    run.create_topics(clients, TOPICS)
    run.workloads += [
        ProducerWorkload(clients, "prod", "T", threads=prod_threads, rate=prod_rate, idempotence=idem),
        ProducerWorkload(clients, "fifo", "F", threads=1, rate=40, idempotence=idem, fifo_keys=8),
        PushGroup(clients, "push", GROUPS["push"], consumers=2),
        PullGroup(clients, "pull", GROUPS["pull"]),
        PushGroup(clients, "orderly", GROUPS["orderly"], consumers=1, orderly=True),
    ]
    if transactions:
        run.workloads.append(TransactionalWorkload(clients, "txn", "X", rate=15))
    if pipelined:  # several batches of one queue on their way at once (send_async bursts)
        run.workloads.append(PipelinedProducerWorkload(clients, "burst", "T", idempotence=idem))
    if pop_via:
        run.workloads.append(PopGroup(clients, "pop", GROUPS["pop"], address=pop_via,
                                      home=str(run.workdir / "rmq-home")))


def _expect(run: Run, *, durable: bool) -> Expect:
    groups = {w.group for w in run.workloads if w.consumes}
    return Expect(no_loss=durable, no_duplicates=run.mode.get("idempotence", True),
                  orderly_groups=frozenset({"orderly"}), fifo=True,
                  drained={g: frozenset(t) for g, t in GROUPS.items() if g in groups})


def _execute(run: Run, clients: Clients, *, durable: bool, settle: Callable[[], object] | None = None) -> Outcome:
    groups = {w.group: GROUPS[w.group] for w in run.workloads if w.consumes}
    return run.execute(clients, _expect(run, durable=durable), topics=TOPICS, groups=groups, settle=settle)


def _broker_args(run: Run, *extra: str) -> tuple[str, ...]:
    # Short transaction timers: the checks of unfinished transactions happen within the run. As many checks
    # as the run has seconds and more: a half is rolled back once its checks run out (RocketMQ's rule), and
    # with 15 (the default, every 30 s) a partition of a few seconds rolled back transactions whose producer
    # had committed them and could not be asked meanwhile.
    return ("--flush", run.mode.get("flush", "async"), "--transaction-timeout-ms", "1000",
            "--transaction-check-interval-ms", "1000", "--transaction-check-max", "120", *extra)


def _settle_transactions(clients: Clients, timeout: float = 30.0) -> Callable[[], None]:
    """After the faults: until the broker has no transaction left open (it checks them every second past a
    1 s timeout), so that the read-back sees each one's outcome."""
    def settle() -> None:
        deadline = time.monotonic() + timeout
        with Admin(**clients.options()) as admin:
            while time.monotonic() < deadline:
                try:
                    if not admin.list_transactions():
                        return
                except TidemarkError:
                    pass  # the cluster still healing: ask again
                time.sleep(0.2)
    return settle


# -- scenarios --------------------------------------------------------------------------------------


def resets(run: Run) -> Outcome:
    node = run.broker(args=_broker_args(run))
    proxy = node.proxy
    run.faults += [
        Fault("reset", proxy.reset, weight=4),
        Fault("refuse", lambda: proxy.refuse(True), proxy.heal, hold=(0.3, 2.0)),
        Fault("half-close", lambda: proxy.half_close(Direction.UPSTREAM)),
        Fault("delay", lambda: proxy.delay(run.rng.uniform(0.2, 1.0)), proxy.heal, hold=(1.0, 3.0)),
    ]
    clients = run.clients(brokers=[node], **CLIENT)
    # As fast as 6 threads go: the acknowledged-but-lost producer needed resets under load to show.
    _workload(run, clients, transactions=True, prod_threads=6, prod_rate=0, pop_via=node.address, pipelined=True)
    return _execute(run, clients, durable=True, settle=_settle_transactions(clients))


def partition(run: Run) -> Outcome:
    net = run.network()
    host = net.host("broker")
    node = run.broker(args=_broker_args(run), proxied=False, host=host)
    run.faults.append(Fault("partition", lambda: net.partition(net.root, host), lambda: net.heal(net.root, host),
                            hold=(1.0, 5.0)))
    clients = run.clients(brokers=[node], **CLIENT)
    _workload(run, clients, transactions=True)
    return _execute(run, clients, durable=True, settle=_settle_transactions(clients))


def kill(run: Run) -> Outcome:
    node = run.broker(args=_broker_args(run))
    proc = node.process
    run.faults += [
        Fault("kill-9", proc.kill, proc.start, hold=(0.3, 2.0)),
        Fault("reset", node.proxy.reset),
    ]
    clients = run.clients(brokers=[node], **CLIENT)
    _workload(run, clients, transactions=True, pop_via=node.address, pipelined=True)
    return _execute(run, clients, durable=run.mode["flush"] == "sync", settle=_settle_transactions(clients))


def failover(run: Run) -> Outcome:
    ns = run.namesrv()
    replication = run.mode["replication"]
    master = run.broker(args=_broker_args(run, "--namesrv", ns.address, "--replication", replication))
    replica = run.broker(args=_broker_args(run, "--namesrv", ns.address, "--broker-id", "1",
                                           "--master", master.process.address))
    clients = run.clients(namesrv=[ns], **CLIENT)
    _wait_replica_registered(clients)

    def pause() -> None:
        if master.process.proc is not None:
            master.process.pause()

    def resume() -> None:
        if master.process.proc is not None:
            master.process.resume()

    def promote() -> str:
        with Admin(brokers=replica.address) as admin:
            info = admin.promote(replica.address)
        return f"promoted {replica.address}: epoch {getattr(info, 'epoch', '?')}"

    run.faults += [
        Fault("pause-master", pause, resume, hold=(3.5, 6.0), once=True),
        Fault("failover", master.process.kill, promote, hold=(0.5, 3.0), once=True),
    ]
    _workload(run, clients)
    return _execute(run, clients, durable=replication == "sync")


def namesrv(run: Run) -> Outcome:
    a, b = run.namesrv(), run.namesrv()
    # The broker registers through proxies of its own (its links to the name servers can be cut alone).
    links = [run.proxy(n.process.address, name=f"registration-{i}") for i, n in enumerate((a, b))]
    node = run.broker(args=_broker_args(run, "--namesrv", ",".join(p.address for p in links),
                                        "--register-interval-ms", "1000"))
    clients = run.clients(namesrv=[a, b], **CLIENT)

    def both_down() -> None:
        a.process.kill()
        b.process.kill()

    def both_up() -> None:
        a.process.start()
        b.process.start()

    def cut_registration() -> None:
        for link in links:
            link.blackhole(True)

    def heal_registration() -> None:
        for link in links:
            link.heal()

    run.faults += [
        Fault("kill-namesrv-a", a.process.kill, a.process.start, hold=(1.0, 4.0)),
        Fault("kill-namesrv-b", b.process.kill, b.process.start, hold=(1.0, 4.0)),
        Fault("kill-both-namesrv", both_down, both_up, hold=(1.0, 3.0)),
        Fault("cut-broker-namesrv", cut_registration, heal_registration, hold=(1.0, 4.0)),
        Fault("reset-broker", node.proxy.reset),
    ]
    _workload(run, clients)
    return _execute(run, clients, durable=True)


def replica_link(run: Run) -> Outcome:
    master = run.broker(args=_broker_args(run, "--replication", "sync"))
    link = run.proxy(master.process.address, name="replica-link")
    run.broker(args=_broker_args(run, "--broker-id", "1", "--master", link.address), proxied=False)
    run.faults += [
        Fault("reset-link", link.reset),
        Fault("blackhole-link", lambda: link.blackhole(True), link.heal, hold=(1.0, 4.0)),
        Fault("throttle-link", lambda: link.throttle(20_000), link.heal, hold=(1.0, 3.0)),
    ]
    clients = run.clients(brokers=[master], **CLIENT)
    _workload(run, clients)
    return _execute(run, clients, durable=True)


def disk_full(run: Run) -> Outcome:
    disk = run.disk(48 * 1024 * 1024)
    node = run.broker(args=_broker_args(run, "--commitlog-segment-size", str(1024 * 1024),
                                        "--consume-queue-entries-per-file", "10000"),
                      data_dir=disk.mount / "data")
    run.faults += [
        Fault("disk-full", lambda: disk.fill(0), disk.free, hold=(1.0, 4.0)),
        Fault("reset", node.proxy.reset),
    ]
    clients = run.clients(brokers=[node], **CLIENT)
    _workload(run, clients)
    return _execute(run, clients, durable=True)


def members(run: Run) -> Outcome:
    # Short locks and member expiry: a member cut off loses its queues within seconds (its hold lapses
    # after 1.5 s, the broker lets the lock go after 3 and forgets the member after 2); members renew and
    # heartbeat twice a second. Listeners slower than the producer (20 ms a call, 250 messages/s over two
    # queues): each member has seconds of messages fetched when it is cut off, more than the 3 s in which
    # its queues pass on, so a member that went on consuming would do so beside their next owner.
    node = run.broker(args=_broker_args(run, "--lock-expiry-ms", "3000", "--channel-expired-timeout-ms", "2000"),
                      proxied=False)
    links = [run.proxy(node.process.address, name=f"member-{i}") for i in range(2)]
    proc = node.process

    def cut(i: int) -> Callable[[], None]:
        return lambda: links[i].blackhole(True)

    def cut_and_restart() -> None:  # the member sees no broken stream: only its hold stops it
        links[0].blackhole(True)
        proc.kill()
        proc.start()

    run.faults += [
        Fault("cut-member-0", cut(0), links[0].heal, hold=(3.5, 7.0)),
        Fault("cut-member-1", cut(1), links[1].heal, hold=(3.5, 7.0)),
        Fault("reset-member", lambda: links[run.rng.randrange(2)].reset()),
        Fault("cut-member-0-and-restart", cut_and_restart, links[0].heal, hold=(3.5, 6.0)),
    ]
    clients = run.clients(brokers=[node], **CLIENT)
    run.create_topics(clients, {"F": TOPICS["F"]})
    run.workloads += [
        # (8 keys: 4 on each queue of F; the first 4 keys all hash to one queue)
        ProducerWorkload(clients, "fifo", "F", threads=1, rate=250, idempotence=run.mode.get("idempotence", True),
                         fifo_keys=8),
        PushGroup(clients, "orderly", GROUPS["orderly"], consumers=2, orderly=True, call_s=0.02,
                  addresses=[link.address for link in links], lock_renew_interval_s=0.5,
                  heartbeat_interval_s=0.5, rebalance_interval_s=1.0),
    ]
    # (the backlog left when the producer stops takes the two members a while: up to 60 s for 20 s of faults)
    return run.execute(clients, _expect(run, durable=run.mode["flush"] == "sync"), topics=["F"],
                       groups={"orderly": GROUPS["orderly"]}, drain_s=60.0)


def _wait_replica_registered(clients: Clients, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    with Admin(**clients.options()) as admin:
        while time.monotonic() < deadline:
            if len(admin.cluster_list()) >= 2:
                return
            time.sleep(0.1)
    raise TimeoutError("the replica did not register with the name server")


KIT = Kit(broker_args=_broker_args, client_settings=CLIENT, wait_registered=_wait_replica_registered,
          workload=_workload, execute=_execute)

SCENARIOS: dict[str, Callable[[Run], Outcome]] = {
    "resets": resets, "partition": partition, "kill": kill, "failover": failover, "namesrv": namesrv,
    "replica_link": replica_link, "disk_full": disk_full, "members": members,
    "controller": lambda run: controller.controller(run, KIT), "takeover": lambda run: controller.takeover(run, KIT),
}

# Mode choices per scenario (the first of each is the default of a short run).
MODES: dict[str, dict[str, tuple[Any, ...]]] = {
    "resets": {"idempotence": (True, False)},
    "partition": {"idempotence": (True, False)},
    "kill": {"flush": ("sync", "async"), "idempotence": (True, False)},
    "failover": {"replication": ("sync", "async"), "idempotence": (True, False)},
    "namesrv": {"idempotence": (True, False)},
    "replica_link": {"idempotence": (True, False)},
    "disk_full": {"idempotence": (True, False)},
    "controller": {"replication": ("sync", "async"), "idempotence": (True, False)},
    "takeover": {"fault": controller.TAKEOVER_FAULTS, "idempotence": (True,)},
    "members": {"flush": ("sync", "async"), "idempotence": (True, False)},
}

# The short set in `make test`: one run of each scenario in its first mode, seconds of faults each (the
# failover's pause holds 3.5 s at least, and the kill and promotion come after it).
SHORT_SET = ("resets", "partition", "kill", "failover", "replica_link", "disk_full", "namesrv", "members")
SHORT_DURATION = {"failover": 15.0}


def modes_for(scenario: str, rng, fixed: dict[str, Any] | None = None) -> dict[str, Any]:
    fixed = fixed or {}
    return {k: fixed[k] if k in fixed else rng.choice(v) for k, v in MODES[scenario].items()}


def skip_reason(scenario: str) -> str:
    """Why this machine cannot run the scenario ("" when it can)."""
    import os

    if scenario == "partition":
        ok, why = netns_available()
        return "" if ok else why
    if scenario == "disk_full" and os.geteuid() != 0:
        return "mounting a small tmpfs needs root"
    return ""


def run_scenario(scenario: str, seed: int, workdir: Path, *, duration: float = 20.0,
                 mode: dict[str, Any] | None = None) -> Outcome:
    import random

    chosen = modes_for(scenario, random.Random(seed ^ 0x5EED), mode)
    with Run(scenario, seed, workdir, duration=duration, mode=chosen) as run:
        return SCENARIOS[scenario](run)


def default_mode(scenario: str) -> dict[str, Any]:
    return {k: v[0] for k, v in MODES[scenario].items()}
