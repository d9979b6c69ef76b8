"""The message store: CommitLog, ConsumeQueue, checkpoint and the MessageStore facade.

Pure domain code (no grpc). See docs/architecture.md, "Store", and
`message_store` for the threading model and lifecycle.
"""

from tidemark.broker.store.message_store import (
    FlushMode,
    GetResult,
    GetStatus,
    MessageRecord,
    MessageStore,
    PutResult,
    RawRead,
    RecordsPut,
    RecoveryReport,
    StoreConfig,
    StoredMessage,
)

__all__ = [
    "FlushMode",
    "GetResult",
    "GetStatus",
    "MessageRecord",
    "MessageStore",
    "PutResult",
    "RawRead",
    "RecordsPut",
    "RecoveryReport",
    "StoreConfig",
    "StoredMessage",
]
