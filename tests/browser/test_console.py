"""The web console in headless Chromium against real brokers: pages load, a group's lag chart falls while
its consumer runs, an offset reset is previewed and then applied, and the brokers' ACLs decide what a
signed-in user may do. Every test saves screenshots (see conftest.artifacts)."""

from __future__ import annotations

import json
import threading

from workload import create_topic, produce, settled, stored_messages, wait_until

from tidemark.client import (
    Admin,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    Producer,
    PushConsumer,
)
from tidemark.client.errors import NotFoundError
from tidemark.common.auth import Credentials

OP_SECRET = "op-secret-001"


def url(console, path: str = "/") -> str:
    host, port = console.address
    return f"http://{host}:{port}/{path.lstrip('/')}"


def chart_points(page) -> list[list[int]]:
    raw = page.locator("#lag-chart svg").get_attribute("data-points")
    return json.loads(raw) if raw else []


def consume_all(address: str, group: str, topic: str, gate: threading.Event | None = None) -> PushConsumer:
    """A consumer of the whole topic; with a gate its listener holds every batch until the gate opens
    (so nothing is committed and the lag stays at its height until the test lets it fall)."""
    def listener(msgs, context):
        if gate is not None:
            gate.wait()
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = PushConsumer(group=group, brokers=address,
                            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    consumer.subscribe(topic)
    consumer.register_message_listener(listener)
    return consumer.start()


def test_pages_load_and_show_brokers_topics_and_messages(broker, console_factory, page, artifacts):
    create_topic(broker.address, "Orders", 4)
    ids = produce(broker.address, "Orders", 40, body=b'{"order": 7, "item": "tea"}', prefix="order-")
    console = console_factory(broker.address)

    page.goto(url(console))
    page.get_by_role("cell", name="broker-a").wait_for()
    assert page.get_by_role("cell", name=broker.address).is_visible()
    page.screenshot(path=artifacts / "brokers.png", full_page=True)

    page.get_by_role("link", name="Topics").click()
    page.get_by_role("link", name="Orders").click()
    page.get_by_text("messages stored").wait_for()
    rows = page.locator("table").first.locator("tbody tr")
    assert rows.count() == 4
    assert page.locator(".card .value").first.inner_text().replace(",", "") == "40"
    page.screenshot(path=artifacts / "topic.png", full_page=True)

    # By key: the stored body, its id and key.
    page.get_by_role("link", name="look up messages").click()
    page.locator("input[name=key]").fill("order-7")
    page.get_by_role("button", name="Look up").click()
    page.locator("pre.body").first.wait_for()
    assert page.locator("pre.body").first.inner_text() == '{"order": 7, "item": "tea"}'
    assert page.get_by_role("cell", name=ids[7]).is_visible()
    page.screenshot(path=artifacts / "message.png", full_page=True)

    # By msg id, without a topic.
    page.goto(url(console, f"#/messages?msg_id={ids[3]}"))
    page.get_by_role("cell", name="order-3", exact=True).wait_for()
    assert page.locator("article.message").count() == 1

    # By position, and an offset the queue does not hold: the broker's reason on the page.
    page.goto(url(console, "#/messages?topic=Orders&queue=0&offset=999999"))
    alert = page.get_by_role("alert")
    alert.wait_for()
    assert "no message at Orders:0@999999" in alert.inner_text()


def test_lag_chart_falls_while_the_consumer_runs(broker, console_factory, page, artifacts):
    create_topic(broker.address, "Clicks", 4)
    produce(broker.address, "Clicks", 2000)
    gate = threading.Event()
    consumer = consume_all(broker.address, "analytics", "Clicks", gate)
    try:
        console = console_factory(broker.address)
        page.goto(url(console, "#/groups/analytics"))
        page.locator("#lag-chart svg").wait_for()
        # The consumer holds its first batches: the chart climbs to the whole backlog and stays there.
        wait_until(lambda: sum(1 for _, v in chart_points(page) if v == 2000) >= 2, 30,
                   "two samples of the full backlog on the chart", details=lambda: str(chart_points(page)))
        page.screenshot(path=artifacts / "group-lag-high.png", full_page=True)
        gate.set()
        wait_until(lambda: page.locator("#lag-chart svg").get_attribute("data-last") == "0", 60,
                   "the chart to reach lag 0", details=lambda: str(chart_points(page)[-5:]))
        points = chart_points(page)
        peak = max(range(len(points)), key=lambda i: points[i][1])
        assert points[peak][1] == 2000 and points[-1][1] == 0 and points[-1][0] > points[peak][0]
        assert all(a[1] >= b[1] for a, b in zip(points[peak:], points[peak + 1:], strict=False)), \
            f"the lag should only fall once the consumer runs: {points[peak:]}"
        assert page.locator("#group-state").inner_text() == "Stable"
        assert page.locator("#group-lag").inner_text() == "0"
        page.screenshot(path=artifacts / "group-lag.png", full_page=True)
    finally:
        gate.set()
        consumer.shutdown()


def _committed(address: str, group: str, topic: str) -> list[int]:
    with Admin(brokers=address) as admin:
        return [s.consumer_offset for s in admin.consume_stats(group, topic)]


def test_reset_is_previewed_then_applied_from_the_console(broker, console_factory, page, artifacts):
    create_topic(broker.address, "Payments", 2)
    produce(broker.address, "Payments", 100)
    consumer = consume_all(broker.address, "ledger", "Payments")
    wait_until(lambda: settled(broker.address, "ledger", "Payments"), 30, "the group to consume everything")
    consumer.shutdown()
    assert _committed(broker.address, "ledger", "Payments") == [50, 50]

    console = console_factory(broker.address)
    page.goto(url(console, "#/groups/ledger"))
    page.locator("#reset-form").wait_for()
    page.locator("select[name=topic]").select_option("Payments")
    page.locator("select[name=target]").select_option("earliest")
    page.get_by_role("button", name="Preview reset").click()
    preview = page.locator("#reset-result table")
    preview.wait_for()
    assert [r.inner_text().split("\t")[-2:] for r in preview.locator("tbody tr").all()] == [["50", "0"]] * 2
    page.screenshot(path=artifacts / "reset-preview.png", full_page=True)
    assert _committed(broker.address, "ledger", "Payments") == [50, 50], "a preview must change nothing"

    page.get_by_role("button", name="Apply this reset").click()
    page.locator("#reset-done").wait_for()
    assert _committed(broker.address, "ledger", "Payments") == [0, 0]
    page.screenshot(path=artifacts / "reset-applied.png", full_page=True)

    # Bad input in the form: the console's one-line reason, nothing moved.
    page.locator("select[name=target]").select_option("offset")
    page.locator("input[name=value]").fill("-5")
    page.get_by_role("button", name="Preview reset").click()
    page.get_by_role("alert").wait_for()
    assert "cannot be negative" in page.get_by_role("alert").inner_text()
    assert _committed(broker.address, "ledger", "Payments") == [0, 0]


def test_console_actions_obey_the_brokers_acls(broker_factory, console_factory, page, artifacts):
    broker = broker_factory(args=("--auth", "--init-user", f"op:{OP_SECRET}"))
    op = Credentials("op", OP_SECRET)
    with Admin(brokers=broker.address, credentials=op) as admin:
        admin.create_topic("Audit", 1)
        admin.create_user("viewer", "viewer-secret-1")
        admin.create_acl("viewer", "Cluster", ["List", "Get"], "Allow")
        admin.create_acl("viewer", "Topic:*", ["Get", "Sub"], "Allow")
        admin.create_acl("viewer", "Group:*", ["Get", "Sub"], "Allow")
        admin.commit("auditors", {admin.fetch_message_queues("Audit")[0]: 0})
    console = console_factory(broker.address)  # no credentials of its own: visitors must sign in

    page.goto(url(console, "#/groups"))
    page.get_by_role("alert").wait_for()
    assert "unauthenticated" in page.get_by_role("alert").inner_text().lower() or \
        "credentials" in page.get_by_role("alert").inner_text().lower()

    page.locator("input[name=access_key]").fill("viewer")
    page.locator("input[name=secret_key]").fill("wrong-secret")
    page.get_by_role("button", name="Sign in").click()
    page.locator("#login [role=alert]").wait_for()

    page.locator("input[name=access_key]").fill("viewer")
    page.locator("input[name=secret_key]").fill("viewer-secret-1")
    page.get_by_role("button", name="Sign in").click()
    page.locator("#user").wait_for()
    page.get_by_role("link", name="auditors").click()
    page.locator("select[name=target]").select_option("latest")
    page.get_by_role("button", name="Preview reset").click()
    page.get_by_role("alert").wait_for()
    assert "may not update on group:auditors" in page.get_by_role("alert").inner_text().lower()
    page.screenshot(path=artifacts / "acl-denied.png", full_page=True)

    page.get_by_role("button", name="Sign out").click()
    page.locator("input[name=access_key]").fill("op")
    page.locator("input[name=secret_key]").fill(OP_SECRET)
    page.get_by_role("button", name="Sign in").click()
    page.locator("#user").wait_for()
    assert page.locator("#user").inner_text() == "signed in as op"
    page.goto(url(console, "#/groups/auditors"))
    page.locator("select[name=target]").select_option("latest")
    page.get_by_role("button", name="Preview reset").click()
    page.get_by_role("button", name="Apply this reset").wait_for()  # the super user may
    with Admin(brokers=broker.address, credentials=op) as admin:
        try:
            assert [s.consumer_offset for s in admin.consume_stats("auditors")] == [0]
        except NotFoundError as e:
            raise AssertionError("the viewer's refused reset must leave the offsets") from e


def test_dead_letters_are_listed_and_requeued_from_the_console(broker_factory, console_factory, page, artifacts):
    broker = broker_factory(args=("--delay-levels", " ".join(f"{n * 100}ms" for n in range(1, 19))))
    create_topic(broker.address, "Jobs", 1)

    def listener(msgs, context):
        return (ConsumeConcurrentlyStatus.RECONSUME_LATER if msgs[0].body == b"poison"
                else ConsumeConcurrentlyStatus.CONSUME_SUCCESS)

    consumer = PushConsumer(group="workers", brokers=broker.address, max_reconsume_times=1,
                            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    consumer.subscribe("Jobs")
    consumer.register_message_listener(listener)
    consumer.start()
    try:
        with Producer(brokers=broker.address) as p:
            poison = p.send(Message("Jobs", b"poison")).msg_id
        with Admin(brokers=broker.address) as admin:
            wait_until(lambda: _dead_ids(admin, "workers") == [poison], 30, "the poison message in the DLQ")
    finally:
        consumer.shutdown()

    console = console_factory(broker.address)
    page.goto(url(console, "#/dlq/workers"))
    page.get_by_role("cell", name=poison).wait_for()
    assert page.get_by_role("cell", name="poison").is_visible()
    page.get_by_role("button", name="Requeue", exact=True).click()
    page.get_by_text("1 message(s) requeued").wait_for()
    page.screenshot(path=artifacts / "dlq-requeued.png", full_page=True)
    bodies = [m.body for m in stored_messages(broker.address, "Jobs")]
    assert bodies == [b"poison", b"poison"], "the requeued copy is back on its topic"


def _dead_ids(admin: Admin, group: str) -> list[str]:
    try:
        return [m.msg_id for m in admin.dead_letters(group)]
    except NotFoundError:
        return []
