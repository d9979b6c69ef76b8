"""The main flows against one broker started with TLS and auth: sending (sync, async, batch), a consumer
group of two processes with a handover, and CLI administration all work with credentials and are refused
without them, with a wrong secret, or (PERMISSION_DENIED) with another user's rules.

Clients are plain users holding exactly what they need: the writer Pub on its topic, the reader Sub on
its topic and group. The CLI runs as the super user through the environment, as README's Security
section shows. Every refusal leaves the broker's topics, messages and offsets as they were.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import forkserver
import pytest
from brokerproc import BrokerProcess
from tlslib import SECURITY_ENV_KEYS, Pki, without_security_env
from workload import ConsumerProcess, SlowStartProxy, wait_until

from tidemark.broker.auth.guard import INVALID_CREDENTIALS
from tidemark.client import (
    Admin,
    ConsumeFromWhere,
    Message,
    MessageQueue,
    PermissionDeniedError,
    Producer,
    PullConsumer,
    TlsSettings,
    UnauthenticatedError,
)

REPO = Path(__file__).resolve().parents[2]
ROOT = ("root", "root-secret-1")
WRITER = ("writer", "writer-secret-1")
READER = ("reader", "reader-secret-1")
# The broker's UNAUTHENTICATED details (tidemark.client.UnauthenticatedError and the CLI's one line carry them).
NO_CREDENTIALS, BAD_SIGNATURE = "no credentials", INVALID_CREDENTIALS
@pytest.fixture(autouse=True)
def _no_security_env(monkeypatch):
    """Each test says who it is; a developer's TIDEMARK_* must not change that."""
    for key in SECURITY_ENV_KEYS:
        monkeypatch.delenv(key, raising=False)


@pytest.fixture(scope="module")
def secure(tmp_path_factory, pki):
    broker = BrokerProcess(tmp_path_factory.mktemp("secure") / "data", args=(
        "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
        "--auth", "--init-user", ":".join(ROOT))).start()
    with Admin(**_as(broker, pki, ROOT)) as admin:
        admin.create_user(*WRITER)
        admin.create_user(*READER)
    yield broker
    broker.kill()
    assert ROOT[1] not in broker.log_text() and WRITER[1] not in broker.log_text()


def _as(broker: BrokerProcess, pki: Pki, credentials: tuple[str, str] | None) -> dict:
    """Client settings for `credentials` (None: none) over TLS."""
    out: dict = {"brokers": broker.address, "tls": TlsSettings(ca_file=str(pki.ca))}
    if credentials is not None:
        out["credentials"] = credentials
    return out


def _app(broker: BrokerProcess, pki: Pki, topic: str, group: str, queues: int) -> None:
    """As root: the topic, and exactly the rules its producer and consumer group need."""
    with Admin(**_as(broker, pki, ROOT)) as admin:
        admin.create_topic(topic, queues)
        admin.create_acl(WRITER[0], f"Topic:{topic}", ["Pub"], "Allow")
        admin.create_acl(READER[0], f"Topic:{topic}", ["Sub"], "Allow")
        admin.create_acl(READER[0], f"Group:{group}", ["Sub"], "Allow")


def _state(broker: BrokerProcess, pki: Pki, topic: str, group: str) -> tuple:
    """(max offset, committed offset) per queue, as root."""
    with Admin(**_as(broker, pki, ROOT)) as admin:
        mqs = admin.fetch_message_queues(topic)
        return tuple((admin.max_offset(mq), admin.committed(group, mq)) for mq in mqs)


def _poll(consumer: PullConsumer, want: int, timeout_s: float = 20.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got.extend(consumer.poll(timeout=1.0))
    return got


def test_send_sync_async_and_batch_then_read_them_back(secure, pki):
    _app(secure, pki, "SecureSend", "secure-readers", 2)
    with Producer(**_as(secure, pki, WRITER)) as producer:
        sent = [producer.send(Message("SecureSend", b"sync-%d" % i)).msg_id for i in range(5)]
        futures = [producer.send_async(Message("SecureSend", b"async-%d" % i)) for i in range(20)]
        sent += [f.result(timeout=30).msg_id for f in futures]
        sent += [r.msg_id for r in producer.send_batch([Message("SecureSend", b"batch-%d" % i) for i in range(50)])]
    assert len(set(sent)) == 75
    consumer = PullConsumer(group="secure-readers", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                            **_as(secure, pki, READER))
    consumer.subscribe("SecureSend")
    with consumer:
        got = _poll(consumer, 75)
    assert sorted(m.msg_id for m in got) == sorted(sent)


def test_sending_is_refused_without_the_right_credentials(secure, pki):
    _app(secure, pki, "SecureRefused", "secure-refused", 2)
    before = _state(secure, pki, "SecureRefused", "secure-refused")
    refusals = {
        "no credentials": (None, UnauthenticatedError, NO_CREDENTIALS),
        "wrong secret": ((WRITER[0], "not-the-secret"), UnauthenticatedError, BAD_SIGNATURE),
        "the reader": (READER, PermissionDeniedError, "user 'reader' may not Pub on Topic:SecureRefused"),
    }
    for case, (credentials, error, match) in refusals.items():
        with pytest.raises(error, match=match):
            with Producer(**_as(secure, pki, credentials)) as producer:
                producer.send(Message("SecureRefused", b"x"))
        with pytest.raises(error, match=match):
            with Producer(**_as(secure, pki, credentials)) as producer:
                producer.send_batch([Message("SecureRefused", b"x") for _ in range(3)])
        with pytest.raises(error, match=match):
            with Producer(**_as(secure, pki, credentials)) as producer:
                producer.send_async(Message("SecureRefused", b"x")).result(timeout=30)
        assert _state(secure, pki, "SecureRefused", "secure-refused") == before, case


def test_consuming_is_refused_without_the_right_credentials(secure, pki):
    _app(secure, pki, "SecureHidden", "secure-hidden", 1)
    with Producer(**_as(secure, pki, WRITER)) as producer:
        producer.send_batch([Message("SecureHidden", b"secret-%d" % i) for i in range(10)])
    before = _state(secure, pki, "SecureHidden", "secure-hidden")
    mq = MessageQueue("SecureHidden", "broker-a", 0)
    with Admin(**_as(secure, pki, READER)) as admin:  # a read without a group needs Sub on the topic only
        assert len(admin.pull(mq, 0).messages) == 10
    for credentials, error in ((None, UnauthenticatedError), ((READER[0], "not-the-secret"), UnauthenticatedError),
                               (WRITER, PermissionDeniedError)):
        with pytest.raises(error):
            with Admin(**_as(secure, pki, credentials)) as admin:
                admin.pull(mq, 0)
        with pytest.raises(error):
            with Admin(**_as(secure, pki, credentials)) as admin:
                admin.commit("secure-hidden", {mq: 10})
        # A consumer keeps retrying its refused heartbeats and rebalances, as RocketMQ's does: it gets nothing.
        consumer = PullConsumer(group="secure-hidden", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                                **_as(secure, pki, credentials))
        consumer.subscribe("SecureHidden")
        try:
            try:
                consumer.start()
            except error:
                pass
            else:
                assert consumer.poll(timeout=2) == []
        finally:
            consumer.shutdown()
    assert _state(secure, pki, "SecureHidden", "secure-hidden") == before


def test_group_of_two_processes_hands_over_with_no_duplicates(secure, pki, tmp_path):
    topic, group = "SecureStream", "secure-group"
    _app(secure, pki, topic, group, 4)
    ids: list[str] = []
    done = threading.Event()

    def produce() -> None:
        with Producer(**_as(secure, pki, WRITER)) as producer:
            queues = producer.fetch_publish_message_queues(topic)
            for n in range(150):  # 3,000 messages at about 1,000/s, 20 per batch
                ids.extend(r.msg_id for r in producer.send_batch(
                    [Message(topic, b"m-%d-%d" % (n, i)) for i in range(20)], queue=queues[n % len(queues)]))
                time.sleep(0.02)
        done.set()

    # The consumer processes take their identity from the environment, as any deployed client can.
    env = {"TIDEMARK_ACCESS_KEY": READER[0], "TIDEMARK_SECRET_KEY": READER[1], "TIDEMARK_TLS_CA_FILE": str(pki.ca)}
    common = ("--brokers", secure.address, "--group", group, "--topic", topic, "--persist-interval", "1")
    a = ConsumerProcess(tmp_path / "a.txt", *common, "--instance", "a", env=env).start()
    b = None
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    # One connection for every look at the group: a TLS handshake per poll is slow on a loaded machine.
    with Admin(**_as(secure, pki, ROOT)) as admin:
        try:
            wait_until(lambda: len(a.records()) >= 500, 30, "a consuming",
                       details=lambda: _group_report(admin, group, a))
            b = ConsumerProcess(tmp_path / "b.txt", *common, "--instance", "b", env=env).start()
            # What members report owning is what their heartbeats said: each heartbeats right after its
            # queues changed, so this holds once a has drained and handed over (its drain timeout is 10 s)
            # and b was granted them; the heartbeat interval (30 s) is no part of it.
            wait_until(lambda: sorted(_owners(admin, group, topic).values()) == [2, 2], 30,
                       "two members with two queues each", details=lambda: _group_report(admin, group, a, b))
            producer.join(60)
            assert done.is_set()
            wait_until(lambda: {r[0] for c in (a, b) for r in c.records()} >= set(ids), 60, "every message consumed",
                       details=lambda: _group_report(admin, group, a, b))
            wait_until(lambda: all(s.lag == 0 for s in admin.consume_stats(group, topic)), 30,
                       "every offset committed", details=lambda: _group_report(admin, group, a, b))
        finally:
            for c in (a, b):
                if c is not None and c.proc is not None:
                    c.stop()
    records = [r for c in (a, b) for r in c.records()]
    counts = collections.Counter(r[0] for r in records)
    assert set(counts) == set(ids) and len(ids) == 3_000
    assert {k: v for k, v in counts.items() if v > 1} == {}
    assert {r[1] for r in b.records()}, "b took over queues and consumed from them"
    assert "UNAUTHENTICATED" not in (tmp_path / "a.txt.log").read_text()


def test_a_member_that_waited_for_its_locks_reports_its_queues_at_once(secure, pki, tmp_path):
    """A joining member whose queues are still being drained by their previous owner gets them from a
    lock wait, after its rebalance (and the heartbeat that follows it) finished: it heartbeats them as
    soon as they are granted, not at its next heartbeat tick (here 5 minutes away)."""
    topic, group = "SecureWaited", "secure-waited"
    _app(secure, pki, topic, group, 4)
    with Producer(**_as(secure, pki, WRITER)) as producer:
        for q in producer.fetch_publish_message_queues(topic):
            producer.send_batch([Message(topic, b"w-%d" % i) for i in range(50)], queue=q)
    env = {"TIDEMARK_ACCESS_KEY": READER[0], "TIDEMARK_SECRET_KEY": READER[1], "TIDEMARK_TLS_CA_FILE": str(pki.ca)}
    # Orderly with a slow listener: every queue of a always has a message in its listener, so a's release
    # of a queue waits for it (up to 2 s) and b's first, immediate lock attempt finds the queue still held.
    common = ("--brokers", secure.address, "--group", group, "--topic", topic, "--orderly", "--delay-ms", "2000",
              "--heartbeat-interval", "300")
    a = ConsumerProcess(tmp_path / "a.txt", *common, "--instance", "a", env=env).start()
    b = None
    with Admin(**_as(secure, pki, ROOT)) as admin:
        try:
            wait_until(lambda: len(a.records()) >= 4, 30, "a consuming", details=lambda: _group_report(admin, group, a))
            b = ConsumerProcess(tmp_path / "b.txt", *common, "--instance", "b", env=env).start()
            # a's drain takes up to 2 s (its listener) and b's grant follows at once; 20 s leaves room for a
            # loaded machine and is far below the 300 s heartbeat interval an unreported grant would wait for.
            wait_until(lambda: sorted(_owners(admin, group, topic).values()) == [2, 2], 20,
                       "two members reporting two queues each", details=lambda: _group_report(admin, group, a, b))
        finally:
            for c in (a, b):
                if c is not None and c.proc is not None:
                    c.stop()
    # The case under test happened: some of b's queues were granted after its rebalance had ended (by the
    # wait). A queue a let go of at once may be granted within the rebalance itself; that is not the case.
    log = b.log_tail(1_000_000).splitlines()
    changed = next(i for i, line in enumerate(log) if "event=rebalance_changed" in line and f"topic={topic}" in line)
    granted = [i for i, line in enumerate(log) if "event=lock_grant" in line and f"topic={topic}," in line]
    assert granted and max(granted) > changed, "\n".join(log)


def test_a_broker_slow_to_finish_the_handshake_is_still_reached(secure, pki):
    """A new connection whose TLS handshake takes half a second (a busy machine) gets the request timeout
    (3 s), not the 100 ms gRPC allowed a connection attempt when min_reconnect_backoff_ms was 100."""
    with SlowStartProxy(secure.address, 0.5) as proxy:
        with Admin(**{**_as(secure, pki, ROOT), "brokers": proxy.address}) as admin:
            assert [b.broker_name for b in admin.brokers()] == ["broker-a"]


def _owners(admin: Admin, group: str, topic: str) -> dict[str, int]:
    """client id -> how many queues of `topic` its last heartbeat said it owns."""
    return {m.client_id: sum(1 for q in m.owned_queues if q.topic == topic) for m in admin.describe_group(group).members}


def _group_report(admin: Admin, group: str, *consumers: ConsumerProcess | None) -> str:
    """What the broker says of the group (members with the queues their last heartbeat reported, and the
    queue locks), and the end of each consumer's log: a failed wait on the group explains itself."""
    lines = []
    try:
        d = admin.describe_group(group)
    except Exception as e:  # the logs below still tell a lot
        lines.append(f"group {group}: describe failed: {e!r}")
    else:
        now_ms = time.time() * 1000
        lines.append(f"group {group}: {len(d.members)} member(s)")
        for m in d.members:
            owned = ", ".join(f"{q.topic}:{q.queue_id}" for q in sorted(m.owned_queues)) or "none"
            lines.append(f"  {m.client_id}: last heartbeat {(now_ms - m.last_heartbeat_timestamp) / 1000:.1f}s ago, "
                         f"reported owning [{owned}]")
        for lk in sorted(d.locks, key=lambda lk: lk.queue):
            lines.append(f"  lock {lk.queue.topic}:{lk.queue.queue_id} held by {lk.client_id} "
                         f"(epoch {lk.owner_epoch})")
    for c in consumers:
        if c is not None:
            lines.append(f"--- {c.out.name}.log (end) ---\n{c.log_tail()}")
    return "\n".join(lines)


def tidemark(broker: BrokerProcess, pki: Pki, *args: str, credentials: tuple[str, str] | None) -> subprocess.CompletedProcess:
    """The CLI with its identity and CA in the environment (TIDEMARK_ACCESS_KEY/SECRET_KEY/TLS_CA_FILE)."""
    env = without_security_env(os.environ)
    env["TIDEMARK_TLS_CA_FILE"] = str(pki.ca)
    if credentials is not None:
        env["TIDEMARK_ACCESS_KEY"], env["TIDEMARK_SECRET_KEY"] = credentials
    return forkserver.run([sys.executable, "-m", "tidemark.client.cli.main", *args, "--broker", broker.address],
                          capture_output=True, text=True, timeout=60, cwd=REPO, env=env)


def test_cli_administration_as_the_super_user_and_refused_otherwise(secure, pki):
    topic, group = "SecureCli", "secure-cli"

    def ok(*args: str) -> str:
        proc = tidemark(secure, pki, *args, credentials=ROOT)
        assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stderr}"
        return proc.stdout

    def refused(why: str, *args: str, credentials) -> None:
        """Exit 1 with one line saying why (the CLI prints the broker's reason, not the status name)."""
        proc = tidemark(secure, pki, *args, credentials=credentials)
        assert proc.returncode == 1, f"{args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        assert why in proc.stderr and proc.stderr.count("\n") == 1 and proc.stdout == "", proc.stderr

    wrong = (ROOT[0], "not-the-secret")
    for credentials, why in ((None, NO_CREDENTIALS), (wrong, BAD_SIGNATURE), (READER, "user 'reader' may not")):
        refused(why, "topic", "create", topic, "--queues", "2", credentials=credentials)
        refused(why, "topic", "list", credentials=credentials)
    assert topic not in ok("topic", "list")

    ok("topic", "create", topic, "--queues", "2")
    assert topic in ok("topic", "list")
    with Admin(**_as(secure, pki, ROOT)) as admin:
        admin.create_acl(WRITER[0], f"Topic:{topic}", ["Pub"], "Allow")
    with Producer(**_as(secure, pki, WRITER)) as producer:
        for q in producer.fetch_publish_message_queues(topic):
            producer.send_batch([Message(topic, b"x") for _ in range(5)], queue=q)
    with Admin(**_as(secure, pki, ROOT)) as admin:
        admin.commit(group, {MessageQueue(topic, "broker-a", q): 3 for q in range(2)})

    described = json.loads(ok("group", "describe", group, "--json"))
    assert described, described
    for credentials, why in ((None, NO_CREDENTIALS), (wrong, BAD_SIGNATURE), (WRITER, "user 'writer' may not")):
        refused(why, "group", "describe", group, credentials=credentials)
        refused(why, "group", "reset-offset", group, "--topic", topic, "--to-earliest", "--execute",
                credentials=credentials)
    assert _state(secure, pki, topic, group) == ((5, 3), (5, 3))

    docs = json.loads(ok("group", "reset-offset", group, "--topic", topic, "--to-earliest", "--execute", "--json"))
    assert [(d["queue"], d["current_offset"], d["new_offset"]) for d in docs] == [(0, 3, 0), (1, 3, 0)]
    assert _state(secure, pki, topic, group) == ((5, 0), (5, 0))
