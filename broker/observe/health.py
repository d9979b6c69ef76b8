"""PersistenceHealth: which of the broker's persistent parts cannot write right now.

Three parts write to disk on their own schedule: the message store (every
send), the config files (topics.json, subscriptionGroup.json: admin calls and
auto-created topics/groups) and consumerOffset.json (a timer). Each reports
`failing(part, reason)` / `ok(part)` here when its own state changes; each
part logs its own transition, once, where the detail is known. This table
turns the reports into the `tidemark_persistence_failing{part}` gauge and the
`tidemark_persistence_failures{part}` counter, and tells listeners (the gRPC
health service) when the broker as a whole goes from healthy to degraded and
back: degraded while any part is failing.
"""

from __future__ import annotations

from collections.abc import Callable

from tidemark.broker.observe.metrics import BrokerMetrics
from tidemark.common.logs import get_logger

log = get_logger("tidemark.broker")

STORE = "store"
CONFIG_FILES = "config_files"
CONSUMER_OFFSETS = "consumer_offsets"
POP_STATE = "pop_state"
PARTS = (STORE, CONFIG_FILES, CONSUMER_OFFSETS, POP_STATE)

HealthListener = Callable[[bool], None]


class PersistenceHealth:
    """Failing parts and why; on the event-loop thread only."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self._metrics = metrics
        self._failing: dict[str, str] = {}
        self._listeners: list[HealthListener] = []
        for part in PARTS:
            metrics.persistence_failing.labels(part).set(0)

    @property
    def healthy(self) -> bool:
        return not self._failing

    def failing_parts(self) -> dict[str, str]:
        """part -> why it cannot write."""
        return dict(self._failing)

    def add_listener(self, listener: HealthListener) -> None:
        """listener(healthy) whenever the broker goes from healthy to degraded or back."""
        self._listeners.append(listener)

    def failing(self, part: str, reason: str) -> None:
        if part not in self._failing:
            self._metrics.persistence_failures.labels(part).inc()
            self._metrics.persistence_failing.labels(part).set(1)
        was_healthy = self.healthy
        self._failing[part] = reason
        if was_healthy:
            self._notify()

    def ok(self, part: str) -> None:
        if self._failing.pop(part, None) is None:
            return
        self._metrics.persistence_failing.labels(part).set(0)
        if self.healthy:
            self._notify()

    def _notify(self) -> None:
        for listener in self._listeners:
            try:
                listener(self.healthy)
            except Exception:
                log.exception("persistence health listener %r failed", listener)
