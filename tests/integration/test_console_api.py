"""The console's HTTP API against a real broker: bad input answers a status and one reason and changes
nothing, a read-only console refuses actions, the `tidemark console` command starts, serves and stops."""

from __future__ import annotations

import json
import logging
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import forkserver
import pytest
from brokerproc import BrokerProcess
from workload import create_topic, produce, stored_messages, wait_until

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


OP = Credentials("op", "op-secret-001")


@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory):
    """A broker with --auth whose super user is op, holding topic Orders and group billing."""
    b = BrokerProcess(tmp_path_factory.mktemp("auth-broker") / "data",
                      args=("--auth", "--init-user", f"op:{OP.secret_key}")).start()
    with Admin(brokers=b.address, credentials=OP) as admin:
        admin.create_topic("Orders", 1)
        admin.commit("billing", {admin.fetch_message_queues("Orders")[0]: 0})
    yield b
    b.kill()


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
        assert call(c, "/api/session") == (200, {"user": None, "read_only": True, "sign_in_required": False})
        for path, body in [(f"/api/groups/{group}/reset", {"topic": "Orders", "target": "latest", "execute": True}),
                           (f"/api/dlq/{group}/requeue", {"all": True}), ("/api/topics", {"topic": "T", "queues": 1}),
                           ("/api/topics/Orders/delete", {}), ("/api/users", {"name": "u", "secret_key": "s"})]:
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

        taken = forkserver.run([sys.executable, "-m", "tidemark.client.cli.main", "console", "--broker", broker.address,
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
        wait_until(lambda: admin.broker_status_at(master.address).in_sync_replicas == (1,), 15,
                   "the replica in sync")
    with Console(ClientSettings(namesrv=(ns.address,)), ConsoleSettings(port=0)) as c:
        status, doc = call(c, "/api/overview")
        assert status == 200
        rows = {b["address"]: b for b in doc["brokers"]}
        assert {(b["name"], b["role"], b["health"]) for b in rows.values()} == \
            {("broker-a", "master", "SERVING"), ("broker-a", "replica", "SERVING"), ("broker-b", "master", "SERVING")}
        assert rows[replica.address]["lag_bytes"] >= 0 and rows[master.address]["uptime_ms"] > 0
        assert rows[master.address]["replicas"] == 1 and rows[master.address]["store_bytes"] >= 0
        assert (rows[master.address]["in_sync"], rows[replica.address]["in_sync"]) == ([1], [])
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


def test_a_console_with_credentials_lends_them_for_reading_never_for_actions(auth_broker):
    broker = auth_broker
    settings = ClientSettings(brokers=broker.address, credentials=OP)
    with Console(settings, ConsoleSettings(port=0)) as c:
        assert call(c, "/api/groups/billing")[0] == 200
        assert call(c, "/api/groups/billing/reset", {"topic": "Orders", "target": "latest"}) == \
            (401, {"error": "sign in to the console to act: its own credentials are only for reading"})
        stale = {"Cookie": "tidemark_console=forged-or-expired"}
        assert call(c, "/api/groups/billing", headers=stale) == \
            (401, {"error": "the console session expired or is unknown: sign in again"})
        assert call(c, "/api/login", {"access_key": "op", "secret_key": "wrong"})[0] == 401
        status, doc = call(c, "/api/groups/billing/reset", {"topic": "Orders", "target": "latest"},
                           headers=_login(c, "op", OP.secret_key))
        assert status == 200 and not doc["executed"]


# -- browsing, topics, dead letters, users and ACL rules (plan unless execute) ----------------------


def test_browse_a_topics_newest_messages_and_those_from_a_time(console, broker):
    create_topic(broker.address, "Browse", 2)
    produce(broker.address, "Browse", 6, batch=1, prefix="early-")
    status, doc = call(console, "/api/topics/Browse/messages?latest=4")
    assert status == 200 and doc["mode"] == "latest"
    newest = [m["stored_ms"] for m in doc["messages"]]
    assert len(newest) == 4 and newest == sorted(newest, reverse=True)
    early = call(console, "/api/topics/Browse/messages?latest=200")[1]["messages"]
    assert sorted(m["keys"] for m in early) == [f"early-{i}" for i in range(6)]
    assert {m["kind"] for m in early} == {"original"}
    cut = max(m["stored_ms"] for m in early) + 1
    wait_until(lambda: time.time() * 1000 > cut, 5, "the clock past the early messages")
    produce(broker.address, "Browse", 3, batch=1, prefix="late-")
    status, doc = call(console, f"/api/topics/Browse/messages?from={cut}")
    assert status == 200 and doc["mode"] == "from"
    assert sorted(m["keys"] for m in doc["messages"]) == ["late-0", "late-1", "late-2"]
    stored = [m["stored_ms"] for m in doc["messages"]]
    assert stored == sorted(stored) and stored[0] >= cut  # oldest first
    assert len(call(console, f"/api/topics/Browse/messages?from={cut}&limit=2")[1]["messages"]) == 2
    until_cut = call(console, f"/api/topics/Browse/messages?from=0&to={cut - 1}")[1]["messages"]
    assert sorted(m["keys"] for m in until_cut) == [f"early-{i}" for i in range(6)]


@pytest.mark.parametrize(("query", "status", "reason"), [
    ("latest=0", 400, "latest must be a whole number from 1 to 200, not '0'"),
    ("latest=many", 400, "latest must be a whole number from 1 to 200, not 'many'"),
    ("from=-5", 400, "from must be a time in epoch milliseconds (0 or more), not '-5'"),
    ("from=yesterday", 400, "from must be a time in epoch milliseconds (0 or more), not 'yesterday'"),
    ("from=1&latest=3", 400, "browse: give latest or from, not both"),
    ("to=5", 400, "browse: to goes with from, and must not be before it"),
    ("from=10&to=5", 400, "browse: to goes with from, and must not be before it"),
    ("from=1&limit=201", 400, "limit must be a whole number from 1 to 200, not '201'"),
])
def test_bad_browse_requests_answer_one_reason(console, query, status, reason):
    assert call(console, f"/api/topics/Orders/messages?{query}") == (status, {"error": reason})


def test_browse_of_an_unknown_topic_is_404(console):
    assert call(console, "/api/topics/NoSuchTopic/messages")[0] == 404


def _topics(address: str) -> list[str]:
    with Admin(brokers=address) as admin:
        return list(admin.list_topics())


def test_a_topic_is_created_and_deleted_after_a_plan(console, broker):
    assert call(console, "/api/topics", {"topic": "Made", "queues": 3}) == \
        (200, {"executed": False, "topic": "Made", "queues": 3, "brokers": ["broker-a"]})
    assert "Made" not in _topics(broker.address)
    status, doc = call(console, "/api/topics", {"topic": "Made", "queues": 3, "execute": True})
    assert status == 200 and doc["executed"]
    produce(broker.address, "Made", 5, batch=1)
    plan = {"topic": "Made", "brokers": ["broker-a"], "queues": 3, "messages": 5, "groups": [], "live_consumers": []}
    assert call(console, "/api/topics/Made/delete", {}) == (200, {"executed": False, **plan})
    assert "Made" in _topics(broker.address)
    assert call(console, "/api/topics/Made/delete", {"execute": True}) == (200, {"executed": True, **plan})
    assert "Made" not in _topics(broker.address)


@pytest.mark.parametrize(("path", "body", "status", "reason"), [
    ("/api/topics", {"queues": 2}, 400, "topic create: topic must be a non-empty string"),
    ("/api/topics", {"topic": "bad name!", "queues": 2}, 400, "may only contain letters"),
    ("/api/topics", {"topic": "%RETRY%x", "queues": 2}, 400, "reserved"),
    ("/api/topics", {"topic": "Fresh", "queues": 0}, 400, "queues must be a whole number from 1 to 1024"),
    ("/api/topics", {"topic": "Fresh", "queues": "4"}, 400, "queues must be a whole number from 1 to 1024"),
    ("/api/topics", {"topic": "Fresh", "queues": 2, "brokers": "broker-a"}, 400, "brokers must be a list"),
    ("/api/topics", {"topic": "Fresh", "queues": 2, "brokers": ["broker-z"]}, 404, "no broker named broker-z"),
    ("/api/topics", {"topic": "Fresh", "queues": 2, "execute": "yes"}, 400, "execute must be true or false"),
    ("/api/topics", {"topic": "Orders", "queues": 2}, 409, "topic 'Orders' exists already on broker-a"),
    ("/api/topics/NoSuchTopic/delete", {}, 404, "NoSuchTopic"),
    ("/api/topics/Orders/delete", {"force": True}, 400, "force goes with execute"),
    ("/api/dlq/nobody/requeue", {"all": True, "execute": 1}, 400, "requeue: execute must be true or false"),
])
def test_bad_changes_answer_one_reason_and_change_nothing(console, broker, path, body, status, reason):
    got, doc = call(console, path, body)
    assert (got, reason in doc.get("error", "")) == (status, True), doc
    assert "\n" not in doc["error"]
    assert "Fresh" not in _topics(broker.address) and "Orders" in _topics(broker.address)


def test_dead_letters_show_what_was_requeued_and_a_requeue_is_planned_first(console, broker):
    create_topic(broker.address, "Jobs", 1)
    first, second = produce(broker.address, "Jobs", 2, batch=1, prefix="job-")
    with Admin(brokers=broker.address) as admin:
        for m in stored_messages(broker.address, "Jobs"):
            admin.send_back("workers", m, delay_level=-1)  # straight to %DLQ%workers
    doc = call(console, "/api/dlq/workers")[1]
    assert (doc["waiting"], doc["requeued"], [m["requeued"] for m in doc["messages"]]) == (2, 0, [False, False])

    status, plan = call(console, "/api/dlq/workers/requeue", {"msg_id": first})
    assert status == 200 and not plan["executed"] and [r["msg_id"] for r in plan["requeued"]] == [first]
    assert len(stored_messages(broker.address, "Jobs")) == 2 and call(console, "/api/dlq/workers")[1]["waiting"] == 2

    status, done = call(console, "/api/dlq/workers/requeue", {"msg_id": first, "execute": True})
    assert status == 200 and done["executed"] and done["requeued"][0]["topic"] == "Jobs"
    doc = call(console, "/api/dlq/workers")[1]
    assert (doc["waiting"], doc["requeued"]) == (1, 1)
    assert {m["msg_id"]: m["requeued"] for m in doc["messages"]} == {first: True, second: False}
    # The lookup by msg id tells the copies apart: the original, its dead letter, and the requeued copy.
    copies = call(console, f"/api/messages?msg_id={first}")[1]["messages"]
    assert [(m["topic"], m["kind"]) for m in copies] == \
        [("Jobs", "original"), ("%DLQ%workers", "dead-letter copy"), ("Jobs", "requeued copy")]


def _login(c, access_key: str, secret_key: str) -> dict[str, str]:
    host, port = c.address
    req = urllib.request.Request(f"http://{host}:{port}/api/login", method="POST",
                                 data=json.dumps({"access_key": access_key, "secret_key": secret_key}).encode(),
                                 headers={"Content-Type": "application/json", "X-Tidemark-Console": "1"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return {"Cookie": resp.headers["Set-Cookie"].split(";")[0]}


def test_before_sign_in_pages_ask_for_it_and_the_start_up_says_why(auth_broker, caplog):
    with caplog.at_level(logging.INFO, logger="tidemark.console"), \
            Console(ClientSettings(brokers=auth_broker.address), ConsoleSettings(port=0)) as c:
        assert call(c, "/api/session") == (200, {"user": None, "read_only": False, "sign_in_required": True})
        for path in ("/api/overview", "/api/topics", "/api/groups/billing", "/api/users"):
            assert call(c, path) == (401, {"error": "sign in: the brokers ask for credentials"}), path
        me = _login(c, "op", OP.secret_key)
        assert call(c, "/api/topics", headers=me)[0] == 200
    said = [r.getMessage() for r in caplog.records if r.name == "tidemark.console"]
    assert any("the brokers ask for credentials: visitors sign in" in m for m in said), said
    assert not any("without reaching" in m or "sampling" in m for m in said), said


def test_users_and_acl_rules_are_planned_then_made(auth_broker):
    with Console(ClientSettings(brokers=auth_broker.address), ConsoleSettings(port=0)) as c:
        me = _login(c, "op", OP.secret_key)

        def names() -> list[str]:
            return [u["user"] for u in call(c, "/api/users", headers=me)[1]["users"]]

        new_user = {"name": "ann", "secret_key": "ann-secret-01"}
        assert call(c, "/api/users", new_user, headers=me) == \
            (200, {"executed": False, "user": "ann", "super_user": False, "brokers": ["broker-a"]})
        assert "ann" not in names()
        assert call(c, "/api/users", {**new_user, "execute": True}, headers=me)[1]["executed"]
        assert "ann" in names()

        rule = {"user": "ann", "resource": "topic:Orders", "actions": "Pub, Sub", "decision": "allow"}
        made = {"user": "ann", "resource": "Topic:Orders", "actions": ["Pub", "Sub"], "decision": "Allow",
                "source_ips": [], "brokers": ["broker-a"]}
        assert call(c, "/api/acls", rule, headers=me) == (200, {"executed": False, **made})
        assert call(c, "/api/acls?user=ann", headers=me)[1]["rules"] == []
        assert call(c, "/api/acls", {**rule, "execute": True}, headers=me) == (200, {"executed": True, **made})
        assert call(c, "/api/acls?user=ann", headers=me)[1]["rules"] == [made]

        for path, body, status, reason in [
            ("/api/users", {"secret_key": "x"}, 400, "user create: name must be a non-empty string"),
            ("/api/users", {"name": "bob"}, 400, "user create: secret_key must be a non-empty string"),
            ("/api/users", {"name": "ann", "secret_key": "x"}, 409, "user 'ann' exists already"),
            ("/api/users/nobody/delete", {}, 404, "user 'nobody' does not exist"),
            ("/api/acls", {**rule, "actions": []}, 400, "acl create: actions must name at least one action"),
            ("/api/acls", {**rule, "decision": "Maybe"}, 400, "acl create: decision must be Allow or Deny"),
            ("/api/acls", {**rule, "user": "nobody"}, 404, "acl create: user 'nobody' does not exist"),
            ("/api/acls/delete", {"user": "ann", "resource": "Group:g"}, 404, "user 'ann' has no ACL rule on Group:g"),
        ]:
            got, doc = call(c, path, body, headers=me)
            assert (got, doc["error"].startswith(reason), "\n" in doc["error"]) == (status, True, False), doc

        assert call(c, "/api/acls/delete", {"user": "ann"}, headers=me) == \
            (200, {"executed": False, "user": "ann", "rules": [made]})
        assert call(c, "/api/acls/delete", {"user": "ann", "resource": "Topic:Orders", "execute": True},
                    headers=me)[1]["executed"]
        assert call(c, "/api/acls?user=ann", headers=me)[1]["rules"] == []
        assert call(c, "/api/users/ann/delete", {}, headers=me) == \
            (200, {"executed": False, "user": "ann", "super_user": False, "brokers": ["broker-a"], "rules": []})
        assert "ann" in names()
        assert call(c, "/api/users/ann/delete", {"execute": True}, headers=me)[1]["executed"]
        assert "ann" not in names()


def test_a_console_in_a_namespace_lists_and_names_its_topics_only(broker, console):
    with Console(ClientSettings(brokers=broker.address, namespace="team"), ConsoleSettings(port=0)) as c:
        status, doc = call(c, "/api/topics", {"topic": "Spaced", "queues": 1, "execute": True})
        assert (status, doc["topic"]) == (200, "Spaced")
        assert "team%Spaced" in _topics(broker.address)
        assert [t["topic"] for t in call(c, "/api/topics")[1]["topics"]] == ["team%Spaced"]
        produce(broker.address, "team%Spaced", 2, batch=1)
        assert len(call(c, "/api/topics/team%25Spaced/messages")[1]["messages"]) == 2
        assert call(c, "/api/topics", {"topic": "Spaced", "queues": 1})[0] == 409
    assert "Orders" in [t["topic"] for t in call(console, "/api/topics")[1]["topics"]]
