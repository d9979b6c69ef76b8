"""BlockingConsumer: what the two blocking consumers, PushConsumer and PullConsumer, share on top of
BlockingClient.

Kept apart so that a consumer's identity is described once: both join a group the same way (membership,
allocation, queue locks all go by the client id), so an application asks either of them the same
question and gets the same kind of answer.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.client.runtime import BlockingClient, ClientState
from tidemark.client.settings import ConsumerSettings


class BlockingConsumer(BlockingClient):
    """A blocking consumer: a subclass sets `settings`, `_early` (its EarlyConnection) and `_core` (its
    asyncio core, None until start()), and BlockingClient's `_loop` and `_life`."""

    settings: ConsumerSettings

    def _start_with(self, core: Any, start: Callable[[BrokerCluster | None], Coroutine[Any, Any, Any]]) -> None:
        """Both consumers' start() once their core is built: `start(cluster)` on the loop thread, with what
        connect() opened (or None). The core becomes the consumer's only once this start() took the
        consumer to STARTING: a second start() beside it is refused then, and must not replace (nor, failing,
        drop) the core of the one that runs. It is reachable before start() returns: the listener may run
        (and call suspend()) as soon as the first rebalance inside start() hands out a queue."""
        def starting() -> Coroutine[Any, Any, Any]:
            self._core = core
            return start(self._early.take())  # (the core owns it from here: closes it on failure too)

        with self._early.starting():
            try:
                self._start_core(starting, timeout=self.settings.request_timeout_s * 4 + 5)
            except BaseException:
                if self._core is core:
                    self._core = None
                raise

    def _shut_down(self) -> None:
        """Both consumers' shutdown(): the core's own shutdown within its drain time, or, never started,
        only what connect() opened (EarlyConnection.close; a connect() under way on another thread closes
        its own), or, still starting, the start given up (BlockingClient._start_core); the core is let go
        once the consumer is SHUTDOWN."""
        try:
            if self._stop_core() is ClientState.CREATED:
                self._early.close()
        finally:
            if self._life.state is ClientState.SHUTDOWN:
                self._core = None

    def _core_stop(self) -> tuple[Callable[[], Coroutine[Any, Any, Any]], float]:
        core = self._core
        return (lambda: core.shutdown()), self.settings.drain_timeout_s + 30

    @property
    def client_id(self) -> str:
        """How the brokers know this consumer in its group (member lists, allocation, queue locks):
        RocketMQ's clientId, client_ip@instance_name. Without an instance_name each consumer of the
        process gets its own (pid, pid-2...), so two consumers in one process never share one."""
        return self.settings.client_id
