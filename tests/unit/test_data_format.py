"""The data dir's format stamp: what a stamp must look like, what a broker refuses, and what it writes."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
from pathlib import Path

import pytest

from tidemark.broker.disk import data_format
from tidemark.broker.disk.data_format import (
    CURRENT_FORMAT,
    FORMAT_FILE,
    READABLE_FORMATS,
    DataFormatError,
    FormatStamp,
    Stamped,
    StampError,
    Stamping,
    check,
    decode_stamp,
    encode_stamp,
    ensure,
    holds_broker_data,
    read_stamp,
    readable_text,
    refusal,
)

V = "0.1.0"


def _tree(root: Path) -> dict[str, str]:
    """Every entry under root with its content hash (directories as 'dir'): what 'unchanged' means."""
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


# -- pure: encoding ------------------------------------------------------------------


def test_a_stamp_is_json_with_the_format_and_the_version_that_wrote_it():
    data = encode_stamp(FormatStamp(1, "tidemark 0.1.0"))
    assert json.loads(data) == {"format": 1, "written_by": "tidemark 0.1.0"}
    assert data.endswith(b"\n")
    assert decode_stamp(data) == FormatStamp(1, "tidemark 0.1.0")


def test_keys_a_later_version_adds_are_ignored_and_written_by_is_optional():
    assert decode_stamp(b'{"format": 1, "features": ["x"], "written_by": "tidemark 0.3.0"}') == \
        FormatStamp(1, "tidemark 0.3.0")
    assert decode_stamp(b'{"format": 7}') == FormatStamp(7, "")


@pytest.mark.parametrize(("data", "reason"), [
    (b"", "empty"),
    (b" \n\t", "empty"),
    (b'{"format": ', "not valid JSON: Expecting value at line 1"),
    (b"format=1", "not valid JSON: Expecting value at line 1"),
    (b"\x80\x81\x82 garbage", "not text"),
    (b"[1]", "not a JSON object"),
    (b"1", "not a JSON object"),
    (b'{"written_by": "tidemark 0.1.0"}', 'no "format"'),
    (b'{"format": "1"}', '"format" is "1", expected an integer >= 1'),
    (b'{"format": true}', '"format" is true, expected an integer >= 1'),
    (b'{"format": 1.0}', '"format" is 1.0, expected an integer >= 1'),
    (b'{"format": null}', '"format" is null, expected an integer >= 1'),
    (b'{"format": 0}', '"format" is 0, expected an integer >= 1'),
    (b'{"format": -3}', '"format" is -3, expected an integer >= 1'),
    (b'{"format": 1, "written_by": 5}', '"written_by" is 5, expected a string'),
])
def test_anything_but_a_whole_stamp_is_refused_saying_what_is_wrong(data, reason):
    with pytest.raises(StampError) as e:
        decode_stamp(data)
    assert str(e.value) == reason


# -- pure: the decision --------------------------------------------------------------


def test_a_readable_format_is_no_refusal():
    assert refusal(Path("/d"), FormatStamp(1, "tidemark 0.1.0"), version=V) is None
    assert refusal(Path("/d"), FormatStamp(2), version=V, readable={1, 2}) is None


def test_a_newer_format_is_refused_naming_the_dir_the_format_found_and_the_formats_read():
    error = refusal(Path("/srv/data"), FormatStamp(99, "tidemark 9.0.0"), version=V)
    assert isinstance(error, DataFormatError)
    assert str(error) == ("data dir /srv/data holds on-disk format 99 (stamped by tidemark 9.0.0) and tidemark "
                          "0.1.0 reads formats 1, 2 and 3 only: start it with a Tidemark that reads format 99; nothing was "
                          "changed")


def test_an_older_format_a_build_no_longer_reads_is_refused_as_well():
    error = refusal(Path("/d"), FormatStamp(1), version="2.0.0", readable={2, 3})
    assert str(error).startswith("data dir /d holds on-disk format 1 (stamped by an unknown version) and "
                                 "tidemark 2.0.0 reads formats 2 and 3 only")


@pytest.mark.parametrize(("readable", "text"), [
    ({1}, "format 1"), ({2, 1}, "formats 1 and 2"), ({3, 1, 2}, "formats 1, 2 and 3")])
def test_readable_formats_are_listed_in_order(readable, text):
    assert readable_text(readable) == text


def test_a_dir_counts_as_used_by_a_broker_when_it_holds_what_a_broker_leaves():
    assert not holds_broker_data([])
    assert not holds_broker_data(["lock"])  # every start creates it before the stamp is written
    assert not holds_broker_data(["lock", ".format.json.tmp", "notes.txt"])
    for name in ("commitlog", "consumequeue", "config", "checkpoint", "abort"):
        assert holds_broker_data(["lock", name])


# -- files -------------------------------------------------------------------------


def test_no_dir_and_no_stamp_read_as_unstamped(tmp_path):
    assert read_stamp(tmp_path / "absent", version=V) is None
    assert read_stamp(tmp_path, version=V) is None
    assert check(tmp_path, version=V) is None
    (tmp_path / "a-file").touch()  # not a dir: the lock says so, in its words, not the stamp
    assert read_stamp(tmp_path / "a-file", version=V) is None


def test_a_garbled_stamp_is_refused_naming_the_dir_and_why(tmp_path):
    (tmp_path / FORMAT_FILE).write_bytes(b'{"format": ')
    with pytest.raises(DataFormatError) as e:
        check(tmp_path, version=V)
    assert str(e.value) == (f"data dir {tmp_path} has an unusable format stamp ({FORMAT_FILE} is not valid JSON: "
                            f"Expecting value at line 1), so its on-disk format is unknown and tidemark 0.1.0 "
                            f"reads formats 1, 2 and 3: repair or restore {FORMAT_FILE}; nothing was changed")
    assert "\n" not in str(e.value)


def test_a_stamp_that_cannot_be_read_is_refused(tmp_path):
    (tmp_path / FORMAT_FILE).mkdir()  # read_bytes raises IsADirectoryError, as any unreadable file would
    with pytest.raises(DataFormatError, match=r"\(format\.json is unreadable: Is a directory\)"):
        read_stamp(tmp_path, version=V)


def test_ensure_stamps_a_new_dir(tmp_path, caplog):
    with caplog.at_level(logging.INFO, "tidemark.broker"):
        stamping = ensure(tmp_path, version=V)
    assert stamping.outcome is Stamped.NEW
    assert stamping.stamp == FormatStamp(CURRENT_FORMAT, "tidemark 0.1.0")
    assert json.loads((tmp_path / FORMAT_FILE).read_bytes()) == {"format": CURRENT_FORMAT,
                                                                 "written_by": "tidemark 0.1.0"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [FORMAT_FILE]  # no temp file left behind
    assert "existing_data=False" in caplog.text


def test_ensure_adopts_a_dir_written_before_stamps_as_format_1_and_logs_it_once(tmp_path, caplog):
    (tmp_path / "commitlog").mkdir()
    (tmp_path / "commitlog" / "00000000000000000000").write_bytes(b"records")
    (tmp_path / "lock").write_text("123\n")
    before = _tree(tmp_path)
    with caplog.at_level(logging.INFO, "tidemark.broker"):
        assert ensure(tmp_path, version=V).outcome is Stamped.ADOPTED
        assert ensure(tmp_path, version=V).outcome is Stamped.FOUND  # the next start finds it
    assert caplog.text.count("event=data_format_stamped") == 1
    assert "existing_data=True" in caplog.text
    after = _tree(tmp_path)
    assert after.pop(FORMAT_FILE) and after == before  # the data itself is not touched


def test_ensure_leaves_a_stamp_of_the_current_format_as_it_is(tmp_path):
    data = b'{"format": %d, "written_by": "tidemark 0.0.9"}' % CURRENT_FORMAT
    (tmp_path / FORMAT_FILE).write_bytes(data)
    stamping = ensure(tmp_path, version=V)
    assert stamping.outcome is Stamped.FOUND and stamping.stamp == FormatStamp(CURRENT_FORMAT, "tidemark 0.0.9")
    assert (tmp_path / FORMAT_FILE).read_bytes() == data


def test_ensure_stamps_an_older_format_it_reads_with_the_current_one(tmp_path, caplog):
    """What the broker writes next is in the current layout (format 3: the pop journal's message groups), so
    a build that reads an older format only must refuse the dir from now on instead of cutting the journal."""
    assert CURRENT_FORMAT == 3 and READABLE_FORMATS == {1, 2, 3}
    (tmp_path / FORMAT_FILE).write_bytes(b'{"format": 1, "written_by": "tidemark 0.1.0"}')
    (tmp_path / "commitlog").mkdir()
    with caplog.at_level(logging.INFO, "tidemark.broker"):
        stamping = ensure(tmp_path, version="0.3.0")
    assert stamping == Stamping(Stamped.UPGRADED, FormatStamp(3, "tidemark 0.3.0"))
    assert json.loads((tmp_path / FORMAT_FILE).read_bytes()) == {"format": 3, "written_by": "tidemark 0.3.0"}
    assert "event=data_format_upgraded" in caplog.text and "previous=1" in caplog.text
    assert ensure(tmp_path, version="0.3.0").outcome is Stamped.FOUND
    assert refusal(tmp_path, FormatStamp(3, "tidemark 0.3.0"), version="0.1.0", readable={1, 2}) is not None


@pytest.mark.parametrize("before", [b'{"format": 1}', None], ids=["older-stamp", "data-from-before-stamps"])
def test_a_dir_with_data_that_cannot_be_stamped_with_the_current_format_is_refused(tmp_path, monkeypatch, before):
    """Review: starting anyway wrote current-layout records (FIFO pop groups) under an older stamp, which
    a build reading only that format would then misread and cut."""
    if before is None:
        (tmp_path / "commitlog").mkdir()
    else:
        (tmp_path / FORMAT_FILE).write_bytes(before)
    snapshot = _tree(tmp_path)

    def full_disk(path, data, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(data_format, "atomic_write", full_disk)
    with pytest.raises(DataFormatError, match=rf"holds on-disk format 1 and tidemark {V} writes format "
                                              rf"{CURRENT_FORMAT}, but cannot stamp it so \(format\.json: No space"):
        ensure(tmp_path, version=V)
    assert _tree(tmp_path) == snapshot


@pytest.mark.parametrize("stamp", [b'{"format": 99, "written_by": "tidemark 9.0.0"}', b"garbage"])
def test_ensure_refuses_what_it_cannot_read_and_changes_nothing(tmp_path, stamp):
    (tmp_path / FORMAT_FILE).write_bytes(stamp)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "topics.json").write_text("{}")
    before = _tree(tmp_path)
    with pytest.raises(DataFormatError, match=f"^data dir {tmp_path} "):
        ensure(tmp_path, version=V)
    assert _tree(tmp_path) == before


def test_a_stamp_that_cannot_be_written_does_not_stop_the_broker(tmp_path, monkeypatch, caplog):
    def full_disk(path, data, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(data_format, "atomic_write", full_disk)
    with caplog.at_level(logging.WARNING, "tidemark.broker"):
        stamping = ensure(tmp_path, version=V)
    assert stamping.outcome is Stamped.NOT_WRITTEN
    assert not (tmp_path / FORMAT_FILE).exists()  # still unstamped: format 1, and the next start tries again
    assert "No space left on device" in caplog.text and "event=data_format_stamp_failed" in caplog.text
