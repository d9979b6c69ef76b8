"""RouteTable (broker/namesrv/routes.py): registrations, expiry, routes; a model-based check of the three."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.broker.errors import FencedError, InvalidArgumentError, NotFoundError
from tidemark.broker.namesrv.routes import QueueRoute, Registration, RouteTable, TopicQueues


def reg(name: str = "broker-a", broker_id: int = 0, address: str = "10.0.0.1:10911", *topics: TopicQueues,
        **kw) -> Registration:
    return Registration("DefaultCluster", name, broker_id, address, topics=topics or (TopicQueues("T", 4, 4),), **kw)


def test_a_topic_on_two_brokers_routes_to_both_with_their_queues():
    table = RouteTable()
    table.register(reg("broker-a", 0, "h1:1", TopicQueues("T", 4, 4)), now_ms=0)
    table.register(reg("broker-b", 0, "h2:1", TopicQueues("T", 2, 3), TopicQueues("U", 1, 1)), now_ms=0)
    assert table.route("T") == [QueueRoute("broker-a", "h1:1", 4, 4, True, True),
                                QueueRoute("broker-b", "h2:1", 2, 3, True, True)]
    assert [r.broker_name for r in table.route("U")] == ["broker-b"]
    with pytest.raises(NotFoundError, match="'V' is not served"):
        table.route("V")


def test_a_registration_replaces_the_previous_one_whole():
    table = RouteTable()
    table.register(reg("broker-a", 0, "h1:1", TopicQueues("T", 4, 4), TopicQueues("Gone", 1, 1)), now_ms=0)
    assert table.register(reg("broker-a", 0, "h1:1", TopicQueues("T", 8, 8)), now_ms=10) is False  # a renewal
    assert table.route("T")[0].read_queue_nums == 8
    with pytest.raises(NotFoundError):
        table.route("Gone")


def test_permissions_combine_broker_and_topic():
    table = RouteTable()
    table.register(reg("broker-a", 0, "h1:1", TopicQueues("T", 4, 4, readable=True, writable=False)), now_ms=0)
    table.register(reg("broker-b", 0, "h2:1", TopicQueues("T", 4, 4), writable=False, readable=False), now_ms=0)
    a, b = table.route("T")
    assert (a.readable, a.writable, b.readable, b.writable) == (True, False, False, False)


def test_a_broker_name_without_its_master_is_read_from_its_lowest_replica_and_never_written():
    table = RouteTable()
    table.register(reg("broker-a", 2, "r2:1"), now_ms=0)
    table.register(reg("broker-a", 1, "r1:1"), now_ms=0)
    assert table.route("T") == [QueueRoute("broker-a", "r1:1", 4, 4, readable=True, writable=False)]
    table.register(reg("broker-a", 0, "m:1"), now_ms=0)
    assert table.route("T") == [QueueRoute("broker-a", "m:1", 4, 4, readable=True, writable=True)]


def test_silent_brokers_expire_and_renewed_ones_stay():
    table = RouteTable(expiry_ms=1000)
    table.register(reg("broker-a", 0, "h1:1"), now_ms=0)
    table.register(reg("broker-b", 0, "h2:1"), now_ms=0)
    table.register(reg("broker-a", 0, "h1:1"), now_ms=900)
    assert table.expire(1000) == []  # exactly the expiry: not yet
    gone = table.expire(1001)
    assert [g.registration.broker_name for g in gone] == ["broker-b"]
    assert [b.registration.broker_name for b in table.brokers()] == ["broker-a"]


def test_unregister_only_from_the_address_that_registered():
    table = RouteTable()
    table.register(reg("broker-a", 0, "h1:1"), now_ms=0)
    assert table.unregister("broker-a", 0, "old:1") is False  # a late unregister of a replaced broker
    assert len(table) == 1
    assert table.unregister("broker-a", 0, "h1:1") is True
    assert len(table) == 0


def test_an_address_is_one_broker_a_restart_under_a_new_name_replaces_the_old_entry():
    table = RouteTable()
    table.register(reg("broker-a", 0, "h1:1"), now_ms=0)
    assert table.register(reg("broker-z", 0, "h1:1"), now_ms=1) is True
    assert [b.registration.broker_name for b in table.brokers()] == ["broker-z"]


def test_system_topics_route_but_are_not_counted():
    table = RouteTable()
    table.register(reg("broker-a", 0, "h1:1", TopicQueues("T", 1, 1), TopicQueues("%RETRY%g", 1, 1)), now_ms=0)
    assert table.brokers()[0].user_topic_count == 1
    assert table.route("%RETRY%g")[0].broker_name == "broker-a"


@pytest.mark.parametrize("bad, message", [
    (dict(cluster_name=""), "cluster name ''"),
    (dict(broker_name="a b"), "broker name 'a b'"),
    (dict(broker_name="x\n"), "broker name"),
    (dict(broker_id=-1), "broker id -1"),
    (dict(address="nohost"), "'nohost' is not host:port"),
    (dict(address="h:0"), "'h:0' is not host:port"),
    (dict(address="h:99999"), "is not host:port"),
    (dict(uptime_ms=-5), "uptime -5"),
    (dict(topics=(TopicQueues("T", 1, 1), TopicQueues("T", 2, 2))), "listed twice"),
    (dict(topics=(TopicQueues("bad topic", 1, 1),)), "bad topic"),
    (dict(topics=(TopicQueues("T", -1, 1),)), "read queue count -1"),
    (dict(topics=(TopicQueues("T", 1, 70000),)), "write queue count 70000"),
])
def test_a_bad_registration_is_refused_naming_the_value_and_changes_nothing(bad, message):
    table = RouteTable()
    table.register(reg("broker-a", 0, "h1:1"), now_ms=0)
    before = table.brokers()
    with pytest.raises(InvalidArgumentError, match=message.replace("(", r"\(")):
        table.register(dataclasses.replace(reg("broker-a", 0, "h1:1"), **bad), now_ms=5)
    assert table.brokers() == before


# -- the model ------------------------------------------------------------------------------------

NAMES = ("broker-a", "broker-b")
ADDRESSES = ("h1:1", "h2:1", "h3:1")
TOPICS = ("T", "U")

operations = st.lists(st.one_of(
    st.tuples(st.just("register"), st.sampled_from(NAMES), st.integers(0, 2), st.sampled_from(ADDRESSES),
              st.sets(st.sampled_from(TOPICS)), st.booleans()),
    st.tuples(st.just("unregister"), st.sampled_from(NAMES), st.integers(0, 2), st.sampled_from(ADDRESSES)),
    st.tuples(st.just("tick"), st.integers(0, 700)),
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_the_table_agrees_with_a_simple_model(ops):
    """Model: {(name, id): (address, topics, writable, last seen)}; an address belongs to its newest
    registration; entries older than the expiry are gone; a route per name takes its lowest id."""
    table, model, now = RouteTable(expiry_ms=1000), {}, 0
    for op in ops:
        if op[0] == "register":
            _, name, broker_id, address, topics, writable = op
            table.register(Registration("C", name, broker_id, address, writable=writable,
                                        topics=tuple(TopicQueues(t, 2, 2) for t in sorted(topics))), now)
            model = {k: v for k, v in model.items() if v[0] != address or k == (name, broker_id)}
            model[(name, broker_id)] = (address, topics, writable, now)
        elif op[0] == "unregister":
            _, name, broker_id, address = op
            removed = table.unregister(name, broker_id, address)
            assert removed == (model.get((name, broker_id), ("",))[0] == address)
            if removed:
                del model[(name, broker_id)]
        else:
            now += op[1]
            gone = {b.registration.key for b in table.expire(now)}
            assert gone == {k for k, v in model.items() if now - v[3] > 1000}
            model = {k: v for k, v in model.items() if k not in gone}
        assert {b.registration.key: b.registration.address for b in table.brokers()} == {
            k: v[0] for k, v in model.items()}
        for topic in TOPICS:
            expected = {}
            for (name, broker_id), (address, topics, writable, _) in sorted(model.items(), reverse=True):
                if topic in topics:
                    expected[name] = QueueRoute(name, address, 2, 2, True, writable and broker_id == 0)
            if expected:
                assert table.route(topic) == [expected[n] for n in sorted(expected)]
            else:
                with pytest.raises(NotFoundError):
                    table.route(topic)


def test_a_master_with_an_older_epoch_is_fenced_and_two_with_the_newest_are_not_both_taken():
    table = RouteTable()
    table.register(reg("broker-a", 0, "old:1"), now_ms=0)  # epoch 0
    table.register(reg("broker-a", 0, "new:1", epoch=1), now_ms=1)  # promoted: replaces it
    assert table.route("T")[0].address == "new:1" and table.master_epoch("broker-a") == 1
    with pytest.raises(FencedError, match="has a master with epoch 1 at new:1; this one \\(old:1\\) has epoch 0"):
        table.register(reg("broker-a", 0, "old:1"), now_ms=2)
    with pytest.raises(FencedError, match="claims the same epoch"):
        table.register(reg("broker-a", 0, "other:1", epoch=1), now_ms=3)
    table.register(reg("broker-a", 0, "new:1", epoch=1), now_ms=4)  # a renewal
    assert table.route("T")[0].address == "new:1"
    table.expire(now_ms=10 ** 9)  # the epoch outlives the registration
    with pytest.raises(FencedError):
        table.register(reg("broker-a", 0, "old:1"), now_ms=10 ** 9 + 1)
    table.register(reg("broker-a", 1, "replica:1"), now_ms=10 ** 9 + 2)  # replicas have no epoch to check
