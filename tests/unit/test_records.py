"""The record layout producers write and the broker checks: builder, check_batch, lazy decoding."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.client.message import MessageExt
from tidemark.common import records
from tidemark.common.protocol import tag_hash
from tidemark.common.records import RecordBatchBuilder, RecordError, check_batch, encode_properties

LIMITS = dict(max_message_size=4096, max_record_size=8192)


def batch(n: int = 3, topic: str = "T", **kw) -> RecordBatchBuilder:
    b = RecordBatchBuilder(topic, "10.0.0.1")
    for i in range(n):
        tag = "paid" if i % 2 else ""
        props = {"UNIQ_KEY": f"ID{i}", **({"TAGS": tag} if tag else {}), "KEYS": f"k{i}", **kw}
        b.append(b"body-%d" % i, encode_properties(props), tags_code=tag_hash(tag), born_timestamp=1000 + i)
    return b


def test_a_well_formed_batch_is_accepted_with_each_record_located():
    b = batch(3)
    checked = check_batch(bytes(b.buffer), 3, topic="T", **LIMITS)
    assert checked.starts == [0, checked.sizes[0], checked.sizes[0] + checked.sizes[1]]
    assert sum(checked.sizes) == len(b.buffer)
    assert checked.msg_ids == ["ID0", "ID1", "ID2"]
    assert checked.tags_codes == [0, tag_hash("paid"), 0]


def _lie(data: bytearray, at: int, fmt: str, value: int) -> bytes:
    struct.pack_into(fmt, data, at, value)
    return bytes(data)


@pytest.mark.parametrize("damage, count, message", [
    (lambda d: bytes(d[:-5]), 3, "fields end|does not fit|left cannot hold"),          # torn tail
    (lambda d: bytes(d) + b"\0" * 30, 3, "bytes after its 3 records"),                   # trailing garbage
    (lambda d: bytes(d), 4, "shorter than its count"),                                  # lying count
    (lambda d: bytes(d), 0, "at least one record"),
    (lambda d: _lie(d, 0, ">i", 10_000), 3, "does not fit"),                             # size lies
    (lambda d: _lie(d, 4, ">i", 12345), 3, "bad magic"),
    (lambda d: _lie(d, records.TAGS_OFFSET, ">q", 99), 3, "tags code"),                  # tags code lies
    (lambda d: _lie(d, records.HEADER_SIZE, ">H", 200), 3, "topic|fields end|past the record"),
])
def test_lying_or_torn_batches_are_refused_whole(damage, count, message):
    data = damage(bytearray(batch(3).buffer))
    with pytest.raises(RecordError, match=message):
        check_batch(data, count, topic="T", **LIMITS)


def test_topic_properties_and_sizes_are_checked():
    with pytest.raises(RecordError, match="not the request's topic"):
        check_batch(bytes(batch(1, topic="Other").buffer), 1, topic="T", **LIMITS)
    b = RecordBatchBuilder("T")
    b.append(b"x", b"UNIQ_KEY\x01A\x02KEYS")  # a pair without its terminator
    with pytest.raises(RecordError, match="pairs"):
        check_batch(bytes(b.buffer), 1, topic="T", **LIMITS)
    b = RecordBatchBuilder("T")
    b.append(b"x", encode_properties({"KEYS": "k"}))
    with pytest.raises(RecordError, match="UNIQ_KEY"):
        check_batch(bytes(b.buffer), 1, topic="T", **LIMITS)
    b = RecordBatchBuilder("T")
    b.append(b"x", b"UNIQ_KEY\x01\xff\xfe\x02")
    with pytest.raises(RecordError, match="UTF-8"):
        check_batch(bytes(b.buffer), 1, topic="T", **LIMITS)
    b = RecordBatchBuilder("T")
    b.append(b"x" * 5000, encode_properties({"UNIQ_KEY": "A"}))
    with pytest.raises(RecordError, match="max_message_size"):
        check_batch(bytes(b.buffer), 1, topic="T", **LIMITS)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_corruption_is_refused_or_still_well_formed(data):
    """Flip, cut or extend a valid batch anywhere: check_batch raises RecordError (nothing else), or
    the batch it accepts still has records that tile it exactly."""
    raw = bytearray(batch(4).buffer)
    kind = data.draw(st.sampled_from(["flip", "cut", "extend"]))
    if kind == "flip":
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] ^= data.draw(st.integers(1, 255))
    elif kind == "cut":
        raw = raw[:data.draw(st.integers(0, len(raw) - 1))]
    else:
        raw += data.draw(st.binary(min_size=1, max_size=80))
    count = data.draw(st.integers(0, 6))
    try:
        checked = check_batch(bytes(raw), count, topic="T", **LIMITS)
    except RecordError:
        return
    assert sum(checked.sizes) == len(raw) and len(checked.sizes) == count
    for start, size in zip(checked.starts, checked.sizes, strict=True):
        assert struct.unpack_from(">i", raw, start)[0] == size


def test_messages_decode_lazily_from_records():
    b = batch(2, p="v")
    data = bytes(b.buffer)
    first = MessageExt.from_record(data, 0, topic="T", broker_name="broker-a")
    assert first._body is None  # nothing decoded yet
    assert first.queue_offset == 0 and first.born_timestamp == 1000 and first.topic == "T"
    assert first.body == b"body-0" and first.msg_id == "ID0" and first.keys == "k0" and first.tags == ""
    assert dict(first.properties) == {"p": "v"}  # tags, keys and the id have their own attributes
    second = MessageExt.from_record(data, first.store_size, topic="T", broker_name="broker-a")
    assert second.tags == "paid" and second.born_host == "10.0.0.1"
    assert second.replace(topic="U").topic == "U" and second.replace() == second


_KEYS = st.sampled_from(["a", "aa", "ba", "a\u00e9", "TAGS", "x y", "KEYS"])


@given(props=st.dictionaries(_KEYS, st.text(alphabet="ab\u00e9 =", max_size=4), max_size=5), key=_KEYS)
def test_raw_properties_find_what_decoding_finds(props, key):
    """RawProperties.get (an SQL92 filter's lookup in a record) agrees with decode_properties, keys that
    are prefixes or suffixes of others included; a key given twice has its last value."""
    data = encode_properties(props)
    assert records.RawProperties(data).get(key) == records.decode_properties(data).get(key)
    doubled = data + encode_properties({key: "last"})
    assert records.RawProperties(doubled).get(key) == records.decode_properties(doubled)[key] == "last"
    assert (key in records.RawProperties(data)) is (key in props)
