"""Tidemark client library: Producer, PushConsumer, PullConsumer (lite pull) and Admin.

Synchronous API for scripts and PySpark executors; each component runs its
asyncio core on a loop thread it owns. Every error is a TidemarkError.
"""

import os

# grpc's C core writes every refused TLS handshake to stderr at INFO level, on top of the one-line
# exception this library raises for it; keep it to errors unless the user chose a level. (Read when
# grpc is first imported, so it is set before any import below.)
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from tidemark.client.admin import Admin
from tidemark.client.consumer.allocate import AllocateMessageQueueStrategy, strategy_by_name
from tidemark.client.consumer.dedup import DedupKey, DedupListener, FileDedupStore, MemoryDedupStore
from tidemark.client.consumer.listener import ConsumeConcurrentlyContext, ConsumeOrderlyContext
from tidemark.client.consumer.lite_pull_consumer import PullConsumer
from tidemark.client.consumer.push_consumer import PushConsumer
from tidemark.client.errors import (
    AlreadyExistsError,
    ClientStateError,
    FailedPreconditionError,
    FencedError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    NotMasterError,
    OutOfOrderSequenceError,
    PermissionDeniedError,
    ProducerFencedError,
    RequestTimeoutError,
    StaleResetGenerationError,
    TidemarkError,
    TlsHandshakeError,
    UnauthenticatedError,
    UnavailableError,
    UnknownProducerError,
)
from tidemark.client.message import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageModel,
    MessageQueue,
    PullResult,
    PullStatus,
    SendResult,
)
from tidemark.client.producer.producer import Producer
from tidemark.client.producer.selector import (
    MessageQueueSelector,
    SelectMessageQueueByHash,
    SelectMessageQueueByRandom,
)
from tidemark.client.producer.transaction import (
    LocalTransactionState,
    TransactionProducer,
    TransactionSendResult,
)
from tidemark.client.security import TlsSettings
from tidemark.client.selector import MessageSelector
from tidemark.client.settings import (
    ClientSettings,
    ProducerSettings,
    PullConsumerSettings,
    PushConsumerSettings,
)
from tidemark.client.types import ResetTarget
from tidemark.common.auth import Credentials

__all__ = [
    "Admin", "AllocateMessageQueueStrategy", "strategy_by_name", "ConsumeConcurrentlyContext",
    "ConsumeOrderlyContext", "PullConsumer", "PushConsumer", "AlreadyExistsError", "ClientStateError",
    "FailedPreconditionError", "FencedError", "InternalError", "InvalidArgumentError", "NotFoundError", "NotMasterError",
    "PermissionDeniedError", "RequestTimeoutError", "StaleResetGenerationError", "TidemarkError",
    "UnavailableError", "ConsumeConcurrentlyStatus", "ConsumeFromWhere", "ConsumeOrderlyStatus", "Message",
    "MessageExt", "MessageModel", "MessageQueue", "MessageSelector", "PullResult", "PullStatus", "SendResult",
    "Producer",
    "MessageQueueSelector", "SelectMessageQueueByHash", "SelectMessageQueueByRandom", "ClientSettings",
    "ProducerSettings", "PullConsumerSettings", "PushConsumerSettings", "ResetTarget", "Credentials", "TlsSettings",
    "TlsHandshakeError",
    "UnauthenticatedError", "OutOfOrderSequenceError", "ProducerFencedError", "UnknownProducerError",
    "DedupKey", "DedupListener", "FileDedupStore", "MemoryDedupStore",
    "LocalTransactionState", "TransactionProducer", "TransactionSendResult",
]
