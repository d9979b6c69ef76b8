"""The data dir's format stamp with real broker processes: written on a new dir, added to a dir from before
stamps without losing its data, and a dir in a format this build does not read (or with a garbled stamp)
refused in one line, exit 2, byte for byte unchanged."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from brokerproc import BrokerProcess, BrokerStubs, orphan_safe

from tidemark.broker.version import VERSION
from tidemark.v1 import admin_pb2, common_pb2, messaging_pb2, offsets_pb2

TOPIC, GROUP = "Kept", "keepers"
BODIES = [f"m{i}".encode() for i in range(5)]
STAMP = {"format": 3, "written_by": f"tidemark {VERSION}"}


def _tree(root: Path) -> dict[str, str]:
    """Every entry of a data dir with its content hash: what 'unchanged' means (the lock file included)."""
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


def _check_data(broker: BrokerProcess) -> None:
    """The messages and the group's offset that _seeded_dir stored are served as they were."""
    with BrokerStubs(broker.address) as stubs:
        pulled = stubs.messaging.PullMessage(messaging_pb2.PullMessageRequest(
            topic=TOPIC, queue_id=0, queue_offset=0, max_msg_nums=32), timeout=10)
        assert [m.body for m in pulled.messages] == BODIES
        committed = stubs.offsets.QueryConsumerOffset(offsets_pb2.QueryConsumerOffsetRequest(
            group=GROUP, topic=TOPIC, queue_id=0), timeout=10)
        assert committed.offset == 3


@pytest.fixture(scope="module")
def seeded_dir(tmp_path_factory) -> Path:
    """A data dir a broker wrote and left cleanly: a topic, five messages, a group's offset (tests copy it)."""
    broker = BrokerProcess(tmp_path_factory.mktemp("seeded") / "data").start()
    try:
        with BrokerStubs(broker.address) as stubs:
            stubs.admin.CreateTopic(admin_pb2.CreateTopicRequest(name=TOPIC, queue_nums=2), timeout=10)
            stubs.messaging.SendMessage(messaging_pb2.SendMessageRequest(
                topic=TOPIC, queue_id=0, messages=[common_pb2.Message(body=b) for b in BODIES]), timeout=10)
            stubs.offsets.UpdateConsumerOffset(offsets_pb2.UpdateConsumerOffsetRequest(
                commit=offsets_pb2.OffsetCommit(group=GROUP, topic=TOPIC, queue_id=0, offset=3)), timeout=10)
    finally:
        assert broker.stop() == 0
    return broker.data_dir


def _copy(seeded_dir: Path, tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(seeded_dir, data)
    return data


def test_a_new_data_dir_is_stamped_once(broker_factory):
    broker = broker_factory()
    stamp = broker.data_dir / "format.json"
    assert json.loads(stamp.read_bytes()) == STAMP
    written = stamp.read_bytes()
    broker.restart()
    assert stamp.read_bytes() == written  # a stamp this build reads is left as it is
    log = broker.log_text()
    assert log.count("event=data_format_stamped") == 1 and "existing_data=False" in log


def test_a_dir_from_before_stamps_is_stamped_and_keeps_its_data(seeded_dir, tmp_path):
    data = _copy(seeded_dir, tmp_path)
    (data / "format.json").unlink()  # what every Tidemark before the stamp left
    broker = BrokerProcess(data).start()
    try:
        assert json.loads((data / "format.json").read_bytes()) == STAMP
        assert "existing_data=True" in broker.log_text()
        _check_data(broker)
    finally:
        broker.kill()


def test_a_format_1_dir_is_stamped_format_2_before_the_broker_writes_and_keeps_its_data(seeded_dir, tmp_path):
    data = _copy(seeded_dir, tmp_path)
    (data / "format.json").write_bytes(b'{"format": 1, "written_by": "tidemark 0.2.0"}')
    broker = BrokerProcess(data).start()
    try:
        assert json.loads((data / "format.json").read_bytes()) == STAMP
        assert "event=data_format_upgraded" in broker.log_text()
        _check_data(broker)
    finally:
        broker.kill()


@pytest.mark.parametrize(("stamp", "refusal"), [
    (b'{"format": 99, "written_by": "tidemark 9.0.0"}',
     "holds on-disk format 99 (stamped by tidemark 9.0.0) and tidemark {version} reads formats 1, 2 and 3 only: start it "
     "with a Tidemark that reads format 99; nothing was changed"),
    (b'{"format": 1',
     "has an unusable format stamp (format.json is not valid JSON: Expecting ',' delimiter at line 1), so its "
     "on-disk format is unknown and tidemark {version} reads formats 1, 2 and 3: repair or restore format.json; nothing "
     "was changed"),
], ids=["newer-format", "garbled-stamp"])
def test_a_dir_this_build_cannot_read_is_refused_in_one_line_and_left_unchanged(seeded_dir, tmp_path, stamp,
                                                                                refusal):
    data = _copy(seeded_dir, tmp_path)
    (data / "format.json").write_bytes(stamp)
    before = _tree(data)
    broker = BrokerProcess(data)
    refused = subprocess.run(orphan_safe(broker.command()), capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [f"tidemark broker: data dir {data} " + refusal.format(version=VERSION)]
    assert refused.stdout == ""
    assert _tree(data) == before  # not even the lock file's pid was rewritten
    # Nothing was lost: with a stamp it reads, the same dir serves the same data.
    (data / "format.json").write_bytes(json.dumps(STAMP).encode())
    try:
        _check_data(broker.start())
    finally:
        broker.kill()
