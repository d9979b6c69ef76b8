"""The source's schema, in Spark and in Arrow, and stored records -> Arrow record batches.

Spark checks a Python data source's record batches against
to_arrow_schema(schema, timezone="UTC"): timestamps are timestamp[us, tz=UTC]
(instants; Spark shows them in the session time zone) and maps are
map<string, string> with non-null keys. ARROW_SCHEMA spells that out; a unit
test holds it equal to what PySpark derives.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tidemark.common import records
from tidemark.common.protocol import PropertyKey

SCHEMA = StructType([
    StructField("topic", StringType()),
    StructField("broker", StringType()),
    StructField("queue_id", IntegerType()),
    StructField("queue_offset", LongType()),
    StructField("msg_id", StringType()),
    StructField("keys", StringType()),
    StructField("tags", StringType()),
    StructField("body", BinaryType()),
    StructField("properties", MapType(StringType(), StringType())),
    StructField("born_timestamp", TimestampType()),
    StructField("store_timestamp", TimestampType()),
    StructField("reconsume_times", IntegerType()),
])

_TS = pa.timestamp("us", tz="UTC")
ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("broker", pa.string()),
    ("queue_id", pa.int32()),
    ("queue_offset", pa.int64()),
    ("msg_id", pa.string()),
    ("keys", pa.string()),
    ("tags", pa.string()),
    ("body", pa.binary()),
    ("properties", pa.map_(pa.string(), pa.string())),
    ("born_timestamp", _TS),
    ("store_timestamp", _TS),
    ("reconsume_times", pa.int32()),
])


# -- stored records -> Arrow, in bulk ------------------------------------------------------------
#
# Every column is built with numpy over the whole buffer (one call per column, not per row): the
# fixed header fields are gathered as one structured array, variable fields (bodies, property
# sections) are described as views into the buffer and copied out by Arrow, and the property
# sections are split at their separator bytes. No Python object is made per row.

_SPECIAL = {PropertyKey.UNIQ_KEY: "msg_id", PropertyKey.KEYS: "keys", PropertyKey.TAGS: "tags"}
# The stored header (records.HEADER) and the born host's length after it, big-endian as stored.
_FIXED = np.dtype([("size", ">i4"), ("magic", ">i4"), ("crc", ">u4"), ("queue_id", ">i4"), ("flag", ">i4"),
                   ("queue_offset", ">i8"), ("phys_offset", ">i8"), ("sys_flag", ">i4"), ("born", ">i8"),
                   ("stored", ">i8"), ("reconsume", ">i4"), ("tags_code", ">i8"), ("host_len", ">u2")])
assert _FIXED.itemsize == records.HEADER_SIZE + 2 and _FIXED.fields["born"][1] == records.BORN_TS_OFFSET


def _windows(buf: np.ndarray, width: int) -> np.ndarray:
    """Every run of `width` bytes of buf, one row per start position (a view, nothing copied):
    windows[positions] gathers the runs at those positions in one call."""
    return np.lib.stride_tricks.as_strided(buf, shape=(max(len(buf) - width + 1, 0), width), strides=(1, 1))


def _at_every_byte(buf: np.ndarray, dtype: str | np.dtype) -> np.ndarray:
    """buf read as `dtype` starting at every byte (overlapping, unaligned; a view, nothing copied):
    [positions] gathers the values there in one call, about 3x faster than a gather of `_windows`
    rows. (Not for structured dtypes, which numpy gathers field by field.)"""
    dtype = np.dtype(dtype)
    return np.ndarray((max(len(buf) - dtype.itemsize + 1, 0),), dtype, buffer=buf, strides=(1,))


def _gather(buf: np.ndarray, pos: np.ndarray, dtype: str | np.dtype) -> np.ndarray:
    """The values of `dtype` (big-endian as stored) at each position."""
    return _at_every_byte(buf, dtype)[pos]


def _constant_strings(value: str, n: int) -> pa.Array:
    data = value.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int32) * len(data)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data * n))


# Arrow's binary_view layout: 16 bytes per value. Up to 12 bytes are stored in the view itself;
# a longer value is its length, its first 4 bytes, a buffer index and an offset into that buffer.
_VIEW = np.dtype([("length", "<i4"), ("prefix", "V4"), ("buffer", "<i4"), ("offset", "<i4")])
_INLINE = np.dtype([("length", "<i4"), ("data", "V12")])
_INLINE_MAX = 12
_HEAD = np.arange(_INLINE_MAX, dtype=np.int64)
# The 12 inline bytes as two little-endian words, and per length (0..12) the masks that keep its bytes.
_INLINE_WORDS = np.dtype([("length", "<i4"), ("low", "<u8"), ("high", "<u4")])
_LOW_MASK = np.array([(1 << (8 * min(k, 8))) - 1 for k in range(_INLINE_MAX + 1)], dtype=np.uint64)
_HIGH_MASK = np.array([(1 << (8 * max(k - 8, 0))) - 1 for k in range(_INLINE_MAX + 1)], dtype=np.uint32)
_VIEW_KIND = {pa.binary(): pa.binary_view(), pa.string(): pa.string_view()}


def _slices(kind: pa.DataType, data: pa.Buffer, buf: np.ndarray, at: np.ndarray, length: np.ndarray,
            valid: np.ndarray | None = None) -> pa.Array:
    """A binary/string column of the byte ranges [at, at + length) of `data` (buf: the same bytes in
    numpy); rows where `valid` is False are null.

    The ranges are not adjacent (record headers lie between them), so they are described as views
    into `data` (binary_view: one 16-byte struct per row, built with numpy) and Arrow's cast to the
    contiguous type copies the bytes out in C. `data` must be shorter than 2 GiB (view offsets are
    int32); the fetch loop bounds a batch's bytes."""
    n = len(at)
    views = np.zeros(n, _VIEW)
    views["length"] = length
    short = length <= _INLINE_MAX
    if not short.all():
        rows = np.flatnonzero(~short)
        views["offset"][rows] = at[rows]
        views["prefix"][rows] = _gather(buf, at[rows], "V4")
    if short.any() and len(buf):  # (an empty buffer has only empty values: their views are zeros)
        rows = np.flatnonzero(short)
        # Twelve bytes from each value's start, then the bytes past its length zeroed; the few values
        # within twelve bytes of the buffer's end are gathered byte by byte (clipped at the end).
        near_end = at[rows] > len(buf) - _INLINE_MAX
        inline = views.view(_INLINE)
        if near_end.any():
            tail = rows[near_end]
            head = buf[np.minimum(at[tail, None] + _HEAD, len(buf) - 1)]
            head[_HEAD >= length[tail, None]] = 0
            inline["data"][tail] = head.view("V12").reshape(-1)
            rows = rows[~near_end]
        inline["data"][rows] = _gather(buf, at[rows], "V12")
        words = views.view(_INLINE_WORDS)
        words["low"][rows] &= _LOW_MASK[length[rows]]
        words["high"][rows] &= _HIGH_MASK[length[rows]]
    nulls = None
    if valid is not None and not valid.all():
        nulls = pa.py_buffer(np.packbits(valid, bitorder="little"))
    viewed = pa.Array.from_buffers(_VIEW_KIND[kind], n, [nulls, pa.py_buffer(views), data])
    return viewed.cast(kind)


def record_offsets(data: bytes, count: int) -> np.ndarray:
    """Where each of `count` records starts (walking the size fields: about 75 ns a record)."""
    starts = np.empty(count, dtype=np.int64)
    pos = 0
    size_at = records.I32.unpack_from
    for i in range(count):
        starts[i] = pos
        pos += size_at(data, pos)[0]
    if pos != len(data):
        raise records.RecordError(f"{count} records end at byte {pos}, the chunk holds {len(data)}")
    return starts


def records_to_batch(data: bytes, count: int, *, topic: str, broker: str) -> pa.RecordBatch:
    """Stored records (tidemark.common.records layout, back to back) as one record batch of the
    source's schema, built column by column with numpy and Arrow over the whole buffer."""
    n = count
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
    starts = record_offsets(data, n)
    buf = np.frombuffer(data, dtype=np.uint8)
    whole = pa.py_buffer(data)
    fixed = _windows(buf, _FIXED.itemsize)[starts].view(_FIXED).reshape(-1)
    topic_len_at = starts + _FIXED.itemsize + fixed["host_len"]
    props_at = topic_len_at + 2 + _gather(buf, topic_len_at, ">u2") + 4
    props_len = _gather(buf, props_at - 4, ">u4").astype(np.int64)
    body_at = props_at + props_len + 4
    body_len = _gather(buf, body_at - 4, ">u4").astype(np.int64)
    props = _slices(pa.string(), whole, buf, props_at, props_len)
    special, properties = _split_properties(props)
    columns = [
        _constant_strings(topic, n),
        _constant_strings(broker, n),
        pa.array(fixed["queue_id"].astype(np.int32), pa.int32()),
        pa.array(fixed["queue_offset"].astype(np.int64), pa.int64()),
        special["msg_id"],
        special["keys"],
        special["tags"],
        _slices(pa.binary(), whole, buf, body_at, body_len),
        properties,
        pa.array(fixed["born"].astype(np.int64) * 1000, _TS),
        pa.array(fixed["stored"].astype(np.int64) * 1000, _TS),
        pa.array(fixed["reconsume"].astype(np.int32), pa.int32()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def _equals(buf: np.ndarray, pos: np.ndarray, text: bytes) -> np.ndarray:
    """Whether the bytes at each position are `text` (compared as one integer when it fits one)."""
    if len(text) in (1, 2, 4, 8):
        return _gather(buf, pos, f"<u{len(text)}") == int.from_bytes(text, "little")
    return (_windows(buf, len(text))[pos] == np.frombuffer(text, np.uint8)).all(axis=1)


_NAME_VALUE = ord(records.NAME_VALUE_SEPARATOR)
_PAIR_END = ord(records.PROPERTY_SEPARATOR)


def _split_properties(props: pa.StringArray) -> tuple[dict[str, pa.Array], pa.Array]:
    """The "k\x01v\x02..." sections: msg_id, keys and tags columns (null when absent or empty) and the
    map of the other properties.

    The broker stores only well-formed sections (records.check_batch: pairs "key\x01value\x02",
    neither separator inside a key or value), so the sections of all rows laid end to end are one
    sequence of pairs: the n-th \x02 ends the n-th pair, whose key ends at the n-th \x01. Each
    pair's row is found by where it ends among the rows' offsets. A key given twice in one section
    counts once, with its last value, as records.decode_properties reads it."""
    n = len(props)
    _, offsets_buf, data = props.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32)[props.offset:props.offset + n + 1]
    if data is None:  # (every section empty)
        data = pa.py_buffer(b"")
    buf = np.frombuffer(data, dtype=np.uint8)[:offsets[-1]]
    ends = np.flatnonzero(buf == _PAIR_END)
    seps = np.flatnonzero(buf == _NAME_VALUE)
    pair_at = np.empty(len(ends), dtype=np.int64)
    pair_at[:1] = offsets[0]
    pair_at[1:] = ends[:-1] + 1
    sections = offsets[1:][offsets[1:] > offsets[:-1]]
    # Each pair holds one \x01 after a non-empty key, and every section ends a pair: checked, as a
    # wrong guess would shift every later property.
    if (len(ends) != len(seps) or not ((pair_at < seps) & (seps < ends)).all()
            or (buf[sections - 1] != _PAIR_END).any()):
        raise records.RecordError("a property section is not 'key\\x01value\\x02' pairs with non-empty keys")
    key_len = seps - pair_at
    value_at, value_len = seps + 1, ends - seps - 1
    row = np.searchsorted(offsets, ends, side="right") - 1
    kind = np.full(len(ends), -1, dtype=np.int8)
    for i, name in enumerate(_SPECIAL):
        candidates = np.flatnonzero(key_len == len(name))
        kind[candidates[_equals(buf, pair_at[candidates], name.encode())]] = i
    special: dict[str, pa.Array] = {}
    for i, column in enumerate(_SPECIAL.values()):
        pairs = np.flatnonzero(kind == i)
        rows = row[pairs]
        last = np.ones(len(pairs), dtype=bool)  # of a row's pairs with this key, the last one counts
        last[:-1] = rows[1:] != rows[:-1]
        pairs, rows = pairs[last], rows[last]
        at, length = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        at[rows], length[rows] = value_at[pairs], value_len[pairs]
        special[column] = _slices(pa.string(), data, buf, at, length, valid=length > 0)
    rest = np.flatnonzero(kind < 0)
    map_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(row[rest], minlength=n), out=map_offsets[1:])
    keys = _slices(pa.string(), data, buf, pair_at[rest], key_len[rest])
    values = _slices(pa.string(), data, buf, value_at[rest], value_len[rest])
    properties = pa.MapArray.from_arrays(pa.array(map_offsets), keys, values,
                                         type=ARROW_SCHEMA.field("properties").type)
    return special, properties
