"""Consumer offsets: the committed-offset table with fencing, and consumerOffset.json.

`manager` holds the in-memory table and its rules; `fencing` who may move an
entry; `journal` every change since the last snapshot; `batches` how a batch of
changes reaches the journal and the replicas (or is refused); `persistence` the
file format and crash-safe loading. Pure domain code: no grpc.
"""

from tidemark.broker.offsets.fencing import Fence, OwnershipView
from tidemark.broker.offsets.manager import ConsumerOffsetManager
from tidemark.broker.offsets.persistence import (
    OFFSET_FILE_NAME,
    DecodeResult,
    LoadReport,
    LoadSource,
    OffsetFileError,
    decode_offset_table,
    encode_offset_table,
)
from tidemark.broker.offsets.snapshots import PersistReport

__all__ = [
    "OFFSET_FILE_NAME",
    "ConsumerOffsetManager",
    "DecodeResult",
    "Fence",
    "LoadReport",
    "LoadSource",
    "OffsetFileError",
    "OwnershipView",
    "PersistReport",
    "decode_offset_table",
    "encode_offset_table",
]
