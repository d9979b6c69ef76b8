"""The source's bulk decoder (arrow.records_to_batch: numpy and Arrow over a whole buffer) against
tidemark.common.records' own decoding of one record at a time.

Pure: records are built with records.RecordBatchBuilder and stamped as the broker stamps them; no
broker, no SparkSession.
"""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.common import records
from tidemark.common.protocol import PropertyKey, tag_hash
from tidemark.spark_connector.arrow import ARROW_SCHEMA, records_to_batch

_I32, _I64 = struct.Struct(">i"), struct.Struct(">q")
_SPECIAL = (PropertyKey.UNIQ_KEY, PropertyKey.KEYS, PropertyKey.TAGS)


def stored(topic: str, host: str, messages: list[tuple[bytes, bytes, int, int]], *, first_offset: int = 7,
           queue_id: int = 3) -> bytes:
    """Records as the broker serves them: (body, encoded properties, born ms, reconsume times) each,
    stamped with queue id, queue offset, store time, physical offset and CRC."""
    builder = records.RecordBatchBuilder(topic, host)
    for body, props, born, _ in messages:
        tag = records.property_value(props, (PropertyKey.TAGS + "\x01").encode()) if props else None
        builder.append(body, props, tags_code=tag_hash(tag.decode()) if tag else 0, born_timestamp=born)
    buf = builder.buffer
    view = memoryview(buf)
    for i, (start, size) in enumerate(records.record_spans(buf)):
        _I32.pack_into(buf, start + records.QUEUE_ID_OFFSET, queue_id)
        _I64.pack_into(buf, start + records.QUEUE_OFFSET_OFFSET, first_offset + i)
        _I64.pack_into(buf, start + records.STORE_TS_OFFSET, 1_700_000_000_000 + i)
        _I32.pack_into(buf, start + 56, messages[i][3])  # reconsume times
        records.seal(buf, view, start, size, 1000 + start)
    view.release()
    return bytes(buf)


def one_by_one(data: bytes, topic: str, broker: str) -> list[dict]:
    """Rows decoded record by record with records' own functions: what records_to_batch must equal."""
    rows = []
    for start, _ in records.record_spans(data):
        (_size, _magic, _crc, queue_id, _flag, queue_offset, _phys, _sys, born, store, reconsume,
         _tags_code) = records.HEADER.unpack_from(data, start)
        _, _, _, _, props_at, props_len, body_at, body_len = records.variable_fields(data, start)
        props = records.decode_properties(data[props_at:props_at + props_len])
        special = [props.pop(key, "") or None for key in _SPECIAL]
        rows.append({"topic": topic, "broker": broker, "queue_id": queue_id, "queue_offset": queue_offset,
                     "msg_id": special[0], "keys": special[1], "tags": special[2],
                     "body": data[body_at:body_at + body_len], "properties": props,
                     "born_timestamp": born, "store_timestamp": store, "reconsume_times": reconsume})
    return rows


def in_bulk(data: bytes, count: int, topic: str, broker: str) -> list[dict]:
    batch = records_to_batch(data, count, topic=topic, broker=broker)
    assert batch.schema.equals(ARROW_SCHEMA) and batch.num_rows == count
    batch.validate(full=True)
    rows = batch.to_pylist()
    for row, micros in zip(rows, batch.column("born_timestamp").cast(pa.int64()).to_pylist(), strict=True):
        row["properties"] = dict(row["properties"])  # a key given twice: the last value, as decode_properties
        row["born_timestamp"] = micros // 1000
    for row, micros in zip(rows, batch.column("store_timestamp").cast(pa.int64()).to_pylist(), strict=True):
        row["store_timestamp"] = micros // 1000
    return rows


_text = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=20)
# Keys near the special names (a prefix, a longer name, other case) must land in the map.
_key = st.one_of(_text.filter(bool), st.sampled_from(["UNIQ", "UNIQ_KEY2", "KEY", "KEYSX", "TAG", "tags",
                                                       "TAGS ", "a", "\u00e9t\u00e9"]))
_body = st.one_of(st.binary(max_size=40), st.sampled_from([b"", b"x" * 12, b"y" * 13]),
                  st.integers(1, 200_000).map(lambda n: bytes([n % 251]) * n))


@st.composite
def _properties(draw) -> bytes:
    """An encoded section: msg id, tag and keys each present or not (and maybe empty), user properties,
    sometimes a key given twice (stored as it came; producers that are not ours may send that)."""
    pairs = [(k, draw(_text)) for k in draw(st.lists(_key, max_size=4))]
    for key in _SPECIAL:
        if draw(st.booleans()):
            pairs.insert(draw(st.integers(0, len(pairs))), (key, draw(_text)))
    if pairs and draw(st.integers(0, 5)) == 0:
        pairs.append((draw(st.sampled_from(pairs))[0], draw(_text)))
    return "".join(f"{k}\x01{v}\x02" for k, v in pairs).encode()


_message = st.tuples(_body, _properties(), st.integers(0, 2**41), st.integers(0, 16))


@settings(max_examples=150, deadline=None)
@given(topic=_text.filter(bool), host=_text, messages=st.lists(_message, min_size=1, max_size=25))
def test_bulk_decoding_equals_decoding_each_record(topic, host, messages):
    data = stored(topic, host, messages)
    assert in_bulk(data, len(messages), topic, "broker-b") == one_by_one(data, topic, "broker-b")


@pytest.mark.parametrize("length", [0, 1, 11, 12, 13, 4096])
def test_a_body_at_the_very_end_of_the_buffer(length):
    """The last record's body ends the buffer: short bodies are copied into the views, which read up
    to 12 bytes from where a body starts, never past the buffer's end."""
    messages = [(b"a" * 20, b"", 1, 0), (b"\xff" * length, b"", 2, 0)]
    data = stored("T", "", messages)
    assert [r["body"] for r in in_bulk(data, 2, "T", "b")] == [b"a" * 20, b"\xff" * length]


def test_no_properties_anywhere_gives_null_columns_and_empty_maps():
    data = stored("T", "h", [(b"x", b"", 5, 0)] * 3)
    rows = in_bulk(data, 3, "T", "b")
    assert all(r["msg_id"] is None and r["tags"] is None and r["keys"] is None and r["properties"] == {}
               for r in rows)


def test_a_section_that_is_not_pairs_is_refused():
    """The broker stores only well-formed sections (records.check_batch); bytes that are not are an
    error, not a guess."""
    data = stored("T", "", [(b"x", b"a\x01b\x01c\x02", 5, 0)])
    with pytest.raises(records.RecordError):
        records_to_batch(data, 1, topic="T", broker="b")


def test_a_count_that_does_not_fit_the_bytes_is_refused():
    data = stored("T", "", [(b"x", b"", 5, 0)] * 2)
    with pytest.raises(records.RecordError):
        records_to_batch(data + data[:100], 2, topic="T", broker="b")
