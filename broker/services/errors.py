"""The one place where broker errors become gRPC status codes."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from tidemark.broker.errors import (
    AlreadyExistsError,
    BrokerError,
    ConfigFileError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    OutcomeUnknownError,
    PermissionDeniedError,
    StoreError,
    UnauthenticatedError,
)
from tidemark.common.logs import get_logger
from tidemark.common.protocol import ERROR_CLASS_KEY

log = get_logger("tidemark.broker.rpc")

_STATUS: tuple[tuple[type[BrokerError], grpc.StatusCode], ...] = (
    (InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (AlreadyExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (FailedPreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
    (PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (UnauthenticatedError, grpc.StatusCode.UNAUTHENTICATED),
    (StoreError, grpc.StatusCode.UNAVAILABLE),
    (ConfigFileError, grpc.StatusCode.INTERNAL),
    (OutcomeUnknownError, grpc.StatusCode.DEADLINE_EXCEEDED),
)




def status_for(error: BrokerError) -> grpc.StatusCode:
    for cls, code in _STATUS:
        if isinstance(error, cls):
            return code
    return grpc.StatusCode.INTERNAL


H = TypeVar("H", bound=Callable[..., Awaitable[Any]])


def rpc(handler: H) -> H:
    """Wrap a unary or client-streaming handler of a broker servicer: domain errors abort with their
    status and message; an answered request's config changes (a topic or group created on the way)
    are durable first."""
    return _wrap(handler, lambda servicer: servicer._b.flush_configs())


def replica_rpc(handler: H) -> H:
    """`rpc` for the replication service, whose callers are the master's replicas: its answer waits for the
    config files but not for the replicas to hold the config (flush_configs(replicated=False)). A replica
    makes these calls inside its copy of the stream (a hand-back as it connects), so waiting for it to
    acknowledge the next chunk would wait for itself, until the bound."""
    return _wrap(handler, lambda servicer: servicer._b.flush_configs(replicated=False))


def stateless_rpc(handler: H) -> H:
    """`rpc` for a servicer with nothing to flush (the name server)."""
    return _wrap(handler, None)


def _wrap(handler: H, after: Callable[[Any], Awaitable[None]] | None) -> H:
    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            response = await handler(self, request, context)
            if after is not None:
                await after(self)
            return response
        except grpc.aio.AbortError:
            raise  # the handler ended the call itself
        except BrokerError as e:
            # The class name lets clients tell e.g. a fenced commit from other FAILED_PRECONDITIONs.
            context.set_trailing_metadata(((ERROR_CLASS_KEY, type(e).__name__),))
            await context.abort(status_for(e), str(e))
        except ValueError as e:
            # Out-of-range numbers and similar that slipped past explicit validation.
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except Exception:
            log.exception("rpc failed", event="rpc_error", method=handler.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {handler.__name__}; see the broker log")

    return wrapper  # type: ignore[return-value]
