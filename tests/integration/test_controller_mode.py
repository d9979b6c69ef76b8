"""Controller mode end to end: real brokers with `--controller etcd://...` and a real etcd. etcd elects the
master, a replica takes over by itself when the master is killed (no `tidemark broker promote`), nothing
acknowledged is lost, and the old master comes back as a replica of the new one."""

from __future__ import annotations

import contextlib
import time
import urllib.request

import pytest
from brokerproc import BrokerProcess, free_port
from faults.controller import in_sync
from faults.proxy import FaultProxy
from workload import create_topic, wait_until

from tidemark.client import (
    Admin,
    FailedPreconditionError,
    Message,
    MessageQueue,
    Producer,
    UnavailableError,
)

LEASE_S = 2
TOPIC = "Elected"


def status(address: str):
    with Admin(brokers=address) as admin:
        return admin.broker_status_at(address)


def commit(address: str, offset: int, *, sync: bool = True) -> None:
    with Admin(brokers=address) as admin:
        result = admin.commit("g", {MessageQueue(TOPIC, "broker-a", 0): offset}, sync=sync)
    assert result.applied == 1, result


def committed(address: str) -> int:
    with Admin(brokers=address) as admin:
        return admin.committed("g", MessageQueue(TOPIC, "broker-a", 0))


def holds_log_of(replica: str, master: str) -> bool:
    """Whether `replica` holds the whole log of `master` (and the master counts it connected). Not the
    replica's lag figure: that is the master's log end as of the last chunk the replica took, so what the
    master stored since is not in it, and it reads 0 while those sends are still on their way (a kill 0.3 s
    after the replica connected lost 300 acknowledged sends that way on a loaded machine, as async
    replication allows)."""
    m, r = status(master), status(replica)
    return m.replicas == 1 and r.commit_log_max_offset == m.commit_log_max_offset


def bodies_at(address: str, queues: int) -> set[bytes]:
    """Every message body a broker holds in TOPIC, read back by queue offset."""
    with Admin(brokers=address) as admin:
        return {admin.view_message(mq, offset).body
                for mq in (MessageQueue(TOPIC, "broker-a", q) for q in range(queues))
                for offset in range(admin.max_offset(mq))}


def test_a_replica_takes_over_by_itself_and_the_old_master_rejoins_as_its_replica(etcd, broker_factory, tmp_path):
    args = ("--controller", etcd.url, "--controller-lease-s", str(LEASE_S))
    first = broker_factory(args=args, data_dir=tmp_path / "first")
    assert (status(first.address).role, status(first.address).broker_id) == ("MASTER", 0)
    second = broker_factory(args=args, data_dir=tmp_path / "second")
    s = status(second.address)
    assert (s.role, s.master_addr) == ("REPLICA", first.address) and s.broker_id > 0
    with Admin(brokers=first.address) as admin, pytest.raises(FailedPreconditionError, match="master already"):
        admin.promote(first.address)  # a switchover names a replica (test_switchover.py)
    create_topic(first.address, TOPIC, 2)
    with Producer(brokers=first.address) as producer:
        acked = {b"before-%d" % i for i in range(300)}
        for body in sorted(acked):
            producer.send(Message(TOPIC, body))
    wait_until(lambda: holds_log_of(second.address, first.address), 15, "the replica to catch up")
    wait_until(lambda: len(in_sync(etcd)) == 2, 10, "the master to record the replica as in sync in etcd")

    first.kill()
    killed = time.monotonic()
    wait_until(lambda: status(second.address).role == "MASTER", LEASE_S + 10, "the replica to take over")
    took_over_s = time.monotonic() - killed
    print(f"took over {took_over_s:.2f} s after the kill (lease {LEASE_S} s)")
    assert took_over_s < LEASE_S + 3, took_over_s
    with Producer(brokers=second.address) as producer:
        after = {b"after-%d" % i for i in range(100)}
        for body in sorted(after):
            producer.send(Message(TOPIC, body))
    assert bodies_at(second.address, 2) >= acked | after, "an acknowledged message is missing after the failover"

    first.start()  # the old master: etcd says another is master now
    s = status(first.address)
    assert (s.role, s.master_addr) == ("REPLICA", second.address)
    wait_until(lambda: holds_log_of(first.address, second.address), 15, "the old master to catch up as a replica")
    assert bodies_at(first.address, 2) >= acked | after


def test_a_master_cut_off_from_etcd_stops_taking_writes_before_a_replica_can_be_elected(etcd, broker_factory,
                                                                                      tmp_path):
    args = ("--controller", etcd.url, "--controller-lease-s", str(LEASE_S))
    # (a metrics port: the in-process restart below must release it and bind it again)
    metrics_port = free_port()
    first = broker_factory(args=(*args, "--metrics-port", str(metrics_port)), data_dir=tmp_path / "first")
    second = broker_factory(args=args, data_dir=tmp_path / "second")
    create_topic(first.address, TOPIC, 1)
    with Producer(brokers=first.address) as producer:
        for i in range(3):
            producer.send(Message(TOPIC, f"m{i}".encode()))
    wait_until(lambda: len(in_sync(etcd)) == 2, 10, "the master to record the replica as in sync in etcd")
    commit(first.address, 1)
    etcd.pause()  # the master can no longer renew its lease; nobody can be elected either
    paused = time.monotonic()
    try:
        wait_until(lambda: not status(first.address).writable, LEASE_S + 2, "the master to stop taking writes")
        stopped_s = time.monotonic() - paused
        # Offsets are the master's too: one that may have been replaced takes no commit (the next master
        # would not have it, and a group's offset would step back), on every path.
        for sync in (True, False):
            with pytest.raises(UnavailableError, match="may no longer be the master"):
                commit(first.address, 2, sync=sync)
        assert committed(first.address) == 1
        time.sleep(max(0.0, paused + LEASE_S + 1.5 - time.monotonic()))  # the lease's own clock runs out
    finally:
        etcd.resume()
    assert stopped_s < LEASE_S, f"writes stopped {stopped_s:.2f} s after etcd stopped answering: too late"
    wait_until(lambda: status(second.address).role == "MASTER", LEASE_S + 10, "the replica to take over")
    assert committed(second.address) == 1
    commit(second.address, 3)
    # Once etcd answers that its lease expired, the old master restarts in its own process (nobody restarts
    # it) and rejoins as the new master's replica, holding what the new master holds.
    wait_until(lambda: _role_of(first.address) == ("REPLICA", second.address), 30,
               "the old master to rejoin as the new master's replica by itself")
    assert "event=controller_rejoin" in first.log_text() and first.proc.poll() is None
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as answer:
        assert answer.status == 200, "the restarted broker serves its metrics port again"
    wait_until(lambda: _committed_or_none(first.address) == 3, 15, "the rejoined broker to copy the group's offsets")


def _role_of(address: str) -> tuple[str, str] | None:
    try:
        s = status(address)
    except UnavailableError:  # restarting
        return None
    return s.role, s.master_addr


def _committed_or_none(address: str) -> int | None:
    try:
        return committed(address)
    except UnavailableError:  # a replica answers once it copied its master's offsets
        return None


def test_a_replica_whose_stream_from_its_master_is_down_answers_no_offset_query(etcd, broker_factory, tmp_path):
    """A group's offset never reads lower than one already read. Found by the fault checker (controller
    scenario, replication sync): the master came back under a new epoch at the same address and took
    commits before its replica reconnected, was killed, and the replica, which clients read from while
    the master is away, answered the offsets it had copied before (484 after the master's 489). A
    controller-mode replica takes no commits, so its copy is current only while its stream runs."""
    with _master_and_replica_behind_a_link(etcd, broker_factory, tmp_path) as (first, second, link):
        link.refuse(True)
        link.reset()  # the replica's stream ends, and its next ones are refused
        wait_until(lambda: "event=replication_interrupted" in second.log_text(), 15, "the replica's stream to end")
        commit(first.address, 9)
        assert committed(first.address) == 9  # read: no later read may see less
        with pytest.raises(UnavailableError, match="is not copying the consumer offsets"):
            committed(second.address)

        link.refuse(False)
        wait_until(lambda: _committed_or_none(second.address) == 9, 15, "the replica to copy the master's offsets again")


def test_a_replica_whose_stream_from_its_master_went_silent_answers_no_offset_query(etcd, broker_factory, tmp_path):
    """Review of the test above's mend: a link that drops packets, rather than resetting, ends no stream by
    itself, so the replica kept answering the copy from before the silence while its master took commits
    (7 after the master's 9). A stream counts as current only while the master's chunks keep coming (one a
    heartbeat at least), and is refused a few heartbeats into the silence."""
    with _master_and_replica_behind_a_link(etcd, broker_factory, tmp_path) as (first, second, link):
        link.blackhole(True)  # nothing moves and nothing ends: no reset, no refusal
        commit(first.address, 9)
        assert committed(first.address) == 9  # read: no later read may see less
        wait_until(lambda: _query_refused(second.address), 10, "the replica to refuse queries a few heartbeats in")
        with pytest.raises(UnavailableError, match="its stream is down or silent"):
            committed(second.address)

        link.blackhole(False)
        wait_until(lambda: _committed_or_none(second.address) == 9, 15, "the replica to copy the master's offsets again")


@contextlib.contextmanager
def _master_and_replica_behind_a_link(etcd, broker_factory, tmp_path):
    """A controller-mode master whose replica reaches it through a fault proxy (the address it advertises in
    etcd), a topic of 10 messages, and the group's offset 7 committed and copied by the replica."""
    port = free_port()
    link = FaultProxy(f"127.0.0.1:{port}", name="replica-link")  # the master's address in etcd: the replica's way
    args = ("--controller", etcd.url, "--controller-lease-s", str(LEASE_S))
    first = BrokerProcess(tmp_path / "first", port=port, args=(*args, "--advertise-addr", link.address))
    try:
        first.start()
        second = broker_factory(args=args, data_dir=tmp_path / "second")
        assert status(second.address).master_addr == link.address
        create_topic(first.address, TOPIC, 1)
        with Producer(brokers=first.address) as producer:
            for i in range(10):
                producer.send(Message(TOPIC, b"m%d" % i))
        commit(first.address, 7)
        wait_until(lambda: _committed_or_none(second.address) == 7, 15, "the replica to copy the master's offsets")
        yield first, second, link
    finally:
        first.kill()
        link.close()


def _query_refused(address: str) -> bool:
    try:
        answer = committed(address)
    except UnavailableError:
        return True
    assert answer == 7, f"the replica answered {answer}: it cannot have copied 9 through a silent link"
    return False


def test_a_broker_waiting_for_etcd_to_decide_its_role_stops_on_sigterm(etcd, tmp_path):
    """Regression (review): while its role was being decided (here: no master, and this broker not in the
    last in-sync set, so it waits for one that is) SIGTERM was ignored until a SIGKILL."""
    import asyncio
    import signal
    import subprocess
    import sys

    import aetcd

    from tidemark.broker.cluster.election import parse_controller

    async def last_master_left_without_us() -> None:
        [(host, port)] = parse_controller(etcd.url)
        async with aetcd.Client(host, port, timeout=5) as client:
            await client.put(b"/tidemark/DefaultCluster/broker-a/epoch", b"3")
            await client.put(b"/tidemark/DefaultCluster/broker-a/in_sync", b"[99]")

    asyncio.run(last_master_left_without_us())
    log = tmp_path / "waiting.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tidemark.broker.app", "--data-dir", str(tmp_path / "d"),
                                 "--port", str(free_port()), "--controller", etcd.url],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "event=controller_waiting" in log.read_text(), 30, "the broker to wait for its role")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_brokers_that_start_together_before_the_first_election_elect_the_longest_log(etcd, broker_factory,
                                                                                      tmp_path):
    """A group moved to controller mode with its data (epoch 0 in etcd): of the brokers that start
    together, the one whose log goes furthest becomes the master, even when a shorter one asks first (it
    would then cut the others' logs back to its own)."""
    import asyncio

    from tidemark.broker import config as broker_config
    from tidemark.broker.cluster.controller_mode import ControllerMode

    dirs = {"short": tmp_path / "short", "long": tmp_path / "long"}
    for name, count in (("short", 5), ("long", 50)):  # logs written by brokers without a controller
        broker = broker_factory(data_dir=dirs[name])
        create_topic(broker.address, TOPIC, 1)
        with Producer(brokers=broker.address) as producer:
            for i in range(count):
                producer.send(Message(TOPIC, b"%s-%d" % (name.encode(), i)))
        broker.stop()

    def config(name: str):
        return broker_config.load_config(env={}, overrides={
            "data_dir": dirs[name], "port": free_port(), "controller": etcd.url, "controller_lease_s": LEASE_S})

    async def decide_together():
        modes = {name: ControllerMode(config(name)) for name in dirs}
        try:
            short = asyncio.ensure_future(modes["short"].decide())
            await asyncio.sleep(0.2)  # the shorter log asks first
            return dict(zip(dirs, await asyncio.gather(short, modes["long"].decide()), strict=True))
        finally:
            for mode in modes.values():
                await mode.close()

    decided = asyncio.run(decide_together())
    assert decided["long"].broker_id == 0 and not decided["long"].master
    assert decided["short"].broker_id > 0 and decided["short"].master == decided["long"].address
