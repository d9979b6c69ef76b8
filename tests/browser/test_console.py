"""The web console in headless Chromium against real brokers: pages load, a group's lag chart falls while
its consumer runs, an offset reset is previewed and then applied, and the brokers' ACLs decide what a
signed-in user may do. Every test saves screenshots (see conftest.artifacts)."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime

from playwright.sync_api import expect
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

OP = Credentials("op", "op-secret-001")  # the super user of conftest.auth_broker


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
    # Its journey (tidemark message trace): sent and stored, no group has read Orders.
    expect(page.locator("#journey-table tbody tr")).to_have_count(2)
    assert page.locator("#journey-table tbody tr").nth(1).inner_text().startswith("stored")

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


def test_console_actions_obey_the_brokers_acls(auth_broker, console_factory, page, artifacts):
    broker = auth_broker
    op = OP
    with Admin(brokers=broker.address, credentials=op) as admin:
        admin.create_topic("Audit", 1)
        admin.create_user("viewer", "viewer-secret-1")
        admin.create_acl("viewer", "Cluster", ["List", "Get"], "Allow")
        admin.create_acl("viewer", "Topic:*", ["Get", "Sub"], "Allow")
        admin.create_acl("viewer", "Group:*", ["Get", "Sub"], "Allow")
        admin.commit("auditors", {admin.fetch_message_queues("Audit")[0]: 0})
    console = console_factory(broker.address)  # no credentials of its own: visitors must sign in

    # Before sign-in: a sign-in prompt on the page, not the brokers' refusal.
    page.goto(url(console, "#/groups"))
    page.locator("#signin-prompt").wait_for()
    assert "ask for credentials" in page.locator("#signin-prompt").inner_text()
    assert page.get_by_role("alert").count() == 0 and page.locator("input[name=access_key]").count() == 1
    page.screenshot(path=artifacts / "sign-in-prompt.png", full_page=True)

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
    page.locator("input[name=secret_key]").fill(OP.secret_key)
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
    page.get_by_text("1 message(s) would be requeued to their topics").wait_for()
    assert [m.body for m in stored_messages(broker.address, "Jobs")] == [b"poison"], "a plan sends nothing"
    page.get_by_role("button", name="Requeue these").click()
    page.locator("#requeue-done").wait_for()
    assert page.locator("#dlq-requeued").inner_text() == "1"
    assert page.locator("#dlq-table tbody tr").first.get_by_text("requeued", exact=True).is_visible()
    page.screenshot(path=artifacts / "dlq-requeued.png", full_page=True)
    bodies = [m.body for m in stored_messages(broker.address, "Jobs")]
    assert bodies == [b"poison", b"poison"], "the requeued copy is back on its topic"


def _dead_ids(admin: Admin, group: str) -> list[str]:
    try:
        return [m.msg_id for m in admin.dead_letters(group)]
    except NotFoundError:
        return []


# -- on the module's --auth broker: sign-in, topics made and browsed, copies, users and ACL rules ----------


def sign_in(page, console, path: str = "/") -> None:
    page.goto(url(console, path))
    page.locator("#signin-prompt").wait_for()
    page.locator("input[name=access_key]").fill(OP.access_key)
    page.locator("input[name=secret_key]").fill(OP.secret_key)
    page.get_by_role("button", name="Sign in").click()
    page.locator("#user").wait_for()


def column(page, table_id: str, index: int) -> list[str]:
    return [c.inner_text() for c in page.locator(f"#{table_id} tbody tr td:nth-child({index})").all()]


def send(address: str, topic: str, keys: list[str]) -> list[str]:
    with Producer(brokers=address, credentials=OP) as p:
        return [p.send(Message(topic, f"body of {k}".encode(), keys=k)).msg_id for k in keys]


def topics_of(address: str) -> list[str]:
    with Admin(brokers=address, credentials=OP) as admin:
        return list(admin.list_topics())


def local_time(ms: int) -> str:
    """A datetime-local input's value (the browser's and this process's local time, to the millisecond)."""
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}"


def test_topics_are_created_browsed_sorted_and_deleted_after_a_plan(auth_broker, console_factory, page, artifacts):
    with Admin(brokers=auth_broker.address, credentials=OP) as admin:
        for name in ("kept-a", "Kept-b"):
            admin.create_topic(name, 1)
    console = console_factory(auth_broker.address)
    sign_in(page, console, "#/topics")

    page.locator("#topic-create input[name=topic]").fill("Browsed")
    page.locator("#topic-create input[name=queues]").fill("2")
    page.get_by_role("button", name="Plan creation").click()
    page.get_by_role("region", name="plan").get_by_text("would be created").wait_for()
    assert "Browsed" not in topics_of(auth_broker.address), "a plan creates nothing"
    page.screenshot(path=artifacts / "topic-create-plan.png", full_page=True)
    page.get_by_role("button", name="Create topic").click()
    page.get_by_role("heading", name="Topic Browsed").wait_for()
    assert "Browsed" in topics_of(auth_broker.address)

    send(auth_broker.address, "Browsed", [f"early-{i}" for i in range(6)])
    with Admin(brokers=auth_broker.address, credentials=OP) as admin:
        cut = max(s.last_update_timestamp for s in admin.topic_stats("Browsed")) + 1
    wait_until(lambda: time.time() * 1000 > cut, 5, "the clock past the early messages")
    send(auth_broker.address, "Browsed", ["late-0", "late-1", "late-2"])

    # Newest first, as soon as the page opens.
    page.reload()
    page.locator("#browse-table tbody tr").nth(8).wait_for()
    keys = column(page, "browse-table", 6)
    assert sorted(keys) == sorted([f"early-{i}" for i in range(6)] + ["late-0", "late-1", "late-2"])
    assert keys[0].startswith("late-")
    # Sorted by a column, both ways; filtered by text.
    offsets = page.locator("#browse-table th", has_text="offset")
    offsets.click()
    assert offsets.get_attribute("aria-sort") == "ascending"
    assert [int(v) for v in column(page, "browse-table", 4)] == sorted(int(v) for v in column(page, "browse-table", 4))
    offsets.click()
    assert offsets.get_attribute("aria-sort") == "descending"
    assert column(page, "browse-table", 4)[0] == "4"
    page.locator("#browse-results input.filter").fill("late-1")
    assert column(page, "browse-table", 6) == ["late-1"]
    page.screenshot(path=artifacts / "topic-browse.png", full_page=True)

    # From a time: only what was stored since.
    page.locator("select[name=mode]").select_option("from")
    page.locator("input[name=from]").fill(local_time(cut))
    page.get_by_role("button", name="Browse").click()
    page.get_by_text("3 from").wait_for()
    assert sorted(column(page, "browse-table", 6)) == ["late-0", "late-1", "late-2"]

    page.get_by_role("button", name="Plan deletion").click()
    plan = page.get_by_role("region", name="plan")
    plan.get_by_text("would be deleted").wait_for()
    assert "9" in plan.inner_text() and "Browsed" in topics_of(auth_broker.address), "a plan deletes nothing"
    page.screenshot(path=artifacts / "topic-delete-plan.png", full_page=True)
    page.get_by_role("button", name="Delete topic").click()
    page.get_by_role("heading", name="Topics").wait_for()
    assert "Browsed" not in topics_of(auth_broker.address)

    # The topics table sorts by name, both ways.
    names = page.locator("#topics-table th", has_text="topic")
    names.click()
    names.click()
    shown = column(page, "topics-table", 1)
    assert shown == sorted(shown, key=str.lower, reverse=True) and {"kept-a", "Kept-b"} <= set(shown)


def test_copies_of_a_message_carry_distinct_titles_and_requeues_show(auth_broker, console_factory, page, artifacts):
    with Admin(brokers=auth_broker.address, credentials=OP) as admin:
        admin.create_topic("Tasks", 1)
        (msg_id,) = send(auth_broker.address, "Tasks", ["task-1"])
        (original,) = admin.query_message_by_id(msg_id, "Tasks")
        # The dead-letter copy first: stored before the retry copy is even asked for, whose delay then makes it
        # the newest. (Asked the other way round, a dead-letter call slower than the delay, under load, was
        # stored after the retry copy: the fresh clone's failure.)
        admin.send_back("doers", original, delay_level=-1)  # a dead-letter copy on %DLQ%doers
        admin.send_back("doers", original, delay_level=1)  # a retry copy on %RETRY%doers after 100 ms
        wait_until(lambda: len(admin.query_message_by_id(msg_id)) == 3, 20, "the retry copy stored")
    console = console_factory(auth_broker.address)
    sign_in(page, console, f"#/messages?msg_id={msg_id}")
    page.locator("article.message").nth(2).wait_for()
    titles = [t.inner_text() for t in page.locator("article.message h2").all()]
    assert len(set(titles)) == 3, titles
    assert [t.split(" · ")[:2] for t in titles] == [  # oldest first: the retry copy waited out its delay
        ["Tasks", "original"], ["%DLQ%doers", "dead-letter copy of Tasks"], ["%RETRY%doers", "retry copy of Tasks"]]
    page.screenshot(path=artifacts / "message-copies.png", full_page=True)

    page.goto(url(console, "#/dlq/doers"))
    page.get_by_role("button", name="Requeue all waiting").click()
    page.get_by_role("button", name="Requeue these").click()
    page.locator("#requeue-done").wait_for()
    assert (page.locator("#dlq-waiting").inner_text(), page.locator("#dlq-requeued").inner_text()) == ("0", "1")
    page.screenshot(path=artifacts / "dlq-requeued-status.png", full_page=True)
    page.goto(url(console, f"#/messages?msg_id={msg_id}"))
    page.locator("article.message").nth(3).wait_for()
    assert page.locator("article.message h2", has_text="requeued copy").count() == 1


def test_users_and_acl_rules_are_made_and_deleted_after_a_plan(auth_broker, console_factory, page, artifacts):
    console = console_factory(auth_broker.address)
    sign_in(page, console, "#/users")
    page.locator("#users-table").wait_for()

    page.locator("input[name=name]").fill("carol")
    page.locator("input[name=new_secret]").fill("carol-secret-1")
    page.get_by_role("button", name="Plan user").click()
    page.get_by_role("region", name="plan").get_by_text("would be created").wait_for()
    with Admin(brokers=auth_broker.address, credentials=OP) as admin:
        assert "carol" not in [u.name for u in admin.list_users()], "a plan creates nothing"
    page.get_by_role("button", name="Create user").click()
    page.locator("#users-table").get_by_role("cell", name="carol", exact=True).wait_for()

    page.locator("input[name=rule_user]").fill("carol")
    page.locator("input[name=resource]").fill("topic:Orders")
    page.locator("input[name=actions]").fill("Pub,Sub")
    page.get_by_role("button", name="Plan rule").click()
    page.get_by_role("region", name="plan").get_by_text("Topic:Orders").wait_for()
    page.get_by_role("button", name="Add rule").click()
    rule = page.locator("#acls-table tbody tr", has_text="carol")
    rule.wait_for()
    assert "Topic:Orders" in rule.inner_text() and "Pub, Sub" in rule.inner_text()
    page.screenshot(path=artifacts / "users-and-acls.png", full_page=True)

    users = page.locator("#users-table").get_by_role("columnheader", name="user", exact=True)
    users.click()
    assert column(page, "users-table", 1) == sorted(column(page, "users-table", 1))

    rule.get_by_role("button", name="Delete").click()
    page.get_by_role("region", name="plan").get_by_text("would be deleted").wait_for()
    page.get_by_role("button", name="Delete rule").click()
    expect(page.locator("#acls-table tbody tr", has_text="carol")).to_have_count(0)
    page.locator("#users-table tbody tr", has_text="carol").get_by_role("button", name="Delete").click()
    page.get_by_role("button", name="Delete user").click()
    expect(page.locator("#users-table tbody tr", has_text="carol")).to_have_count(0)
    with Admin(brokers=auth_broker.address, credentials=OP) as admin:
        assert "carol" not in [u.name for u in admin.list_users()]


def test_a_pop_group_shows_what_it_has_in_flight(broker, console_factory, page, artifacts):
    """Issue 32: a pop group (RocketMQ 5 consumers) shows per queue what it received and has not acked."""
    import grpc
    from google.protobuf.duration_pb2 import Duration
    from rmq5lib import Rmq5Stub, resource

    from tidemark.rmq5.v2 import messaging_pb2 as pb

    create_topic(broker.address, "Popped", 1)
    produce(broker.address, "Popped", 5)
    with grpc.insecure_channel(broker.address) as channel:
        answers = Rmq5Stub(channel).ReceiveMessage(pb.ReceiveMessageRequest(
            group=resource("poppers"), message_queue=pb.MessageQueue(topic=resource("Popped")), batch_size=3,
            invisible_duration=Duration(seconds=60), long_polling_timeout=Duration(nanos=100_000_000)))
        assert sum(1 for a in answers if a.HasField("message")) == 3
    console = console_factory(broker.address)
    page.goto(url(console, "#/groups/poppers"))
    rows = page.locator("#group-inflight tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("Popped")
    cells = rows.first.locator("td")
    assert cells.nth(3).inner_text() == "3" and cells.nth(9).inner_text() == "2"  # in flight, waiting
    expect(page.locator("#group-pop-state")).to_have_text("slow")
    page.screenshot(path=artifacts / "group-pop-inflight.png", full_page=True)
