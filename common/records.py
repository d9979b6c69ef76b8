"""The record: one message in the store's byte layout, as producers write it and consumers read it.

A message is encoded once, by the producer, in the layout the broker's commit
log stores; the broker checks and stamps it in place (queue id, queue offset,
physical offset, store time, CRC) and serves those same bytes to consumers,
which decode them lazily. Pure functions over bytes: no I/O, no grpc.

All integers are big-endian, as RocketMQ writes them. Offsets in bytes:

     0 total size   int32   whole record, this field included
     4 magic        int32   MESSAGE_MAGIC
     8 crc          uint32  zlib.crc32 of every byte from offset 12 to the end (broker)
    12 queue id     int32   (broker)
    16 flag         int32
    20 queue offset int64   (broker)
    28 phys offset  int64   the record's own commit-log offset (broker)
    36 sys flag     int32
    40 born ts      int64   ms
    48 store ts     int64   ms (broker)
    56 reconsume    int32
    60 tags code    int64   tag_hash(TAGS property); 0 without a tag
    68 born host    uint16 length + UTF-8
       topic        uint16 length + UTF-8
       properties   uint32 length + "k\\x01v\\x02" pairs (RocketMQ's messageProperties2String)
       body         uint32 length + bytes

Fields marked "(broker)" are zero in what a producer sends; the broker fills
them in. A record batch is records back to back, nothing between them.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from tidemark.common.crc import crc32
from tidemark.common.protocol import PropertyKey

# RocketMQ's MESSAGE_MAGIC_CODE, so a hex dump looks familiar.
MESSAGE_MAGIC = -626843481

HEADER = struct.Struct(">iiIiiqqiqqiq")
HEADER_SIZE = HEADER.size  # 68
PREFIX = struct.Struct(">ii")  # total size, magic
CRC_OFFSET = 8
QUEUE_ID_OFFSET = 12
QUEUE_OFFSET_OFFSET = 20
PHYS_OFFSET_OFFSET = 28
BORN_TS_OFFSET = 40
STORE_TS_OFFSET = 48
TAGS_OFFSET = 60
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
CRC_FIELD = struct.Struct(">I")
MIN_RECORD_SIZE = HEADER_SIZE + 2 + 2 + 4 + 4  # every variable field empty
MAX_SHORT_STRING = 0xFFFF

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
# A well-formed property section: "key\x01value\x02" pairs, keys non-empty.
_PROPERTIES_RE = re.compile(rb"(?:[^\x01\x02]+\x01[^\x01\x02]*\x02)*")
_TAGS_PREFIX = (PropertyKey.TAGS + NAME_VALUE_SEPARATOR).encode()
_UNIQ_PREFIX = (PropertyKey.UNIQ_KEY + NAME_VALUE_SEPARATOR).encode()


class RecordError(ValueError):
    """Bytes that are not a well-formed record (or batch of records)."""


# -- properties ------------------------------------------------------------------------------


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """RocketMQ's messageProperties2String: "k\\x01v\\x02" per pair, UTF-8.

    Raises RecordError for a non-string or empty key, a non-string value, or a
    separator character inside a key or value (decoding would be ambiguous).
    """
    if not properties:
        return b""
    parts = []
    for key, value in properties.items():
        if type(key) is not str or type(value) is not str or not key:
            raise RecordError(f"message property {key!r}={value!r}: keys and values must be strings, keys "
                              f"non-empty")
        parts.append(f"{key}\x01{value}\x02")
    text = "".join(parts)
    # A separator inside a key or value makes the pairs ambiguous; counting both over the joined
    # text checks every key and value in C.
    n = len(parts)
    if text.count(NAME_VALUE_SEPARATOR) != n or text.count(PROPERTY_SEPARATOR) != n:
        raise RecordError("message property keys and values must not contain the characters \\x01 or \\x02")
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


class RawProperties:
    """A record's encoded properties, read on demand: `get(key)` finds one property without decoding the
    others (an SQL92 filter names a few properties of every record it examines). As decode_properties, a key
    given twice has its last value."""

    __slots__ = ("_data",)
    _patterns: dict[str, tuple[bytes, bytes]] = {}

    def __init__(self, data: bytes) -> None:
        self._data = data

    def get(self, key: str, default: str | None = None) -> str | None:
        patterns = RawProperties._patterns.get(key)
        if patterns is None:
            if len(RawProperties._patterns) > 4096:
                RawProperties._patterns.clear()
            k = key.encode("utf-8")
            patterns = RawProperties._patterns[key] = (b"\x02" + k + b"\x01", k + b"\x01")
        data = self._data
        at = data.rfind(patterns[0])
        if at >= 0:
            start = at + len(patterns[0])
        elif data.startswith(patterns[1]):
            start = len(patterns[1])
        else:
            return default
        end = data.find(b"\x02", start)
        return str(data[start:end if end >= 0 else len(data)], "utf-8", "replace")

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None


def property_value(data: bytes | memoryview, prefix: bytes) -> bytes | None:
    """The raw value of one property (prefix is b"KEY\\x01"), without decoding the rest."""
    data = bytes(data)
    if data.startswith(prefix):
        start = len(prefix)
    else:
        at = data.find(b"\x02" + prefix)
        if at < 0:
            return None
        start = at + 1 + len(prefix)
    return data[start:data.index(b"\x02", start)]


def first_msg_id(data: bytes | bytearray | memoryview) -> str:
    """The message id (UNIQ_KEY) of a batch's first record, read without checking the batch; "" when it
    cannot be read (check_batch then says what is wrong)."""
    try:
        _, _, _, _, props_at, props_len, _, _ = variable_fields(data, 0)
        value = property_value(memoryview(data)[props_at:props_at + props_len], _UNIQ_PREFIX)
        return value.decode("utf-8") if value else ""
    except (struct.error, ValueError):
        return ""


def short_string(kind: str, text: str) -> bytes:
    """A uint16-length-prefixed UTF-8 field (born host, topic)."""
    if type(text) is not str:
        raise RecordError(f"{kind} must be a string, got {type(text).__name__}")
    data = text.encode("utf-8")
    if len(data) > MAX_SHORT_STRING:
        raise RecordError(f"{kind} is {len(data)} bytes in UTF-8; at most {MAX_SHORT_STRING} allowed")
    return U16.pack(len(data)) + data


# -- producer side ---------------------------------------------------------------------------


class RecordBatchBuilder:
    """Records of one topic appended back to back, as a producer sends them.

    `append` encodes a message once, here, in the store's layout; the broker
    only checks and stamps the bytes.
    """

    __slots__ = ("topic", "_topic_part", "_host_part", "buffer", "count", "_pack")

    def __init__(self, topic: str, born_host: str = "") -> None:
        self.topic = topic
        self._topic_part = short_string("topic", topic)
        self._host_part = short_string("born host", born_host)
        self.buffer = bytearray()
        self.count = 0
        self._pack = HEADER.pack

    def __len__(self) -> int:
        return len(self.buffer)

    def append(self, body: bytes, properties: bytes, *, tags_code: int = 0, flag: int = 0,
               born_timestamp: int = 0, sys_flag: int = 0) -> int:
        """Encode one record; `properties` is encode_properties() output. Returns the record's size."""
        host, topic = self._host_part, self._topic_part
        total = HEADER_SIZE + len(host) + len(topic) + 8 + len(properties) + len(body)
        buf = self.buffer
        buf += self._pack(total, MESSAGE_MAGIC, 0, 0, flag, 0, 0, sys_flag, born_timestamp, 0, 0, tags_code)
        buf += host
        buf += topic
        buf += U32.pack(len(properties))
        buf += properties
        buf += U32.pack(len(body))
        buf += body
        self.count += 1
        return total


# -- broker side -----------------------------------------------------------------------------


class CheckedBatch(NamedTuple):
    """A producer's batch that passed `check_batch`: where each record starts and how big it is. (A named
    tuple: the broker makes one for every batch it stores, a frozen dataclass costs 0.3 us more.)"""

    starts: list[int]
    sizes: list[int]
    tags_codes: list[int]
    msg_ids: list[str]
    properties: Sequence[bytes] = ()  # each record's property section (the broker's rules read keys in it)


def check_batch(data: bytes | bytearray | memoryview, count: int, *, topic: str, max_message_size: int,
                max_record_size: int) -> CheckedBatch:
    """Check a producer's record batch before anything of it is stored.

    Every record must have the magic, sizes that add up field by field and to
    the batch's length, the request's topic, a well-formed UTF-8 property
    section carrying UNIQ_KEY, a tags code that is the hash of its TAGS
    property, body + properties within max_message_size and a whole record
    within max_record_size. Raises RecordError naming the record and the fault.
    """
    view = memoryview(data)
    end = len(view)
    if count < 1:
        raise RecordError(f"a record batch needs at least one record, count is {count}")
    topic_bytes = topic.encode("utf-8")
    starts: list[int] = []
    sizes: list[int] = []
    tags_codes: list[int] = []
    msg_ids: list[str] = []
    properties: list[bytes] = []
    unpack_header = HEADER.unpack_from
    u16, u32 = U16.unpack_from, U32.unpack_from
    pos = 0
    for index in range(count):
        if end - pos < MIN_RECORD_SIZE:
            raise RecordError(f"{_where(index)}: {end - pos} bytes left cannot hold a record "
                              f"(the batch is shorter than its count {count} says)")
        (total, magic, _crc, _qid, _flag, _qoff, _phys, _sys, born, _store, reconsume,
         tags_code) = unpack_header(view, pos)
        if magic != MESSAGE_MAGIC:
            raise RecordError(f"{_where(index)}: bad magic {magic:#x}")
        if not MIN_RECORD_SIZE <= total <= end - pos:
            raise RecordError(f"{_where(index)}: size {total} does not fit the {end - pos} bytes left")
        if total > max_record_size:
            raise RecordError(f"{_where(index)}: {total} bytes does not fit a commit-log segment (at most "
                              f"{max_record_size})")
        if born < 0 or reconsume < 0:
            raise RecordError(f"{_where(index)}: born timestamp {born} and reconsume times {reconsume} must be "
                              f">= 0")
        record_end = pos + total
        p = pos + HEADER_SIZE
        try:
            (n,) = u16(view, p)
            host = view[p + 2:p + 2 + n]
            p += 2 + n
            (n,) = u16(view, p)
            if view[p + 2:p + 2 + n] != topic_bytes:
                raise RecordError(f"{_where(index)}: topic {bytes(view[p + 2:p + 2 + n])!r} is not the request's "
                                  f"topic {topic!r}")
            p += 2 + n
            (n_props,) = u32(view, p)
            props = view[p + 4:p + 4 + n_props]
            p += 4 + n_props
            (n_body,) = u32(view, p)
            p += 4 + n_body
        except struct.error:
            raise RecordError(f"{_where(index)}: a field runs past the record's end") from None
        if p != record_end:
            raise RecordError(f"{_where(index)}: fields end at {p - pos}, record size is {total}")
        if n_props + n_body > max_message_size:
            raise RecordError(f"{_where(index)}: {n_props + n_body} bytes (body + properties) exceeds "
                              f"max_message_size {max_message_size}")
        props_bytes = bytes(props)
        try:
            str(host, "utf-8")
            props_bytes.decode("utf-8")
        except UnicodeDecodeError:
            raise RecordError(f"{_where(index)}: born host or properties are not valid UTF-8") from None
        if _PROPERTIES_RE.fullmatch(props_bytes) is None:
            raise RecordError(f"{_where(index)}: properties are not 'key\\x01value\\x02' pairs with non-empty "
                              f"keys")
        msg_id = property_value(props_bytes, _UNIQ_PREFIX)
        if not msg_id:
            raise RecordError(f"{_where(index)}: the {PropertyKey.UNIQ_KEY} property (the message id) is missing")
        tag = property_value(props_bytes, _TAGS_PREFIX)
        expected = zlib.crc32(tag) if tag else 0  # tag_hash of the tag (its UTF-8 checked above)
        if tags_code != expected:
            raise RecordError(f"{_where(index)}: tags code {tags_code} is not the hash {expected} of its tag")
        starts.append(pos)
        sizes.append(total)
        tags_codes.append(tags_code)
        msg_ids.append(msg_id.decode("utf-8"))
        properties.append(props_bytes)
        pos = record_end
    if pos != end:
        raise RecordError(f"the batch holds {end - pos} bytes after its {count} records")
    return CheckedBatch(starts, sizes, tags_codes, msg_ids, properties)


def _where(index: int) -> str:
    return f"record {index} of the batch"


def seal(buf: bytearray, view: memoryview, start: int, size: int, physical_offset: int) -> None:
    """Write the record's physical offset and then its CRC, in place."""
    I64.pack_into(buf, start + PHYS_OFFSET_OFFSET, physical_offset)
    CRC_FIELD.pack_into(buf, start + CRC_OFFSET, crc32(view[start + 12:start + size]))


def crc_ok(buf: bytes | memoryview, start: int, size: int) -> bool:
    (stored,) = CRC_FIELD.unpack_from(buf, start + CRC_OFFSET)
    return crc32(memoryview(buf)[start + 12:start + size]) == stored


# -- consumer side ---------------------------------------------------------------------------


def record_spans(data: bytes | memoryview, count: int | None = None) -> list[tuple[int, int]]:
    """(start, size) of each record of a batch, by walking the size fields (no decoding)."""
    spans = []
    pos, end = 0, len(data)
    unpack = I32.unpack_from
    while pos < end and (count is None or len(spans) < count):
        if end - pos < MIN_RECORD_SIZE:
            raise RecordError(f"{end - pos} bytes at {pos} cannot hold a record")
        (total,) = unpack(data, pos)
        if not MIN_RECORD_SIZE <= total <= end - pos:
            raise RecordError(f"record at {pos} claims {total} bytes, {end - pos} are left")
        spans.append((pos, total))
        pos += total
    return spans


def variable_fields(buf: bytes | memoryview, start: int) -> tuple[int, int, int, int, int, int, int, int]:
    """(host at, host len, topic at, topic len, props at, props len, body at, body len) of a record."""
    p = start + HEADER_SIZE
    (nh,) = U16.unpack_from(buf, p)
    host_at = p + 2
    p = host_at + nh
    (nt,) = U16.unpack_from(buf, p)
    topic_at = p + 2
    p = topic_at + nt
    (npr,) = U32.unpack_from(buf, p)
    props_at = p + 4
    p = props_at + npr
    (nb,) = U32.unpack_from(buf, p)
    return host_at, nh, topic_at, nt, props_at, npr, p + 4, nb
