"""Arrow rows to record batches in bulk: the sink's encoder, no Python object per row.

A record (tidemark.common.records) is a fixed header, the born host and topic
(the same for every row), the properties (UNIQ_KEY, TAGS and KEYS here) and
the body, each variable part after its length. Every part of every row is
built as one Arrow column (headers and lengths through numpy structured
arrays, properties with Arrow's string kernels) and the columns are joined
row by row in C (`binary_join_element_wise`), so the records of a RecordBatch
lie back to back in one buffer and rows i..j are the bytes between their
offsets: a batch for the producer is a slice, not a copy per row.

Only what varies per row goes through Python: the tags' codes (crc32), once
per distinct tag. Message ids are RocketMQ's UNIQ_KEY shape (tidemark's
MessageIdGenerator: a per-process prefix, the time in ms, a counter), made
for a whole column at once.
"""

from __future__ import annotations

import os
import secrets
import time
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tidemark.client.errors import InvalidArgumentError
from tidemark.common.protocol import PropertyKey
from tidemark.common.records import HEADER_SIZE, MESSAGE_MAGIC, short_string

_HEADER = np.dtype([("total", ">i4"), ("magic", ">i4"), ("crc", ">u4"), ("queue_id", ">i4"), ("flag", ">i4"),
                    ("queue_offset", ">i8"), ("phys_offset", ">i8"), ("sys_flag", ">i4"), ("born", ">i8"),
                    ("store", ">i8"), ("reconsume", ">i4"), ("tags_code", ">i8")])
assert _HEADER.itemsize == HEADER_SIZE
_HEX = np.frombuffer(b"0123456789ABCDEF", np.uint8)
_UNIQ = (PropertyKey.UNIQ_KEY + "\x01").encode()
_TAGS = ("\x02" + PropertyKey.TAGS + "\x01").encode()
_KEYS = ("\x02" + PropertyKey.KEYS + "\x01").encode()


class BulkIds:
    """Message ids for columns of rows: a per-process prefix, the ms time, a wrapping 16-bit counter."""

    def __init__(self) -> None:
        self._prefix = ((os.getpid() & 0xFFFF).to_bytes(2, "big") + secrets.token_bytes(4)).hex().upper()
        self._counter = 0

    def column(self, n: int) -> pa.Array:
        stem = np.frombuffer(f"{self._prefix}{time.time_ns() // 1_000_000:016X}".encode(), np.uint8)
        counters = (np.arange(self._counter + 1, self._counter + n + 1, dtype=np.uint32) & 0xFFFF)
        self._counter += n
        ids = np.empty((n, 32), np.uint8)
        ids[:, :28] = stem
        for digit in range(4):
            ids[:, 28 + digit] = _HEX[(counters >> (12 - 4 * digit)) & 0xF]
        return _fixed(ids, 32)


def _fixed(data: np.ndarray, width: int) -> pa.Array:
    """A numpy array of `width`-byte items as an Arrow binary column (one value per item), over the array's
    own memory: the offsets are every width-th byte, so neither the items nor a fixed-size column's cast
    to binary are copied."""
    n = len(data)
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(data))])


def _lengths(column: pa.Array) -> np.ndarray:
    return pc.binary_length(column).to_numpy(zero_copy_only=False).astype(np.int64)


def _text(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    index = batch.schema.get_field_index(name)
    if index < 0:
        return None
    column = batch.column(index)
    return pc.fill_null(column, "") if column.null_count else column


def _segment(prefix: bytes, values: pa.Array) -> tuple[list[pa.Array | pa.Scalar], np.ndarray]:
    """(the parts that join into prefix + value for the rows with a non-empty value and into b"" for the
    others; their lengths), as binary. When every row has a value (the usual case) the prefix and the
    values themselves are the parts: no column is built for them before the records' join."""
    values = values.cast(pa.binary())
    lengths = _lengths(values)
    if not len(lengths) or lengths.min() > 0:
        return [pa.scalar(prefix), values], lengths + len(prefix)
    joined = pc.binary_join_element_wise(pa.scalar(prefix), values, pa.scalar(b""))
    return [pc.if_else(pa.array(lengths == 0), pa.scalar(b""), joined)], np.where(lengths == 0, 0, lengths + len(prefix))


def _value_bytes(values: pa.Array) -> np.ndarray:
    """The bytes of a string or binary column's values, back to back: a view of its data buffer."""
    _, offsets, data = values.buffers()
    if data is None or not len(values):
        return np.empty(0, np.uint8)
    large = pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type)
    dtype = np.dtype(np.int64 if large else np.int32)
    bounds = np.frombuffer(offsets, dtype, len(values) + 1, values.offset * dtype.itemsize)
    return np.frombuffer(data, np.uint8, int(bounds[-1] - bounds[0]), int(bounds[0]))


def _check_text(name: str, values: pa.Array, first_row: int, forbidden: tuple[str, ...]) -> None:
    """Refuse a column whose values hold one of `forbidden`. The property section's separators (\x01,
    \x02) are looked for in one numpy pass over the values' bytes, and Arrow's substring search (which
    names the row) runs for them only when that finds one."""
    data = _value_bytes(values)
    separator = bool(((data - np.uint8(1)) < 2).any())  # a byte 1 or 2 (uint8 wraps: 0 - 1 is 255)
    for bad in forbidden:
        if bad in ("\x01", "\x02") and not separator:
            continue
        hits = pc.match_substring(values, bad)
        if pc.any(hits).as_py():
            row = first_row + pc.index(hits, True).as_py()
            raise InvalidArgumentError(f"tidemark sink: row {row}: {name} must not contain {bad!r}")


def _tags_codes(tags: pa.Array) -> np.ndarray:
    """tag_hash of every row's tag, hashed once per distinct tag."""
    encoded = pc.dictionary_encode(tags)
    codes = np.array([zlib.crc32(t.encode("utf-8")) if t else 0 for t in encoded.dictionary.to_pylist()],
                     np.int64)
    return codes[encoded.indices.to_numpy(zero_copy_only=False)] if len(codes) else np.zeros(len(tags), np.int64)


class RecordEncoder:
    """Encodes the rows of Arrow record batches (body, and keys and tags when present) as records."""

    def __init__(self, topic: str, born_host: str, max_message_size: int) -> None:
        self.topic = topic
        self._constant = short_string("born host", born_host) + short_string("topic", topic)
        self._max = max_message_size
        self._ids = BulkIds()

    @staticmethod
    def handles(batch: pa.RecordBatch) -> bool:
        """Whether the bulk path covers the batch's columns (properties and queue_id go row by row)."""
        names = set(batch.schema.names)
        return not names & {"properties", "queue_id"}

    def encode(self, batch: pa.RecordBatch, first_row: int) -> tuple[pa.Array, np.ndarray]:
        """(records, offsets): record i is records' data between offsets[i] and offsets[i + 1]."""
        n = batch.num_rows
        body = batch.column(batch.schema.get_field_index("body"))
        if body.null_count:
            row = first_row + pc.index(pc.is_null(body), True).as_py()
            raise InvalidArgumentError(f"tidemark sink: row {row} has a null body")
        if not pa.types.is_binary(body.type):  # string, large_string, large_binary (Arrow's large var types)
            body = body.cast(pa.binary())
        body_len = _lengths(body)
        if n and body_len.min() == 0:
            raise InvalidArgumentError(f"tidemark sink: row {first_row + int(np.argmin(body_len))}: message body "
                                       f"must not be empty")
        if n and body_len.max() > self._max:
            row = int(np.argmax(body_len))
            raise InvalidArgumentError(f"tidemark sink: row {first_row + row}: message body is {body_len[row]} bytes; "
                                       f"max_message_size is {self._max}")
        keys, tags = _text(batch, "keys"), _text(batch, "tags")
        if keys is not None:
            _check_text("keys", keys, first_row, ("\x01", "\x02"))
        if tags is not None:
            _check_text("tags", tags, first_row, ("\x01", "\x02", "||"))
        # The property section, UNIQ_KEY\x01id[\x02TAGS\x01tags][\x02KEYS\x01keys]\x02, is joined into the
        # records with the rest; its length is summed from its parts'.
        props = [pa.scalar(_UNIQ), self._ids.column(n)]
        props_len = np.full(n, len(_UNIQ) + 32 + 1, np.int64)
        for prefix, values in ((_TAGS, tags), (_KEYS, keys)):
            if values is not None:
                parts, length = _segment(prefix, values)
                props += parts
                props_len += length
        props.append(pa.scalar(b"\x02"))

        header = np.zeros(n, _HEADER)
        header["total"] = HEADER_SIZE + len(self._constant) + 8 + props_len + body_len
        header["magic"] = MESSAGE_MAGIC
        header["born"] = time.time_ns() // 1_000_000
        if tags is not None:
            header["tags_code"] = _tags_codes(tags)
        records = pc.binary_join_element_wise(
            _fixed(header, HEADER_SIZE), pa.scalar(self._constant), _fixed(props_len.astype(">u4"), 4), *props,
            _fixed(body_len.astype(">u4"), 4), body, pa.scalar(b""))
        offsets = np.concatenate([[0], np.cumsum(header["total"].astype(np.int64))])
        return records, offsets


def record_view(records: pa.Array, offsets: np.ndarray, start: int, end: int) -> memoryview:
    """The records of rows start..end-1, back to back: a view of the encoder's buffer, no copy (the Produce
    stream copies them once, into its request)."""
    data = records.buffers()[2]
    base = records.offset
    first = int(np.frombuffer(records.buffers()[1], np.int32, 1, (base + start) * 4)[0])
    return memoryview(data)[first:first + int(offsets[end] - offsets[start])]


def record_bytes(records: pa.Array, offsets: np.ndarray, start: int, end: int) -> bytes:
    """The records of rows start..end-1, back to back, as bytes of their own."""
    return bytes(record_view(records, offsets, start, end))
