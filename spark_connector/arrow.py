"""The source's schema, in Spark and in Arrow, and MessageExt lists -> Arrow record batches.

Spark checks a Python data source's record batches against
to_arrow_schema(schema, timezone="UTC"): timestamps are timestamp[us, tz=UTC]
(instants; Spark shows them in the session time zone) and maps are
map<string, string> with non-null keys. ARROW_SCHEMA spells that out; a unit
test holds it equal to what PySpark derives.
"""

from __future__ import annotations

from collections.abc import Sequence

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

from client.message import MessageExt

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


def to_record_batch(msgs: Sequence[MessageExt]) -> pa.RecordBatch:
    """One row per message; empty keys/tags become null (as Kafka's absent key does)."""
    n = len(msgs)
    first = msgs[0] if msgs else None
    same_queue = first is not None and all(m.queue_id == first.queue_id and m.broker_name == first.broker_name
                                           and m.topic == first.topic for m in msgs)
    if same_queue:
        # The common case (one partition = one queue): constant columns without per-row work.
        topic = pa.array([first.topic] * n, pa.string())
        broker = pa.array([first.broker_name] * n, pa.string())
        queue_id = pa.array([first.queue_id] * n, pa.int32())
    else:
        topic = pa.array([m.topic for m in msgs], pa.string())
        broker = pa.array([m.broker_name for m in msgs], pa.string())
        queue_id = pa.array([m.queue_id for m in msgs], pa.int32())
    columns = [
        topic, broker, queue_id,
        pa.array([m.queue_offset for m in msgs], pa.int64()),
        pa.array([m.msg_id or None for m in msgs], pa.string()),
        pa.array([m.keys or None for m in msgs], pa.string()),
        pa.array([m.tags or None for m in msgs], pa.string()),
        pa.array([m.body for m in msgs], pa.binary()),
        pa.array([list(m.properties.items()) for m in msgs], ARROW_SCHEMA.field("properties").type),
        pa.array([m.born_timestamp * 1000 for m in msgs], _TS),
        pa.array([m.store_timestamp * 1000 for m in msgs], _TS),
        pa.array([m.reconsume_times for m in msgs], pa.int32()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
