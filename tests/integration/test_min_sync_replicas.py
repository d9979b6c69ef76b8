"""--min-sync-replicas N (Kafka's min.insync.replicas, counting replicas): a sync master acknowledges a send
once N replicas hold it and refuses it, before storing anything, while fewer than N are in sync; the name
servers' cluster view shows each master's in-sync set. Checked with the history of every send against what
the master and both replicas hold."""

from __future__ import annotations

import json
import subprocess
import sys

import forkserver
from test_sync_replication_refusal import QUEUES, TOPIC, History, stored, wait_in_sync
from workload import wait_until

from tidemark.client import Admin, Producer


def test_two_replicas_required_refuse_with_one_store_with_two_and_show_the_in_sync_set(namesrv_factory,
                                                                                        broker_factory):
    ns = namesrv_factory()
    common = ("--namesrv", ns.address, "--register-interval-ms", "300")
    master = broker_factory("broker-a", args=("--replication", "sync", "--min-sync-replicas", "2",
                                              "--replication-timeout-ms", "1500", *common))
    first = broker_factory("broker-a", args=("--broker-id", "1", "--master", master.address, *common))
    with Admin(brokers=master.address) as admin:
        admin.create_topic(TOPIC, QUEUES)
    history = History()
    with Producer(brokers=master.address, retry_times_when_send_failed=0) as producer:
        for i in range(5):
            history.send(producer, b"one-replica-%d" % i)
    assert sorted(history.refused) == [b"one-replica-%d" % i for i in range(5)]
    assert all("fewer than 2 in-sync replicas" in str(e) for e in history.refused.values())
    assert stored(master.address) == {}

    second = broker_factory("broker-a", args=("--broker-id", "2", "--master", master.address, *common))
    wait_in_sync(master)
    with Producer(brokers=master.address, retry_times_when_send_failed=0) as producer:
        for i in range(30):
            history.send(producer, b"two-replicas-%d" % i)
    assert len(history.ok) == 30 and not history.unknown
    held = stored(master.address)
    history.check(held)
    for replica in (first, second):  # acknowledged means both hold it
        assert {b: w for b, w in stored(replica.address).items() if b in history.ok} == \
            {b: held[b] for b in history.ok}

    def in_sync() -> list | None:
        out = forkserver.run([sys.executable, "-m", "tidemark.client.cli.main", "cluster", "list", "--namesrv", ns.address,
                              "--json"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return next(r["in_sync"] for r in json.loads(out.stdout) if r["id"] == 0)

    wait_until(lambda: in_sync() == [1, 2], 15, "the master's in-sync set [1, 2] in cluster list")

    second.kill()  # one replica left: sends are refused again, and nothing refused is stored
    wait_until(lambda: in_sync() == [1], 30, "the in-sync set to lose the killed replica")
    with Producer(brokers=master.address, retry_times_when_send_failed=0) as producer:
        for i in range(5):
            history.send(producer, b"after-kill-%d" % i)
    assert all(b in history.refused for b in (b"after-kill-%d" % i for i in range(5)))
    history.check(stored(master.address))


def test_min_sync_replicas_needs_sync_replication_and_a_sane_number(tmp_path):
    for args, message in ((("--min-sync-replicas", "2"), "it needs replication sync"),
                          (("--replication", "sync", "--min-sync-replicas", "0"), "min_sync_replicas must be 1..16")):
        done = subprocess.run([sys.executable, "-m", "tidemark.broker.app", "--data-dir", str(tmp_path / "d"),
                               "--port", "0", *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
