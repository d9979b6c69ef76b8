"""A replica mirrors its master's topics, groups and delay progress; names and levels no RPC would accept
are left out, as HandBackOffsets refuses them on the master (tests/unit/offsets/test_offset_refusals.py)."""

from __future__ import annotations

import logging

from tidemark.broker.ingest.delays import ScheduleMessageService
from tidemark.broker.membership.groups import SubscriptionGroupManager
from tidemark.broker.topics import TopicConfigManager


def test_mirrored_topics_with_bad_names_are_left_out_and_said_once(tmp_path, caplog):
    topics = TopicConfigManager(tmp_path)
    topics.load()
    doc = {"topicConfigTable": {name: {"readQueueNums": 1, "writeQueueNums": 1, "perm": 6}
                                for name in ("good", "bad\n", "f:G", "%RETRY%g")}}
    with caplog.at_level(logging.WARNING):
        assert topics.mirror(doc)
        topics.mirror(doc)
    assert [t.name for t in topics.list(include_system=True)] == ["%RETRY%g", "good"]
    assert len([r for r in caplog.records if "mirrored topic skipped" in r.getMessage()]) == 2  # once each


def test_mirrored_groups_with_bad_names_are_left_out(tmp_path):
    groups = SubscriptionGroupManager(tmp_path)
    groups.load()
    assert groups.mirror({"subscriptionGroupTable": {"ok": {}, "g\n": {}, "f:G": {}}})
    assert groups.groups() == ["ok"]


def test_mirrored_delay_progress_of_levels_this_broker_lacks_is_ignored(tmp_path):
    schedule = ScheduleMessageService(store=None, config_dir=tmp_path, levels_ms=(1000, 5000), clock_ms=lambda: 0)
    schedule.mirror({1: 4, 2: 3, 99: 7, 0: 5, -1: 2})
    assert schedule.progress() == {1: 4, 2: 3}
