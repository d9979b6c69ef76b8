"""Reset generations survive a restart, so an admin reset still wins over a stale consumer's commit."""

from __future__ import annotations

import json

import pytest

from tidemark.broker.errors import StaleResetGenerationError
from tidemark.broker.membership.epoch import EpochSequence
from tidemark.broker.offsets import ConsumerOffsetManager, Fence
from tidemark.broker.offsets.persistence import decode_offset_table, encode_offset_table


def test_generations_round_trip_beside_the_rocketmq_table():
    table = {("t", "g"): {0: 10, 1: 20}}
    data = encode_offset_table(table, {("t", "g"): {1: 1234567}})
    doc = json.loads(data)
    assert doc["offsetTable"] == {"t@g": {"0": 10, "1": 20}}
    assert doc["resetGenerations"] == {"t@g": {"1": 1234567}}
    decoded = decode_offset_table(data)
    assert decoded.table == table and decoded.reset_generations == {("t", "g"): {1: 1234567}}
    assert encode_offset_table(table, {}) == encode_offset_table(table)  # no resets: RocketMQ's exact shape


def test_malformed_generations_are_skipped_not_fatal():
    doc = {"offsetTable": {"t@g": {"0": 1}}, "resetGenerations": {"t@g": {"0": "x"}, "other@g": {"0": 5}}}
    decoded = decode_offset_table(json.dumps(doc))
    assert decoded.table == {("t", "g"): {0: 1}} and decoded.reset_generations == {}


def manager(tmp_path, seed: int) -> ConsumerOffsetManager:
    m = ConsumerOffsetManager(tmp_path, epochs=EpochSequence(seed=seed))
    m.load()
    return m


def test_a_reset_wins_over_a_stale_commit_after_a_restart(tmp_path):
    first = manager(tmp_path, seed=1_000)
    first.commit("g", "t", 0, 50, Fence("c1", reset_generation=0))
    first.reset("g", "t", 0, 5)
    generation = first.reset_generation("g", "t", 0)
    assert generation > 0
    first.persist_now()

    second = manager(tmp_path, seed=2_000_000)  # a later broker process: larger epochs, empty memory
    assert second.query("g", "t", 0) == 5
    assert second.reset_generation("g", "t", 0) == generation
    with pytest.raises(StaleResetGenerationError):
        second.commit("g", "t", 0, 51, Fence("c1", reset_generation=0))
    assert second.query("g", "t", 0) == 5
    assert second.commit("g", "t", 0, 6, Fence("c1", reset_generation=generation))


def test_reset_to_the_same_offset_still_persists_the_generation(tmp_path):
    m = manager(tmp_path, seed=10)
    m.commit("g", "t", 0, 7)
    m.persist_now()
    m.reset("g", "t", 0, 7)
    assert m.dirty
    m.persist_now()
    assert json.loads((tmp_path / "consumerOffset.json").read_text())["resetGenerations"] == {"t@g": {"0": 11}}
    m.remove_group("g")
    m.persist_now()
    assert "resetGenerations" not in json.loads((tmp_path / "consumerOffset.json").read_text())
