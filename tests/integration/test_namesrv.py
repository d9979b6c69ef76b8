"""Name servers with real processes: brokers register, clients and the CLI find them, routes expire,
and clients keep working when name servers die."""

from __future__ import annotations

import json
import sys

import forkserver
import grpc
import pytest
from tlslib import SECURITY_ENV_KEYS
from workload import wait_until

from tidemark.client import (
    Admin,
    ConsumeFromWhere,
    Message,
    Producer,
    PullConsumer,
    TlsSettings,
    UnavailableError,
)
from tidemark.v1 import admin_pb2, namesrv_pb2, namesrv_pb2_grpc


def poll_until(consumer: PullConsumer, want: set[str], timeout: float = 30.0) -> list[str]:
    got: list[str] = []
    wait_until(lambda: got.extend(m.msg_id for m in consumer.poll(0.2)) or want <= set(got), timeout,
               f"{len(want)} messages", details=lambda: f"got {len(set(got))} of {len(want)}")
    return got


def cluster_names(admin: Admin) -> list[str]:
    return [b.broker_name for b in admin.cluster_list()]


@pytest.fixture
def two_by_two(namesrv_factory, broker_factory):
    """Two name servers and two brokers registering with both (every second)."""
    ns = [namesrv_factory(args=("--expiry-ms", "3000")), namesrv_factory(args=("--expiry-ms", "3000"))]
    csv = ",".join(n.address for n in ns)
    brokers = [broker_factory(name, args=("--namesrv", csv, "--register-interval-ms", "1000"))
               for name in ("broker-a", "broker-b")]
    return ns, brokers


def test_clients_find_brokers_through_name_servers_and_survive_losing_them(two_by_two):
    ns, brokers = two_by_two
    namesrv = tuple(n.address for n in ns)
    with Admin(namesrv=namesrv) as admin:
        assert cluster_names(admin) == ["broker-a", "broker-b"]
        admin.create_topic("Routed", 2)
        # The create is answered after the brokers registered the topic: its route is there at once.
        route = admin.route("Routed")
        assert [(d.broker_name, d.broker_addr) for d in route.queue_datas] == [
            ("broker-a", brokers[0].address), ("broker-b", brokers[1].address)]
    fast = dict(namesrv=namesrv, route_refresh_interval_s=0.3)
    with Producer(**fast) as producer:
        sent = [producer.send(Message("Routed", b"m%d" % i)) for i in range(40)]
        assert {r.message_queue.broker_name for r in sent} == {"broker-a", "broker-b"}
        consumer = PullConsumer(group="routed", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, **fast)
        consumer.subscribe("Routed")
        with consumer:
            poll_until(consumer, {r.msg_id for r in sent})

            ns[0].kill()  # one name server gone: the other answers
            more = [producer.send(Message("Routed", b"n%d" % i)) for i in range(20)]
            poll_until(consumer, {r.msg_id for r in more})
            late = PullConsumer(group="routed-late", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                                **fast)
            late.subscribe("Routed")
            with late:  # a new consumer still joins
                poll_until(late, {r.msg_id for r in sent + more})

            ns[1].kill()  # every name server gone: the last routes stay, long past their refresh interval
            last = [producer.send(Message("Routed", b"o%d" % i)) for i in range(20)]
            assert {r.message_queue.broker_name for r in last} == {"broker-a", "broker-b"}
            poll_until(consumer, {r.msg_id for r in last})
    with pytest.raises(UnavailableError, match="no name server answers"), Admin(namesrv=namesrv):
        pass  # a new client with no routes yet says why it cannot start


def test_a_silent_broker_expires_a_stopped_one_leaves_at_once_and_a_restarted_name_server_relearns(two_by_two):
    ns, brokers = two_by_two
    namesrv = (ns[1].address,)
    with Admin(namesrv=namesrv) as admin:
        admin.create_topic("Expiring", 1)
        brokers[1].kill()  # kill -9: no unregister; gone after the 3 s expiry
        wait_until(lambda: cluster_names(admin) == ["broker-a"], 15, "broker-b to expire")
        assert [d.broker_name for d in admin.route("Expiring").queue_datas] == ["broker-a"]
        assert "event=broker_expired" in ns[1].log_text()

        brokers[1].start()
        wait_until(lambda: cluster_names(admin) == ["broker-a", "broker-b"], 15, "broker-b to register again")
        brokers[1].stop()  # a graceful stop unregisters: gone before any expiry could remove it
        assert cluster_names(admin) == ["broker-a"]

    ns[0].kill()
    ns[0].start()  # the same port, an empty table: filled again by the next registration
    wait_until(lambda: registered(ns[0].address) == ["broker-a"], 10, "broker-a registered with the new name server")


def registered(address: str) -> list[str]:
    with grpc.insecure_channel(address) as channel:
        info = namesrv_pb2_grpc.NameServerServiceStub(channel).GetClusterInfo(namesrv_pb2.GetClusterInfoRequest(),
                                                                              timeout=5)
    return [b.broker_name for b in info.brokers]


def test_the_cli_lists_the_cluster_and_routes_through_name_servers(two_by_two):
    ns, brokers = two_by_two
    cli = [sys.executable, "-m", "tidemark.client.cli.main"]
    csv = ",".join(n.address for n in ns)
    created = forkserver.run([*cli, "topic", "create", "CliRouted", "--queues", "3", "--namesrv", csv],
                             capture_output=True, text=True, timeout=60)
    assert created.returncode == 0, created.stderr
    listed = forkserver.run([*cli, "cluster", "list", "--json"], capture_output=True, text=True, timeout=60,
                            env={**_env(), "TIDEMARK_NAMESRV": csv})
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["broker"], r["id"], r["role"], r["address"], r["topics"]) for r in rows] == [
        ("broker-a", 0, "master", brokers[0].address, 1), ("broker-b", 0, "master", brokers[1].address, 1)]
    assert all(r["cluster"] == "DefaultCluster" and r["registered_ago_s"] < 10 for r in rows)
    route = forkserver.run([*cli, "topic", "route", "CliRouted", "--json", "--namesrv", csv],
                           capture_output=True, text=True, timeout=60)
    assert [(r["broker"], r["read_queues"], r["perm"]) for r in json.loads(route.stdout)] == [
        ("broker-a", 3, "RW"), ("broker-b", 3, "RW")]
    # Without name servers the same command lists the --broker list.
    direct = forkserver.run([*cli, "cluster", "list", "--json", "--broker", brokers[0].address],
                            capture_output=True, text=True, timeout=60, env=_env())
    assert [(r["broker"], r["address"]) for r in json.loads(direct.stdout)] == [("broker-a", brokers[0].address)]

    for bad in ("nohost", "h:0", ","):
        r = forkserver.run([*cli, "cluster", "list", "--namesrv", bad], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert "name server address" in r.stderr.splitlines()[-1]
    missing = forkserver.run([*cli, "topic", "route", "NoSuchTopic", "--namesrv", csv], capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 1 and missing.stderr.strip().splitlines() == [
        "tidemark: topic 'NoSuchTopic' is not served by any registered broker"]


def _env() -> dict[str, str]:
    import os
    return {k: v for k, v in os.environ.items() if k != "TIDEMARK_NAMESRV"}


def test_bad_registrations_get_invalid_argument_and_change_nothing(namesrv_factory, broker_factory):
    ns = namesrv_factory()
    broker = broker_factory("broker-a", args=("--namesrv", ns.address))
    with grpc.insecure_channel(ns.address) as channel:
        stub = namesrv_pb2_grpc.NameServerServiceStub(channel)
        before = stub.GetClusterInfo(namesrv_pb2.GetClusterInfoRequest(), timeout=5)
        assert [b.address for b in before.brokers] == [broker.address]
        good = dict(cluster_name="C", broker_name="broker-x", broker_id=0, address="127.0.0.1:1",
                    topics=[admin_pb2.TopicConfig(name="T", read_queue_nums=1, write_queue_nums=1)])
        for change, message in [
            (dict(broker_name=""), "broker name ''"),
            (dict(cluster_name="a\nb"), "cluster name"),
            (dict(address="127.0.0.1"), "is not host:port"),
            (dict(broker_id=-3), "broker id -3"),
            (dict(topics=[admin_pb2.TopicConfig(name="T", read_queue_nums=1),
                          admin_pb2.TopicConfig(name="T", read_queue_nums=1)]), "listed twice"),
            (dict(topics=[admin_pb2.TopicConfig(name="T\x00", read_queue_nums=1)]), "topic"),
        ]:
            request = namesrv_pb2.RegisterBrokerRequest(broker=namesrv_pb2.BrokerRegistration(**{**good, **change}))
            with pytest.raises(grpc.RpcError) as e:
                stub.RegisterBroker(request, timeout=5)
            assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT and message in e.value.details(), change
        garbage = channel.unary_unary("/tidemark.v1.NameServerService/RegisterBroker")
        with pytest.raises(grpc.RpcError) as e:
            garbage(b"\xff\xff\xff", timeout=5)
        assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as e:
            stub.GetRoute(admin_pb2.GetRouteRequest(topic="Nope"), timeout=5)
        assert e.value.code() is grpc.StatusCode.NOT_FOUND
        after = stub.GetClusterInfo(namesrv_pb2.GetClusterInfoRequest(), timeout=5)
        assert [(b.broker_name, b.address) for b in after.brokers] == [("broker-a", broker.address)]
    assert "Traceback" not in ns.log_text()


def test_name_servers_over_tls(namesrv_factory, broker_factory, pki, monkeypatch):
    for key in SECURITY_ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    tls_args = ("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key))
    ns = namesrv_factory(args=tls_args)
    broker = broker_factory("broker-a", args=(*tls_args, "--namesrv", ns.address, "--peer-tls-ca", str(pki.ca)))
    # A broker that does not trust the name server's certificate says so and is not registered.
    untrusting = broker_factory("broker-b", args=("--namesrv", ns.address, "--peer-tls-ca", str(pki.other_ca)))
    assert "does not take the registration" in untrusting.log_text()
    tls = TlsSettings(ca_file=str(pki.ca))
    with Admin(namesrv=(ns.address,), tls=tls) as admin:
        assert [(b.broker_name, b.address) for b in admin.cluster_list()] == [("broker-a", broker.address)]
        admin.create_topic("Secured", 1)
    with Producer(namesrv=(ns.address,), tls=tls) as producer:
        assert producer.send(Message("Secured", b"x")).message_queue.broker_name == "broker-a"
    with pytest.raises(UnavailableError, match=f"name server {ns.address} closed the connection during setup: "
                                               "the name server may require TLS"), Admin(namesrv=(ns.address,)):
        pass  # plaintext against the TLS name server: one clear error, no hang
