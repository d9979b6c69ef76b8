"""A name server started with --broker-user takes registrations only from the brokers: an anonymous
or forged RegisterBroker cannot fence a master or put an address in a route (the attack the failover
issue found: one unsigned call with the master's name, id 0 and epoch 99 fenced an --auth master)."""

from __future__ import annotations

import grpc
import pytest
from workload import wait_until

from tidemark.client import Admin, Message, Producer
from tidemark.common.auth import Credentials, signed_metadata
from tidemark.v1 import admin_pb2, namesrv_pb2, namesrv_pb2_grpc

BROKER_USER = "brokers:brokers-secret-01"
ADMIN = Credentials("brokers", "brokers-secret-01")


def forged(epoch: int = 99) -> namesrv_pb2.RegisterBrokerRequest:
    return namesrv_pb2.RegisterBrokerRequest(broker=namesrv_pb2.BrokerRegistration(
        cluster_name="DefaultCluster", broker_name="broker-a", broker_id=0, address="127.0.0.1:1", version="0.1.0",
        readable=True, writable=True, epoch=epoch,
        topics=[admin_pb2.TopicConfig(name="Guarded", read_queue_nums=1, write_queue_nums=1)]))


@pytest.fixture
def guarded(namesrv_factory, broker_factory):
    ns = namesrv_factory(args=("--broker-user", BROKER_USER, "--expiry-ms", "3000"))
    broker = broker_factory(args=("--auth", "--init-user", BROKER_USER, "--namesrv", ns.address,
                                  "--register-interval-ms", "500"))
    return ns, broker


def route_addresses(ns) -> list[str]:
    with grpc.insecure_channel(ns.address) as channel:
        route = namesrv_pb2_grpc.NameServerServiceStub(channel).GetRoute(
            admin_pb2.GetRouteRequest(topic="Guarded"), timeout=5)
    return [q.broker_addr for q in route.queue_datas]


def test_unsigned_and_forged_registrations_are_refused_and_change_nothing(guarded):
    ns, broker = guarded
    with Admin(namesrv=ns.address, credentials=ADMIN) as admin:
        admin.create_topic("Guarded", 1)
    assert route_addresses(ns) == [broker.address]  # the broker's own, signed registration was taken
    with grpc.insecure_channel(ns.address) as channel:
        stub = namesrv_pb2_grpc.NameServerServiceStub(channel)
        for metadata in (None, signed_metadata(Credentials("brokers", "not-the-secret")),
                         signed_metadata(Credentials("intruder", "brokers-secret-01"))):
            with pytest.raises(grpc.RpcError) as e:
                stub.RegisterBroker(forged(), timeout=5, metadata=metadata)
            assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED
            assert "--broker-user" in e.value.details()
            with pytest.raises(grpc.RpcError) as e:
                stub.UnregisterBroker(namesrv_pb2.UnregisterBrokerRequest(
                    broker_name="broker-a", broker_id=0, address=broker.address), timeout=5, metadata=metadata)
            assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED
        info = stub.GetClusterInfo(namesrv_pb2.GetClusterInfoRequest(), timeout=5)  # reads stay open
        assert [(b.address, b.epoch) for b in info.brokers] == [(broker.address, 0)]
        # The broker registers again after the forgeries (a name server holding epoch 99 would fence it then).
        wait_until(lambda: stub.GetClusterInfo(namesrv_pb2.GetClusterInfoRequest(), timeout=5).brokers[0]
                   .last_update_ms > info.brokers[0].last_update_ms, 15, "the broker's next registration")
    assert route_addresses(ns) == [broker.address]
    # The master was not fenced: it still takes writes, through the name server's route.
    with Producer(namesrv=ns.address, credentials=ADMIN) as producer:
        assert producer.send(Message("Guarded", b"still the master")).message_queue.broker_name == "broker-a"
    assert "event=broker_fenced" not in broker.log_text()


def test_a_broker_with_another_user_is_not_registered_and_says_why(namesrv_factory, broker_factory):
    ns = namesrv_factory(args=("--broker-user", BROKER_USER))
    broker = broker_factory(args=("--auth", "--init-user", "other:other-secret-01", "--namesrv", ns.address,
                                  "--register-interval-ms", "500"))
    wait_until(lambda: "UNAUTHENTICATED" in broker.log_text(), 15, "the refused registration in the broker's log")
    with grpc.insecure_channel(ns.address) as channel:
        info = namesrv_pb2_grpc.NameServerServiceStub(channel).GetClusterInfo(
            namesrv_pb2.GetClusterInfoRequest(), timeout=5)
    assert list(info.brokers) == []
    assert "event=namesrv_ready" in ns.log_text() and "registrations=signed" in ns.log_text()


def test_a_bad_broker_user_is_one_line_and_exit_2(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "tidemark.broker.namesrv.server", "--port", "0",
                           "--broker-user", "nosecret"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "tidemark namesrv: broker_user must be NAME:SECRET (the brokers' init_user; the secret at least 8 characters)"]
