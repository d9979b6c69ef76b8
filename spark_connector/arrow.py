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
import pyarrow.compute as pc
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

_SPECIAL = {PropertyKey.UNIQ_KEY: "msg_id", PropertyKey.KEYS: "keys", PropertyKey.TAGS: "tags"}
_GATHER = {n: np.arange(n, dtype=np.int64) for n in (2, 4, 8)}


def _be(buf: np.ndarray, pos: np.ndarray, width: int, *, signed: bool = True) -> np.ndarray:
    """Big-endian integers of `width` bytes at each position, gathered in one go."""
    raw = buf[pos[:, None] + _GATHER[width]]
    return raw.view(f">{'i' if signed else 'u'}{width}").reshape(-1).astype(np.int64)


def _constant_strings(value: str, n: int) -> pa.Array:
    data = value.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int32) * len(data)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data * n))


def _slices(kind: pa.DataType, data: memoryview, at: np.ndarray, length: np.ndarray) -> pa.Array:
    """A binary/string column of byte ranges of `data` (one copy of the bytes, no object per row)."""
    n = len(at)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(length, out=offsets[1:])
    joined = b"".join([data[a:a + n_] for a, n_ in zip(at.tolist(), length.tolist(), strict=True)])
    if offsets[-1] < 2**31:
        return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(joined)])
    large = pa.large_binary() if kind == pa.binary() else pa.large_string()
    return pa.Array.from_buffers(large, n, [None, pa.py_buffer(offsets), pa.py_buffer(joined)]).cast(kind)


def record_offsets(data: bytes, count: int) -> np.ndarray:
    """Where each of `count` records starts (walking the size fields)."""
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
    """Stored records (tidemark.common.records layout) as one record batch of the source's schema.

    Fixed fields are gathered with numpy, bodies and property sections are cut into Arrow buffers
    with one join each, and properties are split into the map column and the msg_id / keys / tags
    columns with Arrow compute kernels: no Python object per row beyond the slices."""
    n = count
    starts = record_offsets(data, n)
    buf = np.frombuffer(data, dtype=np.uint8)
    view = memoryview(data)
    queue_offset = _be(buf, starts + records.QUEUE_OFFSET_OFFSET, 8)
    queue_id = _be(buf, starts + records.QUEUE_ID_OFFSET, 4)
    born = _be(buf, starts + records.BORN_TS_OFFSET, 8)
    stored = _be(buf, starts + records.STORE_TS_OFFSET, 8)
    reconsume = _be(buf, starts + 56, 4)
    host_len = _be(buf, starts + records.HEADER_SIZE, 2, signed=False)
    topic_len_at = starts + records.HEADER_SIZE + 2 + host_len
    props_len_at = topic_len_at + 2 + _be(buf, topic_len_at, 2, signed=False)
    props_len = _be(buf, props_len_at, 4, signed=False)
    body_len_at = props_len_at + 4 + props_len
    body_len = _be(buf, body_len_at, 4, signed=False)
    special, properties = _split_properties(_slices(pa.string(), view, props_len_at + 4, props_len), n)
    columns = [
        _constant_strings(topic, n),
        _constant_strings(broker, n),
        pa.array(queue_id.astype(np.int32), pa.int32()),
        pa.array(queue_offset, pa.int64()),
        special["msg_id"],
        special["keys"],
        special["tags"],
        _slices(pa.binary(), view, body_len_at + 4, body_len),
        properties,
        pa.array(born * 1000, _TS),
        pa.array(stored * 1000, _TS),
        pa.array(reconsume.astype(np.int32), pa.int32()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def _split_properties(props: pa.StringArray, n: int) -> tuple[dict[str, pa.Array], pa.Array]:
    """The "k\\x01v\\x02..." sections: msg_id, keys and tags columns (null when absent) and the map of the rest."""
    parts = pc.split_pattern(props, pattern=records.PROPERTY_SEPARATOR)
    flat = parts.flatten()
    parent = pc.list_parent_indices(parts)
    present = pc.not_equal(flat, "")
    flat, parent = flat.filter(present), parent.filter(present)
    pairs = pc.split_pattern(flat, pattern=records.NAME_VALUE_SEPARATOR, max_splits=1)
    keys = pc.list_element(pairs, 0)
    values = pc.list_element(pairs, 1)
    parent_np = parent.to_numpy(zero_copy_only=False)
    special: dict[str, pa.Array] = {}
    for name, column in _SPECIAL.items():
        mask = pc.equal(keys, name)
        rows = parent_np[mask.to_numpy(zero_copy_only=False)]
        index = np.full(n, -1, dtype=np.int64)
        index[rows] = np.arange(len(rows))
        hits = values.filter(mask)
        taken = pc.take(hits, pa.array(index, mask=index < 0))
        special[column] = pc.if_else(pc.equal(taken, ""), pa.scalar(None, pa.string()), taken)
    rest = pc.invert(pc.is_in(keys, value_set=pa.array(list(_SPECIAL))))
    rest_parent = parent_np[rest.to_numpy(zero_copy_only=False)]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(rest_parent, minlength=n), out=offsets[1:])
    properties = pa.MapArray.from_arrays(pa.array(offsets), keys.filter(rest), values.filter(rest),
                                         type=ARROW_SCHEMA.field("properties").type)
    return special, properties
