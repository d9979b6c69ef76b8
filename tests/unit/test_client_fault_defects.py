"""The pure rules behind the client's fault fixes (tests/integration/test_fault_defects_client.py runs
them against real processes): how a connection failure during setup is worded, when a topic is missing
rather than unknown, and how often a route is asked for again while no queue takes writes."""

from __future__ import annotations

import grpc
import pytest

from tidemark.client.errors import (
    NotFoundError,
    PermissionDeniedError,
    RequestTimeoutError,
    TlsHandshakeError,
    UnavailableError,
)
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.client.remoting.routes import RetryGate, merged_route
from tidemark.client.remoting.rpc_errors import from_rpc_error
from tidemark.client.types import QueueData, TopicRoute


class _Failed(grpc.RpcError):
    def __init__(self, details: str) -> None:
        self._details = details

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return self._details


_LAST = "failed to connect to all addresses; last error: "
# What grpc 1.8x reported in each situation (seen against real brokers, a FaultProxy and a socket that
# closes or resets every connection).
CUT = [
    # a proxy resetting new connections (FaultProxy.refuse), TLS and plain clients
    _LAST + "UNKNOWN: ipv4:127.0.0.1:9: Failed to connect to remote host: getsockopt(SO_ERROR): Connection reset by peer",
    _LAST + "UNAVAILABLE: ipv4:127.0.0.1:9: recvmsg:Connection reset by peer (104)",
    # reset while the TLS handshake was under way (a broker killed mid-handshake)
    _LAST + "UNAVAILABLE: ipv4:127.0.0.1:9: Handshake read failed (recvmsg:Connection reset by peer (104))",
    # closed in order before the TLS handshake completed
    _LAST + "UNAVAILABLE: ipv4:127.0.0.1:9: Handshake read failed (Socket closed)",
    _LAST + "UNAVAILABLE: ipv4:127.0.0.1:9: Delayed close due to in-progress write (sendmsg: Connection reset by "
            "peer (104))",
]
# A TLS broker closing on a plaintext client, an mTLS broker on a client without an acceptable certificate.
REFUSED = _LAST + "UNAVAILABLE: ipv4:127.0.0.1:9: Socket closed"


@pytest.mark.parametrize("details", CUT)
@pytest.mark.parametrize(("tls", "client_cert"), [(True, False), (True, True), (False, False), (None, False)])
def test_a_connection_cut_during_setup_is_not_blamed_on_tls(details, tls, client_cert):
    error = from_rpc_error(_Failed(details), address="127.0.0.1:9", tls=tls, client_cert=client_cert)
    text = str(error)
    assert isinstance(error, UnavailableError) and not isinstance(error, TlsHandshakeError) and error.retriable
    assert text.startswith("broker 127.0.0.1:9 closed the connection during setup (") and "down or restarting" in text
    assert "TLS" not in text and "certificate" not in text


@pytest.mark.parametrize(("tls", "client_cert", "hint"), [
    (False, False, "the broker may require TLS"),
    (True, False, "the broker may require a client certificate"),
    (True, True, "the broker may not trust this client's certificate"),
])
def test_an_orderly_close_after_the_handshake_keeps_its_hint(tls, client_cert, hint):
    error = from_rpc_error(_Failed(REFUSED), address="127.0.0.1:9", tls=tls, client_cert=client_cert)
    assert isinstance(error, UnavailableError) and not isinstance(error, TlsHandshakeError) and error.retriable
    assert str(error).startswith(f"broker 127.0.0.1:9 closed the connection during setup: {hint}")


def test_a_tls_alert_is_still_a_handshake_error():
    error = from_rpc_error(_Failed(_LAST + "UNKNOWN: ipv4:127.0.0.1:9: Tls handshake failed (TSI_PROTOCOL_FAILURE): "
                                           "SSL_ERROR_SSL: error:10000410:SSL routines:OPENSSL_internal:"
                                           "SSLV3_ALERT_HANDSHAKE_FAILURE"), address="127.0.0.1:9", tls=True)
    assert isinstance(error, TlsHandshakeError) and not error.retriable


def _route(topic: str, *names: str) -> TopicRoute:
    return TopicRoute(topic, tuple(QueueData(n, f"{n}:1", 2, 2, True, True) for n in names))


def test_a_topic_is_missing_only_when_every_broker_answered_so():
    missing = NotFoundError("no such topic")
    with pytest.raises(NotFoundError, match="does not exist on any broker"):
        merged_route("T", [("broker-a", missing), ("broker-b", missing)])
    down = UnavailableError("broker 127.0.0.1:1: failed to connect")
    with pytest.raises(UnavailableError) as e:
        merged_route("T", [("broker-a (127.0.0.1:1)", down), ("broker-b", missing)])
    assert e.value.retriable and not isinstance(e.value, NotFoundError)
    assert "broker-a (127.0.0.1:1) could not be reached" in str(e.value)
    assert "broker-b answered that the topic is not there" in str(e.value)
    with pytest.raises(UnavailableError, match="could not be reached"):  # a timeout is no answer either
        merged_route("T", [("broker-a", RequestTimeoutError("deadline"))])
    with pytest.raises(UnavailableError, match="could not be reached"):
        merged_route("T", [("broker-a", down)])


def test_reachable_queues_make_the_route_and_refusals_are_raised():
    down = UnavailableError("unreachable")
    route = merged_route("T", [("broker-b", _route("T", "broker-b")), ("broker-a", down),
                               ("broker-c", NotFoundError("no"))])
    assert [d.broker_name for d in route.queue_datas] == ["broker-b"]
    with pytest.raises(PermissionDeniedError):
        merged_route("T", [("broker-a", PermissionDeniedError("denied")), ("broker-b", down)])
    tls = TlsHandshakeError("TLS handshake with x failed")
    with pytest.raises(TlsHandshakeError):  # a setting to fix on every broker, not an outage
        merged_route("T", [("broker-a", tls)])


def test_the_retry_gate_lets_one_try_through_per_interval():
    now = [100.0]
    gate = RetryGate(0.25, clock=lambda: now[0])
    assert gate.wait_s("route") == 0.0
    assert gate.try_now("route") and not gate.try_now("route")
    assert gate.try_now("other")  # keys are independent
    now[0] += 0.1
    assert not gate.try_now("route") and gate.wait_s("route") == pytest.approx(0.15)
    now[0] += 0.15
    assert gate.try_now("route") and not gate.try_now("route")


def test_no_writable_queue_is_a_retriable_outage_saying_why():
    cluster = BrokerCluster([])
    cluster._routes["T"] = (0.0, TopicRoute("T", (QueueData("broker-a", "a:1", 2, 2, True, True),
                                                  QueueData("broker-b", "b:1", 2, 2, True, False))))
    cluster._down["broker-a"] = 0.0
    error = cluster.no_writable_queue("T", 1)
    assert isinstance(error, UnavailableError) and not isinstance(error, TlsHandshakeError) and error.retriable
    text = str(error)
    assert text.startswith("topic 'T' has no writable queue 1 now: the master of broker-a is unreachable")
    assert "broker-b takes no writes" in text and "retry later" in text
