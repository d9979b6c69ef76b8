"""The read bound across restarts (broker/cluster/replication_checkpoint.py): restored only in the epoch that wrote
it, never past the recovered log's end, and written when it moved."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from tidemark.broker.cluster.replication import ReplicationSource
from tidemark.broker.cluster.replication_checkpoint import (
    CHECKPOINT_FILE_NAME,
    ReplicationCheckpoint,
    load_confirmed,
)
from tidemark.broker.errors import ConfigFileError


def source(end: int) -> ReplicationSource:
    store = SimpleNamespace(commit_log_max_offset=end)
    s = ReplicationSource(store, broker_name="broker-a", segment_size=1 << 20, sync=True)
    s.on_readable, s.on_all_readable = (lambda topic, queue_id: None), (lambda: None)
    return s


def write(config_dir, doc) -> None:
    (config_dir / CHECKPOINT_FILE_NAME).write_text(json.dumps(doc))


def test_the_bound_is_written_when_it_moves_and_restored_in_the_same_epoch(tmp_path):
    s = source(500)
    checkpoint = ReplicationCheckpoint(tmp_path, s, lambda: 3)
    asyncio.run(checkpoint.save_if_moved())
    assert load_confirmed(tmp_path) is None  # no replica yet: nothing to keep
    s._confirm(400)
    asyncio.run(checkpoint.save_if_moved())
    assert load_confirmed(tmp_path) == (400, 3)

    restarted = source(500)
    ReplicationCheckpoint(tmp_path, restarted, lambda: 3).restore(log_end=500)
    assert restarted.read_limit() == 400


def test_a_checkpoint_ahead_of_the_recovered_log_is_cut_to_its_end(tmp_path):
    write(tmp_path, {"confirmed": 900, "epoch": 0})
    s = source(600)  # the crash lost the log's unflushed tail
    ReplicationCheckpoint(tmp_path, s, lambda: 0).restore(log_end=600)
    assert s.read_limit() == 600  # not 900: what is stored past 600 from now on waits for a replica


def test_a_checkpoint_of_another_epoch_is_ignored(tmp_path):
    write(tmp_path, {"confirmed": 300, "epoch": 1})  # written in an earlier life as master
    s = source(800)
    ReplicationCheckpoint(tmp_path, s, lambda: 2).restore(log_end=800)
    assert s.read_limit() is None


@pytest.mark.parametrize("doc", [{"confirmed": -1, "epoch": 0}, {"confirmed": 5}, {"confirmed": True, "epoch": 0},
                                 {"confirmed": "5", "epoch": 0}])
def test_a_file_that_is_no_checkpoint_stops_the_start(tmp_path, doc):
    write(tmp_path, doc)
    with pytest.raises(ConfigFileError, match="holds no replicated end"):
        ReplicationCheckpoint(tmp_path, source(0), lambda: 0).restore(log_end=0)
