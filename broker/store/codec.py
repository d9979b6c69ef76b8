"""Byte layouts of the store: commit-log records, the end-of-segment marker, consume-queue entries.

Pure functions over bytes, no I/O. The record layout itself is `tidemark.common.records`
(producers encode it, consumers decode it); this module adds what only the
store needs: encoding a batch of MessageRecords (the broker's own puts: delayed,
retry and DLQ messages), full decoding into StoredMessage, the end-of-segment
marker and consume-queue entries.

End-of-segment marker: total size int32 (bytes from the marker to the segment's logical
end) + BLANK_MAGIC. The rest of the segment is zero padding.

Consume-queue entry (20 bytes): commit-log offset int64, size int32, tags code int64.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from tidemark.broker.errors import InvalidArgumentError
from tidemark.broker.store.model import MessageRecord, StoredMessage
from tidemark.common import records
from tidemark.common.records import (
    CRC_FIELD,
    CRC_OFFSET,
    HEADER,
    HEADER_SIZE,
    MESSAGE_MAGIC,
    MIN_RECORD_SIZE,
    PREFIX,
    crc_ok,
    decode_properties,
    seal,
)

# RocketMQ's BLANK_MAGIC_CODE, so a hex dump looks familiar.
BLANK_MAGIC = -875286124

BLANK_SIZE = PREFIX.size
PHYS_OFFSET_FIELD = records.PHYS_OFFSET_OFFSET
PHYS_FIELD = records.I64
STORE_TS_OFFSET = records.STORE_TS_OFFSET
STORE_TS_FIELD = records.I64
# The fields a recovery scan needs, read without decoding the whole record.
SCAN_FIELDS = struct.Struct(">iiIiiqq")  # size, magic, crc, queue id, flag, queue offset, phys
TAGS_FIELD = records.I64
TAGS_OFFSET = records.TAGS_OFFSET

_U16 = records.U16
_U32 = records.U32
_MAX_U16 = records.MAX_SHORT_STRING

CQ_ENTRY = struct.Struct(">qiq")
CQ_ENTRY_SIZE = CQ_ENTRY.size  # 20
CQ_DTYPE = np.dtype([("phys", ">i8"), ("size", ">i4"), ("tags", ">i8")])  # CQ_ENTRY as a numpy record
assert CQ_DTYPE.itemsize == CQ_ENTRY_SIZE

__all__ = ["BLANK_MAGIC", "CQ_DTYPE", "CQ_ENTRY", "CQ_ENTRY_SIZE", "CRC_FIELD", "CRC_OFFSET", "HEADER", "HEADER_SIZE",
           "MESSAGE_MAGIC", "MIN_RECORD_SIZE", "PREFIX", "CorruptRecordError", "EncodedBatch", "crc_ok",
           "decode_properties", "decode_record", "encode_batch", "encode_blank", "encode_properties",
           "encode_record", "queue_entries", "scan_topic", "seal"]


class CorruptRecordError(ValueError):
    """Bytes at a position are not a well-formed record."""


class EncodedBatch(NamedTuple):
    """Records encoded back to back, still missing their physical offset and CRC.

    The commit log decides where each record lands (a record never spans
    segments) and then seals each one in place. A producer's batch checked in
    bulk (batches.py) comes with numpy arrays of its records' sizes and starts,
    and is sealed in bulk when it fits its segment.
    """

    buffer: bytearray
    sizes: Sequence[int]
    starts: np.ndarray | None = None


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """RocketMQ's messageProperties2String; InvalidArgumentError for a bad key or value."""
    try:
        return records.encode_properties(properties)
    except records.RecordError as exc:
        raise InvalidArgumentError(str(exc)) from None


def _short_string(kind: str, text: str) -> bytes:
    if type(text) is not str:
        raise InvalidArgumentError(f"{kind} must be a string, got {type(text).__name__}")
    data = text.encode("utf-8")
    if len(data) > _MAX_U16:
        raise InvalidArgumentError(
            f"{kind} is {len(data)} bytes in UTF-8; at most {_MAX_U16} allowed"
        )
    return _U16.pack(len(data)) + data


def encode_batch(
    records: Sequence[MessageRecord],
    *,
    first_queue_offset: int,
    store_timestamp: int,
    max_message_size: int,
    max_record_size: int,
) -> EncodedBatch:
    """Encode records with consecutive queue offsets into one buffer.

    Raises InvalidArgumentError before anything is written when a record is
    oversize (body + properties > max_message_size, or the whole record does
    not fit a segment), has a bad property or a field out of its integer range.
    """
    buf = bytearray()
    sizes = []
    pack = HEADER.pack
    queue_offset = first_queue_offset
    last_topic = last_host = None
    topic_part = host_part = b""
    for record in records:
        body = record.body
        if not isinstance(body, bytes | bytearray):
            raise InvalidArgumentError(f"message body must be bytes, got {type(body).__name__}")
        props = encode_properties(record.properties)
        if len(body) + len(props) > max_message_size:
            raise InvalidArgumentError(
                f"message of {len(body) + len(props)} bytes (body + properties) exceeds "
                f"max_message_size {max_message_size}"
            )
        # A batch usually shares topic and host: encode them once.
        if record.topic != last_topic:
            topic_part, last_topic = _short_string("topic", record.topic), record.topic
        if record.born_host != last_host:
            host_part, last_host = _short_string("born_host", record.born_host), record.born_host
        total = HEADER_SIZE + len(host_part) + len(topic_part) + 8 + len(props) + len(body)
        if total > max_record_size:
            raise InvalidArgumentError(
                f"encoded message of {total} bytes does not fit a commit-log segment "
                f"(at most {max_record_size})"
            )
        try:
            buf += pack(
                total,
                MESSAGE_MAGIC,
                0,
                record.queue_id,
                record.flag,
                queue_offset,
                0,
                record.sys_flag,
                record.born_timestamp,
                store_timestamp,
                record.reconsume_times,
                record.tags_code,
            )
        except struct.error as exc:
            raise InvalidArgumentError(f"message field out of range: {exc}") from None
        buf += host_part
        buf += topic_part
        buf += _U32.pack(len(props))
        buf += props
        buf += _U32.pack(len(body))
        buf += body
        sizes.append(total)
        queue_offset += 1
    return EncodedBatch(buf, sizes)


def encode_record(
    record: MessageRecord,
    *,
    queue_offset: int,
    physical_offset: int,
    store_timestamp: int,
    max_message_size: int = 2**31 - 1,
) -> bytes:
    """One sealed record; for tests and tools (the store encodes whole batches)."""
    batch = encode_batch(
        [record],
        first_queue_offset=queue_offset,
        store_timestamp=store_timestamp,
        max_message_size=max_message_size,
        max_record_size=2**31 - 1,
    )
    seal(batch.buffer, memoryview(batch.buffer), 0, batch.sizes[0], physical_offset)
    return bytes(batch.buffer)


def queue_entries(positions: Sequence[int], sizes: Sequence[int], tags_codes: Sequence[int]) -> bytes:
    """The consume-queue entries of records stored at these commit-log offsets: entry by entry (lists), or
    built whole for a batch sealed in bulk (numpy arrays)."""
    if type(positions) is list:
        pack = CQ_ENTRY.pack
        return b"".join([pack(p, s, t) for p, s, t in zip(positions, sizes, tags_codes, strict=True)])
    entries = np.empty(len(positions), dtype=CQ_DTYPE)
    entries["phys"], entries["size"], entries["tags"] = positions, sizes, tags_codes
    return entries.tobytes()


def encode_blank(size: int) -> bytes:
    return PREFIX.pack(size, BLANK_MAGIC)


def decode_record(buf: bytes | memoryview, start: int = 0) -> StoredMessage:
    """Decode the record at `start`; raise CorruptRecordError when it is not well-formed.

    Does not check the CRC (recovery does; reads trust what recovery accepted).
    """
    if len(buf) - start < MIN_RECORD_SIZE:
        raise CorruptRecordError(f"{len(buf) - start} bytes cannot hold a record")
    (
        total,
        magic,
        _crc,
        queue_id,
        flag,
        queue_offset,
        phys,
        sys_flag,
        born_ts,
        store_ts,
        reconsume,
        tags_code,
    ) = HEADER.unpack_from(buf, start)
    if magic != MESSAGE_MAGIC:
        raise CorruptRecordError(f"bad magic {magic:#x}")
    end = start + total
    if total < MIN_RECORD_SIZE or end > len(buf):
        raise CorruptRecordError(
            f"record size {total} does not fit the {len(buf) - start} bytes read"
        )
    try:
        p = start + HEADER_SIZE
        (n,) = _U16.unpack_from(buf, p)
        host = str(buf[p + 2 : p + 2 + n], "utf-8")
        p += 2 + n
        (n,) = _U16.unpack_from(buf, p)
        topic = str(buf[p + 2 : p + 2 + n], "utf-8")
        p += 2 + n
        (n,) = _U32.unpack_from(buf, p)
        properties = decode_properties(buf[p + 4 : p + 4 + n])
        p += 4 + n
        (n,) = _U32.unpack_from(buf, p)
        p += 4
        body = bytes(buf[p : p + n])
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"bad variable field: {exc}") from None
    if p + n != end:
        raise CorruptRecordError(f"fields end at {p + n - start}, record size is {total}")
    return StoredMessage(
        topic,
        queue_id,
        queue_offset,
        phys,
        total,
        body,
        properties,
        flag,
        born_ts,
        store_ts,
        host,
        reconsume,
        tags_code,
        sys_flag,
    )


def scan_topic(buf: bytes | memoryview, start: int) -> str:
    """The topic of the record at `start`, without decoding the rest (recovery's hot path)."""
    p = start + HEADER_SIZE
    (n,) = _U16.unpack_from(buf, p)
    p += 2 + n
    (n,) = _U16.unpack_from(buf, p)
    return str(buf[p + 2 : p + 2 + n], "utf-8")
