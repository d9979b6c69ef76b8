"""consumerOffset.json encoding/decoding and the .bak fallback on load."""

import json
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemark.broker.errors import ConfigFileError
from tidemark.broker.offsets.persistence import (
    LoadSource,
    OffsetFileError,
    decode_offset_table,
    encode_offset_table,
    load_offset_file,
    write_offset_file,
)

# RocketMQ's broker-side consumerOffset.json layout, byte for byte: {"offsetTable": {"topic@group": {queueId: offset}}}.
# Convention: no trailing newline, as RocketMQ writes it.
SEED_EXAMPLE = (
    b"{\n"
    b'    "offsetTable": {\n'
    b'        "test-topic@test-group": {\n'
    b'            "0": 88526, \n'
    b'            "1": 88528\n'
    b"        }\n"
    b"    }\n"
    b"}"
)
LOG = logging.getLogger("test-offsets")

names = st.from_regex(r"[%|a-zA-Z0-9_-]{1,20}", fullmatch=True)
tables = st.dictionaries(
    st.tuples(names, names),
    st.dictionaries(st.integers(0, 1023), st.integers(0, 2**63 - 1), min_size=1, max_size=8),
    max_size=8,
)


def _reference_json(table):
    """What json.dumps gives for the RocketMQ layout, to pin the hand-written encoder."""
    obj = {
        "offsetTable": {
            f"{t}@{g}": {str(q): table[(t, g)][q] for q in sorted(table[(t, g)])}
            for t, g in sorted(table)
        }
    }
    return json.dumps(obj, indent=4, separators=(", ", ": ")).encode()


def test_encodes_the_seed_example_byte_for_byte():
    assert encode_offset_table({("test-topic", "test-group"): {1: 88528, 0: 88526}}) == SEED_EXAMPLE


def test_decodes_the_seed_example():
    result = decode_offset_table(SEED_EXAMPLE)
    assert result.table == {("test-topic", "test-group"): {0: 88526, 1: 88528}}
    assert result.skipped == []


def test_empty_table_encoding_is_valid_rocketmq_shape():
    assert json.loads(encode_offset_table({})) == {"offsetTable": {}}
    assert decode_offset_table(encode_offset_table({})).table == {}


def test_order_is_deterministic_topic_then_group_then_numeric_queue():
    table = {("t2", "g"): {10: 1, 2: 2}, ("t1", "gb"): {0: 3}, ("t1", "ga"): {0: 4}}
    reordered = dict(reversed(list(table.items())))
    text = encode_offset_table(table).decode()
    assert encode_offset_table(reordered).decode() == text
    assert text.index('"t1@ga"') < text.index('"t1@gb"') < text.index('"t2@g"')
    assert text.index('"2": 2') < text.index('"10": 1')  # numeric, not string order


@given(tables)
def test_encoder_matches_json_dumps_byte_for_byte(table):
    assert encode_offset_table(table) == _reference_json(table)


@given(tables)
def test_decode_inverts_encode(table):
    result = decode_offset_table(encode_offset_table(table))
    assert result.table == table
    assert result.skipped == []


def test_extra_top_level_keys_are_ignored():
    doc = {"offsetTable": {"t@g": {"0": 5}}, "dataVersion": {"counter": 3}}
    assert decode_offset_table(json.dumps(doc)).table == {("t", "g"): {0: 5}}


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "empty"),
        (b"  \n", "empty"),
        (SEED_EXAMPLE[: len(SEED_EXAMPLE) // 2], "not valid JSON"),
        (SEED_EXAMPLE[:-1], "not valid JSON"),
        (b"{offsetTable: nope", "not valid JSON"),
        (b"\xff\xfe\x00", "UTF-8"),
        (b"[1, 2]", "expected an object"),
        (b'{"other": {}}', 'no "offsetTable"'),
        (b'{"offsetTable": [1]}', "expected an object"),
    ],
)
def test_unusable_content_is_rejected_as_a_whole(content, reason):
    with pytest.raises(OffsetFileError, match=reason):
        decode_offset_table(content)


def test_every_proper_prefix_of_a_file_is_rejected():
    # A torn write must never load as a valid (smaller) table.
    data = encode_offset_table({("t", "g"): {0: 1, 1: 22}, ("u", "g"): {3: 333}})
    for cut in range(len(data)):
        with pytest.raises(OffsetFileError):
            decode_offset_table(data[:cut])


def test_malformed_entries_are_skipped_and_named():
    doc = {
        "offsetTable": {
            "good@g": {"0": 10, "1": -3, "x": 4, "2": "12", "3": 1.5, "4": True, "-1": 7},
            "no-separator": {"0": 1},
            "a@b@c": {"0": 1},
            "@g": {"0": 1},
            "list@g": [1, 2],
        }
    }
    result = decode_offset_table(json.dumps(doc))
    assert result.table == {("good", "g"): {0: 10}}
    joined = "\n".join(result.skipped)
    assert len(result.skipped) == 10
    for fragment in [
        "'good@g' queue '1': offset -3 is negative",
        "'good@g' queue 'x': queue id",
        "'good@g' queue '2': offset '12' is not an integer",
        "'good@g' queue '3': offset 1.5",
        "'good@g' queue '4': offset True",
        "'good@g' queue '-1': queue id",
        "'no-separator'",
        "'a@b@c'",
        "'@g'",
        "'list@g': value is an array",
    ]:
        assert fragment in joined


# -- load_offset_file: the .bak fallback ------------------------------------


def _damage(kind):
    return {
        "empty": b"",
        "truncated": SEED_EXAMPLE[:37],
        "invalid": b'{"offsetTable": {"t@g": {"0": 1,,}}}',
        "wrong-shape": b'{"offsets": {"t@g": {"0": 1}}}',
    }[kind]


@pytest.fixture
def files(tmp_path):
    path = tmp_path / "consumerOffset.json"
    return path, tmp_path / "consumerOffset.json.bak"


def _load(path, allow=False):
    return load_offset_file(path, allow_empty_on_corruption=allow, logger=LOG)


def test_main_file_is_used_when_good(files):
    path, bak = files
    path.write_bytes(SEED_EXAMPLE)
    bak.write_bytes(encode_offset_table({("old", "g"): {0: 1}}))
    table, report = _load(path)
    assert table == {("test-topic", "test-group"): {0: 88526, 1: 88528}}
    assert (report.source, report.path, report.entries, report.skipped) == (
        LoadSource.MAIN,
        path,
        2,
        [],
    )


def test_no_files_means_empty_table(files):
    path, _ = files
    table, report = _load(path)
    assert table == {}
    assert (report.source, report.path, report.entries) == (LoadSource.NONE, None, 0)


def test_missing_main_falls_back_to_bak_with_warning(files, caplog):
    path, bak = files
    bak.write_bytes(SEED_EXAMPLE)
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        table, report = _load(path)
    assert report.source is LoadSource.BACKUP and report.path == bak and report.entries == 2
    assert table == {("test-topic", "test-group"): {0: 88526, 1: 88528}}
    assert any(
        "is missing" in r.getMessage() and str(bak) in r.getMessage() for r in caplog.records
    )


@pytest.mark.parametrize("kind", ["empty", "truncated", "invalid", "wrong-shape"])
def test_damaged_main_falls_back_to_bak_and_says_why(files, caplog, kind):
    path, bak = files
    path.write_bytes(_damage(kind))
    bak.write_bytes(SEED_EXAMPLE)
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        table, report = _load(path)
    assert report.source is LoadSource.BACKUP
    assert table == {("test-topic", "test-group"): {0: 88526, 1: 88528}}
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "unusable" in warning.getMessage() and str(bak) in warning.getMessage()
    # The damaged file is set aside so the next persist cannot rotate it over the good .bak.
    assert not path.exists()
    assert (path.parent / "consumerOffset.json.corrupt").read_bytes() == _damage(kind)
    assert bak.read_bytes() == SEED_EXAMPLE


@pytest.mark.parametrize("bak_content", [None, b"", b'{"offsetTable": {'])
@pytest.mark.parametrize("kind", ["empty", "truncated", "invalid", "wrong-shape"])
def test_damaged_main_without_good_bak_is_refused(files, kind, bak_content):
    path, bak = files
    path.write_bytes(_damage(kind))
    if bak_content is not None:
        bak.write_bytes(bak_content)
    with pytest.raises(ConfigFileError) as exc:
        _load(path)
    assert str(path) in str(exc.value) and "unusable" in str(exc.value)
    assert path.read_bytes() == _damage(kind)  # nothing touched


def test_missing_main_with_damaged_bak_is_refused(files):
    path, bak = files
    bak.write_bytes(b"{")
    with pytest.raises(ConfigFileError, match="missing"):
        _load(path)


def test_allow_empty_on_corruption_starts_empty_with_error_log(files, caplog):
    path, _ = files
    path.write_bytes(_damage("truncated"))
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        table, report = _load(path, allow=True)
    assert table == {} and report.source is LoadSource.FORCED_EMPTY and report.entries == 0
    assert any(r.levelno == logging.ERROR and str(path) in r.getMessage() for r in caplog.records)
    assert (path.parent / "consumerOffset.json.corrupt").read_bytes() == _damage("truncated")


def test_skipped_entries_are_reported_and_logged(files, caplog):
    path, _ = files
    path.write_text(json.dumps({"offsetTable": {"t@g": {"0": 5, "1": -1}, "bad": {"0": 1}}}))
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        table, report = _load(path)
    assert table == {("t", "g"): {0: 5}}
    assert report.source is LoadSource.MAIN and report.entries == 1
    assert len(report.skipped) == 2
    assert any("'t@g' queue '1'" in s for s in report.skipped)
    assert any("'bad'" in s for s in report.skipped)
    assert sum("skipped malformed" in r.getMessage() for r in caplog.records) == 2


def test_write_keeps_previous_file_as_bak(files):
    path, bak = files
    first = encode_offset_table({("t", "g"): {0: 1}})
    second = encode_offset_table({("t", "g"): {0: 2}})
    write_offset_file(path, first)
    assert not bak.exists()
    write_offset_file(path, second)
    assert path.read_bytes() == second
    assert bak.read_bytes() == first
