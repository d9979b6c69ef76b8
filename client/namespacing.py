"""The client's side of namespaces (common/namespaces.py, which says how names are stored and why).

A Producer, consumer or Admin made with `namespace="NS"` wraps every topic and
group name the application gives it into the stored name (`NS%name`) before
anything travels, and hands the application bare names back in the messages,
queues and send results it returns, as RocketMQ 4's Java client does
(ClientConfig.withNamespace / withoutNamespace). The group and producer group
are wrapped once, in the settings (client/settings.py), so everything built on
them (offsets, the retry topic `%RETRY%NS%group`, transaction checks) uses the
stored name without knowing of namespaces.

Wrapping is idempotent, so a stored name handed back (Admin answers with
stored names: its answers may span namespaces, and the stored name is the one
ACL rules and the other tools show) is taken as it is.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from tidemark.client.errors import InvalidArgumentError
from tidemark.client.message import Message, MessageExt, MessageQueue, SendResult
from tidemark.common.namespaces import in_namespace, unwrap, wrap
from tidemark.common.protocol import InvalidNameError

T = TypeVar("T")


def wrap_name(namespace: str, name: str, kind: str) -> str:
    """`wrap` with the client's error: InvalidArgumentError naming the bad namespace or name."""
    try:
        return wrap(namespace, name, kind=kind)
    except InvalidNameError as e:
        raise InvalidArgumentError(str(e)) from None


@dataclass(frozen=True, slots=True)
class Names:
    """One client's namespace: application names in, bare names out. Without a namespace every method
    returns what it is given."""

    namespace: str = ""

    # -- in: what the application names --------------------------------------------------------------

    # An empty name (no topic or group: "every topic" to some Admin calls) and a value that is no name at all
    # go on unchanged, to the callers' own checks.
    def topic(self, name: str) -> str:
        return wrap_name(self.namespace, name, "topic") if self.namespace and name and isinstance(name, str) else name

    def group(self, name: str) -> str:
        return wrap_name(self.namespace, name, "group") if self.namespace and name and isinstance(name, str) else name

    def queue(self, mq: T) -> T:
        if self.namespace and isinstance(mq, MessageQueue):
            return replace(mq, topic=self.topic(mq.topic))  # type: ignore[return-value]
        return mq

    def message(self, m: T) -> T:
        if self.namespace and isinstance(m, Message):
            return replace(m, topic=self.topic(m.topic))  # type: ignore[return-value]
        return m  # not a Message: the caller's own check refuses it

    # -- out: what the application gets back --------------------------------------------------------

    def bare_topic(self, stored: str) -> str:
        return unwrap(self.namespace, stored)

    def bare_queue(self, mq: MessageQueue) -> MessageQueue:
        if self.namespace and in_namespace(self.namespace, mq.topic):
            return replace(mq, topic=unwrap(self.namespace, mq.topic))
        return mq

    def bare_queues(self, mqs: Sequence[MessageQueue]) -> list[MessageQueue]:
        return [self.bare_queue(mq) for mq in mqs]

    def bare_message(self, m: MessageExt) -> MessageExt:
        if self.namespace and in_namespace(self.namespace, m.topic):
            return m.replace(topic=unwrap(self.namespace, m.topic))
        return m

    def bare_messages(self, msgs: Sequence[MessageExt]) -> list[MessageExt]:
        return [self.bare_message(m) for m in msgs] if self.namespace else list(msgs)

    def bare_result(self, r: SendResult) -> SendResult:
        return replace(r, message_queue=self.bare_queue(r.message_queue)) if self.namespace else r

    def bare_future(self, future: concurrent.futures.Future[SendResult]) -> concurrent.futures.Future[SendResult]:
        """A future of the same send whose result carries bare names."""
        if not self.namespace:
            return future
        out: concurrent.futures.Future[SendResult] = concurrent.futures.Future()

        def copy(f: concurrent.futures.Future[SendResult]) -> None:
            if f.cancelled():
                out.cancel()
            elif not out.set_running_or_notify_cancel():
                return  # cancelled by the application meanwhile
            elif (error := f.exception()) is not None:
                out.set_exception(error)
            else:
                out.set_result(self.bare_result(f.result()))

        def forward(o: concurrent.futures.Future[SendResult]) -> None:
            if o.cancelled():
                future.cancel()  # as without a namespace (the future is cancelled, not the bytes already batched)
        future.add_done_callback(copy)
        out.add_done_callback(forward)
        return out

    def bare_callback(self, callback: Callable[[SendResult | None, BaseException | None], Any] | None
                      ) -> Callable[[SendResult | None, BaseException | None], Any] | None:
        """A send callback that gets bare names."""
        if not self.namespace or callback is None:
            return callback

        def call(result: SendResult | None, error: BaseException | None) -> Any:
            return callback(None if result is None else self.bare_result(result), error)
        return call

    def listener(self, listener: Callable[[Sequence[MessageExt], Any], T]) -> Callable[[Sequence[MessageExt], Any], T]:
        """A push consumer's listener that gets bare names: its messages, and the queue of its context (the
        context itself is the consumer's, which reads the listener's answer from it)."""
        if not self.namespace:
            return listener

        def consume(msgs: Sequence[MessageExt], context: Any) -> T:
            context.message_queue = self.bare_queue(context.message_queue)
            return listener(self.bare_messages(msgs), context)
        return consume


__all__ = ["Names", "wrap_name"]
