"""The commit-log record codec and the consume-queue entry layout, without any file."""

from __future__ import annotations

import struct

import pytest

from tidemark.broker.errors import InvalidArgumentError
from tidemark.broker.store import MessageRecord, codec


def _roundtrip(record: MessageRecord, **kwargs):
    data = codec.encode_record(
        record,
        queue_offset=41,
        physical_offset=123_456,
        store_timestamp=1_700_000_000_123,
        **kwargs,
    )
    return data, codec.decode_record(data)


@pytest.mark.parametrize(
    "record",
    [
        MessageRecord(
            "Topic_A-1",
            3,
            b"hello",
            {"TAGS": "tagA", "KEYS": "k1 k2", "UNIQ_KEY": "ABC"},
            tags_code=99,
            flag=7,
            born_timestamp=1_699_999_999_000,
            born_host="10.0.0.1:5000",
            reconsume_times=2,
            sys_flag=4,
        ),
        MessageRecord("话题-тема-🌊", 0, b"", {"ключ": "值 🌊", "k": ""}),
        MessageRecord("T", 2**31 - 1, bytes(range(256)) * 4096, {}, tags_code=-(2**63), flag=-1),
    ],
    ids=["all-fields", "unicode-empty-body", "large-body"],
)
def test_record_round_trip(record):
    data, message = _roundtrip(record, max_message_size=2**30)

    assert len(data) == message.store_size
    assert (message.topic, message.queue_id, message.body) == (
        record.topic,
        record.queue_id,
        bytes(record.body),
    )
    assert message.properties == dict(record.properties)
    assert (message.queue_offset, message.commit_log_offset, message.store_timestamp) == (
        41,
        123_456,
        1_700_000_000_123,
    )
    assert (message.tags_code, message.flag, message.born_timestamp) == (
        record.tags_code,
        record.flag,
        record.born_timestamp,
    )
    assert (message.born_host, message.reconsume_times, message.sys_flag) == (
        record.born_host,
        record.reconsume_times,
        record.sys_flag,
    )
    assert codec.crc_ok(data, 0, len(data))


def test_convenience_properties():
    _, message = _roundtrip(
        MessageRecord("T", 0, b"x", {"TAGS": "a", "KEYS": "k1 k2", "UNIQ_KEY": "id-1"})
    )
    assert (message.tags, message.keys, message.msg_id) == ("a", "k1 k2", "id-1")
    _, bare = _roundtrip(MessageRecord("T", 0, b"x"))
    assert (bare.tags, bare.keys, bare.msg_id) == ("", "", "")


def test_header_layout_is_the_documented_one():
    data, _ = _roundtrip(MessageRecord("T", 5, b"body", tags_code=77))
    total, magic, _crc, queue_id, _flag, queue_offset, phys = struct.unpack_from(">iiIiiqq", data)
    assert (total, magic, queue_id, queue_offset, phys) == (
        len(data),
        codec.MESSAGE_MAGIC,
        5,
        41,
        123_456,
    )
    assert struct.unpack_from(">q", data, 60)[0] == 77
    assert struct.unpack_from(">q", data, codec.STORE_TS_OFFSET)[0] == 1_700_000_000_123
    assert data.endswith(struct.pack(">I", 4) + b"body")


@pytest.mark.parametrize("position", [12, 30, 50, 61, 70, -1], ids=lambda p: f"byte{p}")
def test_crc_detects_a_flipped_byte(position):
    data, _ = _roundtrip(MessageRecord("T", 1, b"payload", {"TAGS": "x"}))
    damaged = bytearray(data)
    damaged[position] ^= 0x01
    assert codec.crc_ok(data, 0, len(data))
    assert not codec.crc_ok(damaged, 0, len(damaged))


def test_crc_checked_inside_a_larger_buffer():
    first, _ = _roundtrip(MessageRecord("T", 0, b"one"))
    second, _ = _roundtrip(MessageRecord("T", 0, b"two"))
    buf = bytearray(first + second)
    assert codec.crc_ok(buf, len(first), len(second))
    buf[-1] ^= 0xFF
    assert codec.crc_ok(buf, 0, len(first))
    assert not codec.crc_ok(buf, len(first), len(second))


@pytest.mark.parametrize(
    "properties",
    [{"a\x01b": "v"}, {"k": "v\x02"}, {"k": "\x01"}, {"k\x02": ""}],
)
def test_properties_with_separators_are_rejected(properties):
    with pytest.raises(InvalidArgumentError, match="must not contain"):
        codec.encode_properties(properties)


def test_non_string_properties_are_rejected():
    with pytest.raises(InvalidArgumentError, match="strings"):
        codec.encode_properties({"k": 1})


def test_properties_round_trip_in_rocketmq_format():
    encoded = codec.encode_properties({"TAGS": "a", "KEYS": "k1 k2"})
    assert encoded == b"TAGS\x01a\x02KEYS\x01k1 k2\x02"
    assert codec.decode_properties(encoded) == {"TAGS": "a", "KEYS": "k1 k2"}
    assert codec.decode_properties(b"") == {}


def test_batch_rejects_oversize_and_out_of_range_fields():
    ok = MessageRecord("T", 0, b"x" * 10, {"TAGS": "ab"})
    encode = dict(first_queue_offset=0, store_timestamp=0, max_record_size=10_000)
    codec.encode_batch([ok], max_message_size=10 + len("TAGS\x01ab\x02"), **encode)
    with pytest.raises(InvalidArgumentError, match="max_message_size"):
        codec.encode_batch([ok], max_message_size=10 + len("TAGS\x01ab\x02") - 1, **encode)
    with pytest.raises(InvalidArgumentError, match="segment"):
        codec.encode_batch([MessageRecord("T", 0, b"x" * 10_000)], max_message_size=2**20, **encode)
    with pytest.raises(InvalidArgumentError, match="out of range"):
        codec.encode_batch([MessageRecord("T", 0, b"", flag=2**31)], max_message_size=100, **encode)
    with pytest.raises(InvalidArgumentError, match="bytes"):
        codec.encode_batch([MessageRecord("T", 0, "text")], max_message_size=100, **encode)


def test_batch_encodes_consecutive_queue_offsets_and_seals_in_place():
    records = [
        MessageRecord("T", 0, b"a"),
        MessageRecord("T", 0, b"bb"),
        MessageRecord("T", 0, b"ccc"),
    ]
    batch = codec.encode_batch(
        records,
        first_queue_offset=10,
        store_timestamp=5,
        max_message_size=100,
        max_record_size=1000,
    )
    view = memoryview(batch.buffer)
    start = 0
    for size in batch.sizes:
        codec.seal(batch.buffer, view, start, size, 1000 + start)
        start += size
    start = 0
    for i, size in enumerate(batch.sizes):
        message = codec.decode_record(bytes(batch.buffer), start)
        assert (message.queue_offset, message.commit_log_offset, message.body) == (
            10 + i,
            1000 + start,
            records[i].body,
        )
        assert codec.crc_ok(batch.buffer, start, size)
        start += size


def test_decode_rejects_what_is_not_a_record():
    data, _ = _roundtrip(MessageRecord("T", 0, b"body"))
    with pytest.raises(codec.CorruptRecordError):
        codec.decode_record(data[:-1])
    with pytest.raises(codec.CorruptRecordError):
        codec.decode_record(codec.encode_blank(100) + bytes(100))
    with pytest.raises(codec.CorruptRecordError):
        codec.decode_record(data, 1)


def test_consume_queue_entry_is_20_big_endian_bytes():
    entry = codec.CQ_ENTRY.pack(0x0102030405060708, 0x0A0B0C0D, -2)
    assert len(entry) == codec.CQ_ENTRY_SIZE == 20
    assert entry[:12] == bytes.fromhex("0102030405060708 0A0B0C0D")
    assert codec.CQ_ENTRY.unpack(entry) == (0x0102030405060708, 0x0A0B0C0D, -2)
