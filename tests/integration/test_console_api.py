"""The console's HTTP API against a real broker: bad input answers a status and one reason and changes
nothing, a read-only console refuses actions, the `tidemark console` command starts, serves and stops."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from workload import create_topic, produce, wait_until

from tidemark.client import Admin
from tidemark.client.console.server import Console, ConsoleSettings
from tidemark.client.settings import ClientSettings
from tidemark.common.auth import Credentials


@pytest.fixture(scope="module")
def console(module_broker):
    create_topic(module_broker.address, "Orders", 2)
    produce(module_broker.address, "Orders", 10, batch=1)
    c = Console(ClientSettings(brokers=module_broker.address), ConsoleSettings(port=0, sample_interval_s=0.2)).start()
    yield c
    c.shutdown()


@pytest.fixture
def broker(module_broker):
    return module_broker


_groups = iter(range(10**6))


@pytest.fixture
def group(console, module_broker) -> str:
    """A fresh group of this test, committed at 5 on both queues of Orders (which hold 5 messages each)."""
    name = f"billing-{next(_groups)}"
    with Admin(brokers=module_broker.address) as admin:
        admin.commit(name, {q: 5 for q in admin.fetch_message_queues("Orders")})
    return name


def call(console, path: str, body=None, *, content_type: str = "application/json", raw: bytes | None = None,
         headers: dict[str, str] | None = None):
    host, port = console.address
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    sent = {"Content-Type": content_type, "X-Tidemark-Console": "1"} if data is not None else {}
    req = urllib.request.Request(f"http://{host}:{port}{path}", data=data, headers={**sent, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def committed(address: str, group: str) -> list[int]:
    with Admin(brokers=address) as admin:
        return [s.consumer_offset for s in admin.consume_stats(group, "Orders")]


@pytest.mark.parametrize(("body", "status", "reason"), [
    ({"target": "earliest"}, 400, "a topic is required"),
    ({"topic": "Orders", "target": "sideways"}, 400, "target must be one of"),
    ({"topic": "Orders", "target": "offset", "value": 2**63}, 400, "64-bit integer"),
    ({"topic": "Orders", "target": "offset", "value": "7"}, 400, "64-bit integer"),
    ({"topic": "Orders", "target": "offset", "value": -1}, 400, "cannot be negative"),
    ({"topic": "Orders", "target": "earliest", "queue": 9}, 400, "has no queue 9"),
    ({"topic": "Orders", "target": "earliest", "queue": True}, 400, "queue must be a queue id"),
    ({"topic": "NoSuchTopic", "target": "earliest", "execute": True}, 404, "NoSuchTopic"),
    ({"topic": "Orders", "target": "earliest", "execute": "false"}, 400, "execute must be true or false"),
    ({"topic": "Orders", "target": "earliest", "queue": 0, "broker": 7}, 400, "broker must be a broker name"),
    ({"topic": "Orders", "target": "earliest", "queue": 0, "broker": "broker-z"}, 400, "broker-z"),
])
def test_bad_reset_requests_answer_a_reason_and_change_nothing(console, broker, group, body, status, reason):
    got_status, doc = call(console, f"/api/groups/{group}/reset", body)
    assert (got_status, reason in doc.get("error", "")) == (status, True), doc
    assert committed(broker.address, group) == [5, 5]


def test_requests_that_are_not_json_objects_are_refused(console, broker, group):
    guard = "send the request as application/json with X-Tidemark-Console: 1"
    assert call(console, f"/api/groups/{group}/reset", raw=b"topic=Orders",
                content_type="application/x-www-form-urlencoded") == (400, {"error": guard})
    assert call(console, f"/api/groups/{group}/reset", {"topic": "Orders", "target": "earliest", "execute": True},
                headers={"X-Tidemark-Console": "0"}) == (400, {"error": guard})
    assert call(console, f"/api/groups/{group}/reset", raw=b"{nope") == (400, {"error": "the request body is not JSON"})
    assert call(console, f"/api/groups/{group}/reset", raw=b"[1]") == (400, {"error": "the request body must be a JSON object"})
    assert call(console, f"/api/groups/{group}/reset", raw=b"x" * (65 * 1024))[0] == 400
    for body in ({}, {"all": "no"}, {"all": True, "msg_id": "AB"}):
        assert call(console, f"/api/dlq/{group}/requeue", body)[1]["error"] == \
            "requeue: give a msg_id, or all: true (not both)"
    assert committed(broker.address, group) == [5, 5]


def test_unknown_names_and_paths(console, group):
    assert call(console, "/api/groups/nobody")[0] == 404
    assert call(console, "/api/topics/NoSuchTopic")[0] == 404
    assert call(console, "/api/nothing") == (404, {"error": "no such page: /api/nothing"})
    assert call(console, "/../../etc/passwd")[0] == 404
    for path in ("/..%2Fstatic%2Fapp.js", "/%2Fetc%2Fhostname.js", "/static/app.js", "/app.js%00.html"):
        assert call(console, path)[0] == 404, path
    assert call(console, "/api/overview", headers={"Host": "rebound.example:8080"}) == \
        (403, {"error": "this console answers only to 127.0.0.1 or localhost, not 'rebound.example'"})
    assert call(console, "/api/overview", headers={"Host": "localhost"})[0] == 200
    assert call(console, f"/api/groups/{group}?since=yesterday") == (400, {"error": "not an integer: 'yesterday'"})
    assert call(console, "/api/messages?topic=Orders&queue=x&offset=1")[0] == 400


def test_group_view_reports_lag_and_its_age(console, broker, group):
    status, doc = call(console, f"/api/groups/{group}")
    assert status == 200
    assert (doc["state"], doc["lag"], doc["lag_s"]) == ("Empty", 0, 0.0)
    with Admin(brokers=broker.address) as admin:
        admin.commit(group, {q: 2 for q in admin.fetch_message_queues("Orders")})
    status, doc = call(console, f"/api/groups/{group}")
    assert [q["lag"] for q in doc["queues"]] == [3, 3] and doc["lag"] == 6
    assert doc["lag_s"] > 0  # the oldest unconsumed message was stored before this test began
    wait_until(lambda: len(call(console, f"/api/groups/{group}")[1]["history"]) >= 3, 10, "samples in the history")


def test_dry_run_changes_nothing_and_execute_moves_offsets(console, broker, group):
    status, doc = call(console, f"/api/groups/{group}/reset", {"topic": "Orders", "target": "earliest"})
    assert status == 200 and not doc["executed"]
    assert [(c["current"], c["new"]) for c in doc["changes"]] == [(5, 0), (5, 0)]
    assert committed(broker.address, group) == [5, 5]
    status, doc = call(console, f"/api/groups/{group}/reset",
                       {"topic": "Orders", "target": "shift", "value": -2, "execute": True})
    assert status == 200 and doc["executed"]
    assert committed(broker.address, group) == [3, 3]
    # One queue, named with its broker (a topic on several brokers repeats queue ids).
    status, doc = call(console, f"/api/groups/{group}/reset",
                       {"topic": "Orders", "target": "offset", "value": 1, "queue": 1, "broker": "broker-a",
                        "execute": True})
    assert status == 200 and [(c["broker"], c["queue"], c["new"]) for c in doc["changes"]] == [("broker-a", 1, 1)]
    assert committed(broker.address, group) == [3, 1]


def test_a_read_only_console_refuses_actions(broker, group):
    with Console(ClientSettings(brokers=broker.address), ConsoleSettings(port=0, read_only=True)) as c:
        assert call(c, "/api/session") == (200, {"user": None, "read_only": True})
        for path, body in [(f"/api/groups/{group}/reset", {"topic": "Orders", "target": "latest", "execute": True}),
                           (f"/api/dlq/{group}/requeue", {"all": True})]:
            status, doc = call(c, path, body)
            assert (status, doc) == (403, {"error": "the console was started with --read-only: no actions"})
        assert call(c, f"/api/groups/{group}")[0] == 200
    assert committed(broker.address, group) == [5, 5]


def test_console_command_serves_until_sigterm_and_a_taken_port_is_one_line(broker):
    proc = subprocess.Popen([sys.executable, "-m", "tidemark.client.cli.main", "console", "--broker", broker.address,
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.match(r"tidemark console on http://127\.0\.0\.1:(\d+)/", line)
        assert m, line
        port = int(m.group(1))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as resp:
            assert resp.status == 200 and b"<title>Tidemark console</title>" in resp.read()

        taken = subprocess.run([sys.executable, "-m", "tidemark.client.cli.main", "console", "--broker", broker.address,
                                "--port", str(port)], capture_output=True, text=True, timeout=60)
        assert taken.returncode == 1
        assert taken.stderr.strip().splitlines()[-1] == \
            f"tidemark: console cannot listen on 127.0.0.1:{port}: Address already in use"
        assert "Traceback" not in taken.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    with socket.socket() as s:  # nothing listens there any more (TIME_WAIT of the test's connection allowed)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_overview_shows_a_broker_that_does_not_answer(broker, console):
    with Console(ClientSettings(brokers=(broker.address, "127.0.0.1:1")), ConsoleSettings(port=0)) as c:
        status, doc = call(c, "/api/overview")
    assert status == 200
    assert {b["address"]: b["health"] for b in doc["brokers"]} == \
        {broker.address: "SERVING", "127.0.0.1:1": "UNREACHABLE (UNAVAILABLE)"}


def test_overview_of_a_cluster_lists_replicas_and_brokers_that_died(namesrv_factory, broker_factory):
    ns = namesrv_factory()
    common = ("--namesrv", ns.address, "--register-interval-ms", "500")
    master = broker_factory("broker-a", args=common)
    replica = broker_factory("broker-a", args=(*common, "--broker-id", "1", "--master", master.address))
    other = broker_factory("broker-b", args=common)
    with Admin(namesrv=(ns.address,)) as admin:
        wait_until(lambda: len(admin.cluster_list()) == 3, 15, "three brokers registered")
    with Console(ClientSettings(namesrv=(ns.address,)), ConsoleSettings(port=0)) as c:
        status, doc = call(c, "/api/overview")
        assert status == 200
        rows = {b["address"]: b for b in doc["brokers"]}
        assert {(b["name"], b["role"], b["health"]) for b in rows.values()} == \
            {("broker-a", "master", "SERVING"), ("broker-a", "replica", "SERVING"), ("broker-b", "master", "SERVING")}
        assert rows[replica.address]["lag_bytes"] >= 0 and rows[master.address]["uptime_ms"] > 0
        assert rows[master.address]["replicas"] == 1 and rows[master.address]["store_bytes"] >= 0
        other.kill()
        status, doc = call(c, "/api/overview")
        assert status == 200
        rows = {b["address"]: b for b in doc["brokers"]}
        assert rows[other.address]["health"].startswith("UNREACHABLE")
        assert rows[master.address]["health"] == "SERVING"


def test_a_refused_request_closes_its_connection_so_its_body_is_never_a_request(console, broker, group):
    """A cross-site form (text/plain) can carry a whole HTTP request in its body: with keep-alive, a server
    that refuses without reading the body would then parse and run that inner request."""
    inner = json.dumps({"topic": "Orders", "target": "earliest", "execute": True}).encode()
    smuggled = (f"POST /api/groups/{group}/reset HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"X-Tidemark-Console: 1\r\nContent-Length: {len(inner)}\r\n\r\n").encode() + inner
    outer = (f"POST /api/groups/{group}/reset HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
             f"Content-Length: {len(smuggled)}\r\n\r\n").encode() + smuggled
    with socket.create_connection(console.address, timeout=10) as sock:
        sock.sendall(outer)
        answer = b""
        while chunk := sock.recv(65536):  # the console closes the connection after its one answer
            answer += chunk
    assert answer.count(b"HTTP/1.1 ") == 1 and answer.startswith(b"HTTP/1.1 400"), answer
    assert committed(broker.address, group) == [5, 5]


def test_a_console_with_credentials_lends_them_for_reading_never_for_actions(broker_factory):
    broker = broker_factory(args=("--auth", "--init-user", "op:op-secret-001"))
    op = Credentials("op", "op-secret-001")
    with Admin(brokers=broker.address, credentials=op) as admin:
        admin.create_topic("Orders", 1)
        admin.commit("billing", {admin.fetch_message_queues("Orders")[0]: 0})
    settings = ClientSettings(brokers=broker.address, credentials=op)
    with Console(settings, ConsoleSettings(port=0)) as c:
        assert call(c, "/api/groups/billing")[0] == 200
        assert call(c, "/api/groups/billing/reset", {"topic": "Orders", "target": "latest"}) == \
            (401, {"error": "sign in to the console to act: its own credentials are only for reading"})
        stale = {"Cookie": "tidemark_console=forged-or-expired"}
        assert call(c, "/api/groups/billing", headers=stale) == \
            (401, {"error": "the console session expired or is unknown: sign in again"})
        assert call(c, "/api/login", {"access_key": "op", "secret_key": "wrong"})[0] == 401
        host, port = c.address
        req = urllib.request.Request(f"http://{host}:{port}/api/login", method="POST",
                                     data=json.dumps({"access_key": "op", "secret_key": "op-secret-001"}).encode(),
                                     headers={"Content-Type": "application/json", "X-Tidemark-Console": "1"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            cookie = resp.headers["Set-Cookie"].split(";")[0]
        status, doc = call(c, "/api/groups/billing/reset", {"topic": "Orders", "target": "latest"},
                           headers={"Cookie": cookie})
        assert status == 200 and not doc["executed"]
