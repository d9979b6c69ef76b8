"""Domain errors of the broker.

Domain modules raise these; only `broker/services` translates them to gRPC
status codes (see `services/errors.py`). The message is what the client sees,
so it says what was wrong and with which value.
"""

from __future__ import annotations


class BrokerError(Exception):
    """Root of every error the broker reports to a caller."""


class InvalidArgumentError(BrokerError):
    """The request is malformed: bad name, offset out of range, oversize message..."""


class NotFoundError(BrokerError):
    """An unknown topic, group or message."""


class TopicNotFoundError(NotFoundError):
    """The request names a topic this broker does not have (RocketMQ 5's TOPIC_NOT_FOUND). Raised by the
    topic table (TopicConfigManager.require), the one place that says so, for every protocol."""


class AlreadyExistsError(BrokerError):
    """Creating something that exists."""


class FailedPreconditionError(BrokerError):
    """The request is valid but the state forbids it now."""


class SwitchoverError(FailedPreconditionError):
    """A planned switchover (`tidemark broker promote` in controller mode) refused or given up: the successor
    is not a connected, in-sync replica, did not catch up in time, or another switchover runs. Nothing
    changed: the master takes writes as before (unless etcd failed midway, which the message says)."""


class FencedError(FailedPreconditionError):
    """A commit or pull from a client whose owner epoch is older than the queue's."""


class StaleResetGenerationError(FailedPreconditionError):
    """A commit made before the committer saw an admin offset reset."""


class InvalidReceiptHandleError(InvalidArgumentError):
    """A pop receipt handle that cannot be used: forged, or of a delivery that is over (RocketMQ 5's
    INVALID_RECEIPT_HANDLE). broker/pop/handles.py raises its two kinds."""


class InvisibleTimeError(InvalidArgumentError):
    """An invisible time outside what the broker accepts (RocketMQ 5's ILLEGAL_INVISIBLE_TIME)."""


class DeliveryTimeError(InvalidArgumentError):
    """A delivery time the broker refuses (too far ahead, or not a time); RocketMQ 5's ILLEGAL_DELIVERY_TIME."""


class UnauthenticatedError(BrokerError):
    """The request carries no credentials, or wrong or stale ones."""


class PermissionDeniedError(BrokerError):
    """The broker or topic is not writable/readable (RocketMQ's NO_PERMISSION)."""


class StoreError(BrokerError):
    """The message store cannot serve the request (I/O failure, shutting down)."""


class NotCurrentError(StoreError):
    """This broker cannot vouch that its consumer offsets are the master's: it was the master and may have
    been replaced (a newer master fenced it, or its lease in etcd may have expired), or it is a replica that
    has not copied its master's offsets since it started following it. It takes no commit (as a master) or
    answers no offset query (as a replica) until it can; the client asks again, the master the name
    server names. UNAVAILABLE: retriable."""


class TruncateBelowOldestError(StoreError):
    """A replica asked to cut its commit log back to below its oldest record (it deleted older segments than
    its master holds): refused with nothing changed, as the log would otherwise end before it starts."""


class NotEnoughReplicasError(StoreError):
    """A sync-replication send refused before it was stored: fewer connected replicas are in sync than
    min_sync_replicas (RocketMQ 5's HA_NOT_AVAILABLE, Kafka's NOT_ENOUGH_REPLICAS)."""


class OutcomeUnknownError(BrokerError):
    """The request may have taken effect or not, and the broker cannot say which in time (a sync-replication
    send stored here that no replica acknowledged). Not a refusal: the caller retries, and an idempotent
    producer's retry with the same sequence is stored once. DEADLINE_EXCEEDED, like a timeout."""


class ReplicationTimeoutError(OutcomeUnknownError):
    """A sync-replication send stored on the master that fewer than min_sync_replicas replicas acknowledged
    in time: it may be lost with the master, or be on a replica already; the client cannot know
    (RocketMQ 5's SLAVE_PERSISTENCE_TIMEOUT)."""


class ConfigFileError(BrokerError):
    """A config file (offsets, topics, groups) is present but cannot be used."""
