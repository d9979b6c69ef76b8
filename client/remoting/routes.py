"""Two small rules of the client's view of a cluster, kept apart from BrokerCluster's state.

- `merged_route`: one topic route from the GetRoute answers of the listed
  brokers (without name servers each broker is asked): brokers that could not
  be asked are left out while others hold queues; with none, the topic is
  missing only if every broker said so, else unknown (retriable).
- `RetryGate`: at most one try per key every interval, for what is asked again
  out of schedule (a route while writes cannot go).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from tidemark.client.errors import NotFoundError, TidemarkError, UnavailableError
from tidemark.client.types import QueueData, TopicRoute


class RetryGate:
    """At most one try per key every `interval_s`: how often something urgent is asked again."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last: dict[object, float] = {}

    def try_now(self, key: object) -> bool:
        """True (and the try is counted) when the last try of `key` is at least interval_s old."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            return False
        self._last[key] = now
        return True

    def wait_s(self, key: object) -> float:
        """Seconds until `key` may be tried again (0 when it may now)."""
        last = self._last.get(key)
        return 0.0 if last is None else max(0.0, self.interval_s - (self._clock() - last))


def merged_route(topic: str, answers: Iterable[tuple[str, TopicRoute | BaseException]]) -> TopicRoute:
    """One route from each listed broker's GetRoute answer ((who, answer or error) pairs). Brokers that
    could not be asked are left out while others hold queues; when none does, the topic is missing only
    if every broker answered so, else unknown: a retriable UnavailableError naming who was not reached."""
    datas: list[QueueData] = []
    missing: list[str] = []
    unreachable: list[tuple[str, TidemarkError]] = []
    for who, answer in answers:
        if isinstance(answer, NotFoundError):
            missing.append(who)
        elif isinstance(answer, UnavailableError) or (isinstance(answer, TidemarkError) and answer.retriable):
            unreachable.append((who, answer))
        elif isinstance(answer, BaseException):
            raise answer
        else:
            datas.extend(answer.queue_datas)
    if datas:
        return TopicRoute(topic, tuple(sorted(datas, key=lambda d: d.broker_name)))
    if unreachable:
        errors = [e for _, e in unreachable]
        # Every broker refused the same way (a TLS handshake): that kind, not a retriable outage.
        kinds = {type(e) for e in errors}
        kind = kinds.pop() if len(kinds) == 1 and not errors[0].retriable else UnavailableError
        answered = f"; {', '.join(missing)} answered that the topic is not there" if missing else ""
        raise kind(f"the route of topic {topic!r} is unknown: {', '.join(w for w, _ in unreachable)} could not be "
                   f"reached ({'; '.join(str(e) for e in errors)}){answered}", code=errors[0].code)
    raise NotFoundError(f"topic {topic!r} does not exist on any broker ({', '.join(missing)})")


__all__ = ["RetryGate", "merged_route"]
