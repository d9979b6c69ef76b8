"""Byte layouts of the store: commit-log records, the end-of-segment marker, consume-queue entries.

Pure functions over bytes, no I/O. All integers are big-endian, as RocketMQ writes them.

Commit-log record (offsets in bytes):

     0 total size   int32   whole record, this field included
     4 magic        int32   MESSAGE_MAGIC
     8 crc          uint32  zlib.crc32 of every byte from offset 12 to the end
    12 queue id     int32
    16 flag         int32
    20 queue offset int64
    28 phys offset  int64   the record's own commit-log offset (proves "this is a record start")
    36 sys flag     int32
    40 born ts      int64   ms
    48 store ts     int64   ms
    56 reconsume    int32
    60 tags code    int64
    68 born host    uint16 length + UTF-8
       topic        uint16 length + UTF-8
       properties   uint32 length + "k\\x01v\\x02" pairs (RocketMQ's messageProperties2String)
       body         uint32 length + bytes

End-of-segment marker: total size int32 (bytes from the marker to the segment's logical
end) + BLANK_MAGIC. The rest of the segment is zero padding.

Consume-queue entry (20 bytes): commit-log offset int64, size int32, tags code int64.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from broker.errors import InvalidArgumentError
from broker.store.model import MessageRecord, StoredMessage

# RocketMQ's MESSAGE_MAGIC_CODE and BLANK_MAGIC_CODE, so a hex dump looks familiar.
MESSAGE_MAGIC = -626843481
BLANK_MAGIC = -875286124

HEADER = struct.Struct(">iiIiiqqiqqiq")
HEADER_SIZE = HEADER.size  # 68
PREFIX = struct.Struct(">ii")  # total size, magic: enough to classify what starts at a position
BLANK_SIZE = PREFIX.size
CRC_OFFSET = 8
CRC_FIELD = struct.Struct(">I")
PHYS_OFFSET_FIELD = 28
PHYS_FIELD = struct.Struct(">q")
STORE_TS_OFFSET = 48
STORE_TS_FIELD = struct.Struct(">q")
# The fields a recovery scan needs, read without decoding the whole record.
SCAN_FIELDS = struct.Struct(">iiIiiqq")  # size, magic, crc, queue id, flag, queue offset, phys
TAGS_FIELD = struct.Struct(">q")
TAGS_OFFSET = 60

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
MIN_RECORD_SIZE = HEADER_SIZE + 2 + 2 + 4 + 4  # every variable field empty
_MAX_U16 = 0xFFFF

CQ_ENTRY = struct.Struct(">qiq")
CQ_ENTRY_SIZE = CQ_ENTRY.size  # 20

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"


class CorruptRecordError(ValueError):
    """Bytes at a position are not a well-formed record."""


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """Records encoded back to back, still missing their physical offset and CRC.

    The commit log decides where each record lands (a record never spans
    segments) and then calls `seal` on each one in place.
    """

    buffer: bytearray
    sizes: list[int]


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """RocketMQ's messageProperties2String: "k\\x01v\\x02" per pair, UTF-8."""
    if not properties:
        return b""
    parts = []
    for key, value in properties.items():
        if type(key) is not str or type(value) is not str:
            raise InvalidArgumentError(
                f"message property {key!r}={value!r}: keys and values must be strings"
            )
        parts.append(f"{key}\x01{value}\x02")
    text = "".join(parts)
    # A separator inside a key or value would make the pairs ambiguous on decode;
    # counting both over the joined text checks every key and value in C.
    n = len(parts)
    if text.count(NAME_VALUE_SEPARATOR) != n or text.count(PROPERTY_SEPARATOR) != n:
        raise InvalidArgumentError(
            "message property keys and values must not contain the characters \\x01 or \\x02"
        )
    return text.encode("utf-8")


def decode_properties(data: bytes | memoryview) -> dict[str, str]:
    if not data:
        return {}
    result = {}
    for item in str(data, "utf-8").split(PROPERTY_SEPARATOR):
        if item:
            key, _, value = item.partition(NAME_VALUE_SEPARATOR)
            result[key] = value
    return result


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


def seal(buf: bytearray, view: memoryview, start: int, size: int, physical_offset: int) -> None:
    """Write the record's physical offset and then its CRC, in place."""
    PHYS_FIELD.pack_into(buf, start + PHYS_OFFSET_FIELD, physical_offset)
    CRC_FIELD.pack_into(buf, start + CRC_OFFSET, zlib.crc32(view[start + 12 : start + size]))


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


def encode_blank(size: int) -> bytes:
    return PREFIX.pack(size, BLANK_MAGIC)


def crc_ok(buf: bytes | memoryview, start: int, size: int) -> bool:
    (stored,) = CRC_FIELD.unpack_from(buf, start + CRC_OFFSET)
    return zlib.crc32(memoryview(buf)[start + 12 : start + size]) == stored


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
