"""Allocation strategies: RocketMQ's AVG examples (its AllocateMessageQueueAveragely) and coverage/agreement properties."""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.client.consumer.allocate import (
    STRATEGIES,
    AllocateMachineRoomNearby,
    AllocateMessageQueueAveragely,
    AllocateMessageQueueAveragelyByCircle,
    AllocateMessageQueueByConfig,
    AllocateMessageQueueByMachineRoom,
    AllocateMessageQueueConsistentHash,
    AllocateMessageQueueStrategy,
    AllocateStrategyName,
    md5_hash,
    prepare_allocation,
    strategy_by_name,
)
from tidemark.client.message import MessageQueue

GROUP = "g"
ROOMS = ("hz", "sh", "bj")


def queues(n: int, topic: str = "t", broker: str = "broker-a") -> list[MessageQueue]:
    return [MessageQueue(topic, broker, i) for i in range(n)]


def allocation_by_client(strategy, mqs, cids) -> dict[str, list[MessageQueue]]:
    return {cid: strategy.allocate(GROUP, cid, mqs, cids) for cid in cids}


def owners(strategy, mqs, cids) -> dict[MessageQueue, str]:
    result = {}
    for cid, mine in allocation_by_client(strategy, mqs, cids).items():
        for mq in mine:
            assert mq not in result, f"{mq} allocated to {result[mq]} and {cid}"
            result[mq] = cid
    return result


# -- AVG: RocketMQ's examples ------------------------------------------------------------


def test_avg_reproduces_seed_001_example():
    mqs = queues(8)
    got = allocation_by_client(AllocateMessageQueueAveragely(), mqs, ["c1", "c2", "c3", "c4"])
    assert got == {
        "c1": mqs[0:2],
        "c2": mqs[2:4],
        "c3": mqs[4:6],
        "c4": mqs[6:8],
    }


def test_avg_uneven_split_gives_the_remainder_to_the_first_clients():
    mqs = queues(8)
    got = allocation_by_client(AllocateMessageQueueAveragely(), mqs, ["c1", "c2", "c3"])
    assert got == {"c1": mqs[0:3], "c2": mqs[3:6], "c3": mqs[6:8]}


def test_avg_more_clients_than_queues_leaves_the_extra_clients_idle():
    mqs = queues(3)
    got = allocation_by_client(AllocateMessageQueueAveragely(), mqs, ["c1", "c2", "c3", "c4", "c5"])
    assert got == {"c1": [mqs[0]], "c2": [mqs[1]], "c3": [mqs[2]], "c4": [], "c5": []}


def test_avg_sorts_inputs_and_orders_queues_numerically():
    # queue 10 sorts after queue 9 (numeric, like RocketMQ's compareTo), and the
    # listing order of queues and clients does not matter.
    mqs = queues(12)
    shuffled = list(reversed(mqs))
    got = AllocateMessageQueueAveragely().allocate(GROUP, "c2", shuffled, ["c3", "c2", "c1"])
    assert got == mqs[4:8]


def test_avg_by_circle_deals_round_robin():
    mqs = queues(8)
    got = allocation_by_client(AllocateMessageQueueAveragelyByCircle(), mqs, ["c1", "c2", "c3"])
    assert got == {
        "c1": [mqs[0], mqs[3], mqs[6]],
        "c2": [mqs[1], mqs[4], mqs[7]],
        "c3": [mqs[2], mqs[5]],
    }


# -- input validation ---------------------------------------------------------


@pytest.mark.parametrize(
    "strategy",
    [
        AllocateMessageQueueAveragely(),
        AllocateMessageQueueAveragelyByCircle(),
        AllocateMessageQueueConsistentHash(),
        AllocateMessageQueueByMachineRoom({"hz"}),
        AllocateMachineRoomNearby(),
    ],
    ids=lambda s: s.name,
)
def test_invalid_inputs_are_rejected_like_rocketmq(strategy, caplog):
    mqs = [MessageQueue("t", "hz@broker-a", 0)]
    with pytest.raises(ValueError, match="current_cid is empty"):
        strategy.allocate(GROUP, "", mqs, ["hz@c1"])
    with pytest.raises(ValueError, match="mq_all is empty"):
        strategy.allocate(GROUP, "hz@c1", [], ["hz@c1"])
    with pytest.raises(ValueError, match="cid_all is empty"):
        strategy.allocate(GROUP, "hz@c1", mqs, [])
    with caplog.at_level(logging.INFO, logger="tidemark.client.consumer.allocate"):
        assert strategy.allocate(GROUP, "hz@stranger", mqs, ["hz@c1"]) == []
    assert any(
        r.levelno == logging.INFO and "[BUG]" in r.getMessage() and "hz@stranger" in r.getMessage()
        for r in caplog.records
    )


# -- properties: every queue exactly once, every client agrees ----------------

queue_lists = st.lists(
    st.builds(
        MessageQueue,
        topic=st.sampled_from(["TopicA", "TopicB", "%RETRY%g"]),
        broker_name=st.sampled_from(["hz@broker-a", "hz@broker-b", "sh@broker-c", "bj@broker-d"]),
        queue_id=st.integers(0, 15),
    ),
    min_size=1,
    max_size=40,
    unique=True,
)
# Client ids carry a room prefix so the machine-room strategies can read it;
# the other strategies treat them as opaque strings.
client_ids = st.lists(
    st.builds(
        lambda room, n: f"{room}@10.0.0.{n}@{1000 + n}", st.sampled_from(ROOMS), st.integers(0, 30)
    ),
    min_size=1,
    max_size=12,
    unique=True,
)


def assert_exactly_once_and_order_independent(
    data,
    strategy: AllocateMessageQueueStrategy,
    mqs: Sequence[MessageQueue],
    cids: Sequence[str],
    eligible,
):
    """Each client gets its own shuffled view; together they cover `eligible` exactly once."""
    counts: Counter[MessageQueue] = Counter()
    for cid in cids:
        view_a = strategy.allocate(
            GROUP, cid, data.draw(st.permutations(mqs)), data.draw(st.permutations(cids))
        )
        view_b = strategy.allocate(
            GROUP, cid, data.draw(st.permutations(mqs)), data.draw(st.permutations(cids))
        )
        assert view_a == view_b, (
            f"{cid} computed different allocations from differently ordered inputs"
        )
        counts.update(view_a)
    assert set(counts) == set(eligible)
    assert all(n == 1 for n in counts.values()), [mq for mq, n in counts.items() if n > 1]


PROPERTY_STRATEGIES = [
    AllocateMessageQueueAveragely(),
    AllocateMessageQueueAveragelyByCircle(),
    AllocateMessageQueueConsistentHash(),
    AllocateMessageQueueConsistentHash(virtual_node_count=1),
    AllocateMessageQueueByMachineRoom(set(ROOMS)),
    AllocateMachineRoomNearby(),
    AllocateMachineRoomNearby(inner=AllocateMessageQueueAveragelyByCircle()),
]


@pytest.mark.parametrize("strategy", PROPERTY_STRATEGIES, ids=repr)
@settings(max_examples=60, deadline=None)
@given(mqs=queue_lists, cids=client_ids, data=st.data())
def test_every_queue_allocated_exactly_once_whatever_the_input_order(strategy, mqs, cids, data):
    assert_exactly_once_and_order_independent(data, strategy, mqs, cids, eligible=mqs)


@settings(max_examples=60, deadline=None)
@given(mqs=queue_lists, cids=client_ids, data=st.data())
def test_avg_blocks_are_contiguous_and_balanced(mqs, cids, data):
    ordered_mqs, ordered_cids = sorted(mqs), sorted(cids)
    got = allocation_by_client(
        AllocateMessageQueueAveragely(), data.draw(st.permutations(mqs)), cids
    )
    sizes = [len(got[cid]) for cid in ordered_cids]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the remainder goes to the first clients
    assert [mq for cid in ordered_cids for mq in got[cid]] == ordered_mqs


# -- CONSISTENT_HASH ----------------------------------------------------------


def test_md5_hash_is_the_first_8_bytes_of_md5_big_endian():
    assert md5_hash("") == 0xD41D8CD98F00B204
    assert md5_hash("abc") == int.from_bytes(hashlib.md5(b"abc").digest()[:8], "big")


def test_consistent_hash_routes_each_queue_to_the_first_virtual_node_clockwise():
    mqs = queues(16, broker="broker-a") + queues(16, broker="broker-b")
    cids = ["c1", "c2", "c3"]
    strategy = AllocateMessageQueueConsistentHash(virtual_node_count=4)
    ring = sorted((md5_hash(f"{cid}-{i}"), cid) for cid in cids for i in range(4))

    def expected_owner(mq):
        h = md5_hash(str(mq))
        return next((cid for node_hash, cid in ring if node_hash >= h), ring[0][1])

    assert owners(strategy, mqs, cids) == {mq: expected_owner(mq) for mq in mqs}


@settings(max_examples=60, deadline=None)
@given(
    mqs=queue_lists,
    cids=client_ids,
    newcomer=st.text(min_size=1, max_size=12),
    vnodes=st.integers(1, 20),
)
def test_consistent_hash_join_moves_only_queues_that_now_belong_to_the_newcomer(
    mqs, cids, newcomer, vnodes
):
    if newcomer in cids:
        return
    strategy = AllocateMessageQueueConsistentHash(virtual_node_count=vnodes)
    before = owners(strategy, mqs, cids)
    after = owners(strategy, mqs, [*cids, newcomer])
    moved = {mq for mq in mqs if before[mq] != after[mq]}
    assert all(after[mq] == newcomer for mq in moved)


@settings(max_examples=60, deadline=None)
@given(mqs=queue_lists, cids=client_ids.filter(lambda c: len(c) > 1), data=st.data())
def test_consistent_hash_leave_moves_only_the_leavers_queues(mqs, cids, data):
    strategy = AllocateMessageQueueConsistentHash()
    leaver = data.draw(st.sampled_from(cids))
    before = owners(strategy, mqs, cids)
    after = owners(strategy, mqs, [cid for cid in cids if cid != leaver])
    assert {mq for mq in mqs if before[mq] != after[mq]} == {
        mq for mq in mqs if before[mq] == leaver
    }


def test_consistent_hash_rejects_a_ring_without_nodes():
    with pytest.raises(ValueError, match="virtual_node_count"):
        AllocateMessageQueueConsistentHash(virtual_node_count=0)


# -- CONFIG -------------------------------------------------------------------


def test_config_returns_its_list_and_ignores_the_group():
    pinned = [MessageQueue("t", "broker-b", 3), MessageQueue("t", "broker-a", 1)]
    strategy = AllocateMessageQueueByConfig(pinned)
    assert strategy.allocate(GROUP, "c1", queues(8), ["c1", "c2"]) == pinned
    assert strategy.allocate(GROUP, "c2", queues(2), ["c9"]) == pinned
    with pytest.raises(TypeError):
        AllocateMessageQueueByConfig([("t", "broker-a", 1)])


# -- MACHINE_ROOM -------------------------------------------------------------


def test_machine_room_consumes_only_chosen_rooms_with_remainder_from_the_tail():
    hz = queues(5, broker="hz@broker-a")
    other = queues(3, broker="sh@broker-b") + queues(2, broker="broker-without-room")
    strategy = AllocateMessageQueueByMachineRoom({"hz"})
    got = allocation_by_client(strategy, [*other, *hz], ["c2", "c1"])
    # RocketMQ: 5 // 2 = 2 contiguous each, the fifth goes to the first client.
    assert got == {"c1": [hz[0], hz[1], hz[4]], "c2": [hz[2], hz[3]]}


@settings(max_examples=60, deadline=None)
@given(
    mqs=queue_lists,
    cids=client_ids,
    rooms=st.sets(st.sampled_from(ROOMS), min_size=1),
    data=st.data(),
)
def test_machine_room_covers_exactly_the_eligible_queues(mqs, cids, rooms, data):
    eligible = [mq for mq in mqs if mq.broker_name.split("@")[0] in rooms]
    strategy = AllocateMessageQueueByMachineRoom(rooms)
    assert_exactly_once_and_order_independent(data, strategy, mqs, cids, eligible=eligible)


def test_machine_room_rejects_empty_or_string_rooms():
    with pytest.raises(ValueError, match="consume_idcs is empty"):
        AllocateMessageQueueByMachineRoom(set())
    with pytest.raises(TypeError):
        AllocateMessageQueueByMachineRoom("hz")


# -- MACHINE_ROOM_NEARBY ------------------------------------------------------


def test_nearby_prefers_own_room_and_shares_rooms_without_clients():
    hz = queues(4, broker="hz@broker-a")
    sh = queues(4, broker="sh@broker-b")
    bj = queues(4, broker="bj@broker-c")  # no client lives in bj
    cids = ["hz@10.0.0.1@1", "sh@10.0.0.2@1"]
    got = allocation_by_client(AllocateMachineRoomNearby(), [*bj, *sh, *hz], cids)
    assert set(got["hz@10.0.0.1@1"]) == {*hz, *bj[:2]}
    assert set(got["sh@10.0.0.2@1"]) == {*sh, *bj[2:]}


@settings(max_examples=60, deadline=None)
@given(mqs=queue_lists, cids=client_ids)
def test_nearby_never_sends_a_queue_out_of_a_room_that_has_clients(mqs, cids):
    client_rooms = {cid.split("@")[0] for cid in cids}
    for mq, owner in owners(AllocateMachineRoomNearby(), mqs, cids).items():
        broker_room = mq.broker_name.split("@")[0]
        if broker_room in client_rooms:
            assert owner.split("@")[0] == broker_room


def test_nearby_uses_a_custom_resolver_and_inner_strategy():
    class TableResolver:
        def broker_room(self, mq):
            return {"broker-a": "east", "broker-b": "west"}[mq.broker_name]

        def consumer_room(self, cid):
            return {"alice": "east", "bob": "west", "carol": "west"}[cid]

    a, b = queues(3, broker="broker-a"), queues(4, broker="broker-b")
    strategy = AllocateMachineRoomNearby(AllocateMessageQueueAveragelyByCircle(), TableResolver())
    got = allocation_by_client(strategy, [*a, *b], ["carol", "alice", "bob"])
    assert got == {"alice": a, "bob": [b[0], b[2]], "carol": [b[1], b[3]]}


def test_nearby_default_resolver_rejects_names_without_a_room():
    with pytest.raises(ValueError, match="machine room unknown"):
        AllocateMachineRoomNearby().allocate(
            GROUP, "hz@c1", queues(2, broker="broker-a"), ["hz@c1"]
        )
    with pytest.raises(ValueError, match="machine room unknown for consumer id"):
        AllocateMachineRoomNearby().allocate(GROUP, "c1", queues(2, broker="hz@a"), ["c1"])


# -- registry and custom strategies -------------------------------------------


def test_strategy_by_name_is_case_insensitive_and_passes_kwargs():
    assert isinstance(strategy_by_name("avg"), AllocateMessageQueueAveragely)
    assert isinstance(strategy_by_name("Avg_By_Circle"), AllocateMessageQueueAveragelyByCircle)
    hashed = strategy_by_name("consistent_hash", virtual_node_count=3)
    assert isinstance(hashed, AllocateMessageQueueConsistentHash) and hashed.virtual_node_count == 3
    room = strategy_by_name(AllocateStrategyName.MACHINE_ROOM, consume_idcs={"hz"})
    assert room.consume_idcs == {"hz"}
    assert set(STRATEGIES) == {name.value for name in AllocateStrategyName}
    for name, factory in STRATEGIES.items():
        assert factory.name == name


def test_strategy_by_name_rejects_unknown_names_listing_the_known_ones():
    with pytest.raises(ValueError) as err:
        strategy_by_name("ROUND_ROBIN")
    message = str(err.value)
    assert "ROUND_ROBIN" in message
    for name in AllocateStrategyName:
        assert name.value in message


def test_a_user_strategy_plugs_in_through_the_same_interface():
    class AllocateEverythingToFirst(AllocateMessageQueueStrategy):
        name = "FIRST"

        def allocate(self, consumer_group, current_cid, mq_all, cid_all):
            prepared = prepare_allocation(consumer_group, current_cid, mq_all, cid_all)
            if prepared is None:
                return []
            mqs, cids = prepared
            return list(mqs) if cids[0] == current_cid else []

    strategy: AllocateMessageQueueStrategy = AllocateEverythingToFirst()
    mqs = queues(3)
    assert allocation_by_client(strategy, list(reversed(mqs)), ["b", "a"]) == {"a": mqs, "b": []}
    with pytest.raises(ValueError, match="cid_all is empty"):
        strategy.allocate(GROUP, "a", mqs, [])

    class Incomplete(AllocateMessageQueueStrategy):
        name = "INCOMPLETE"

    with pytest.raises(TypeError):
        Incomplete()
