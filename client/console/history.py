"""What the console remembers between page loads: each group's lag and each topic's message count over time.

Bounded and thread-safe (the sampler thread writes while request threads read): a sampler feeds it
points, pages read series and rates back. A series keeps the newest
`capacity` points; a group or topic not seen for `forget_after_ms` is dropped, so a console watching a busy
cluster for weeks holds at most capacity x (groups + topics) points.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Point:
    t_ms: int
    value: int


@dataclass(slots=True)
class _Series:
    points: deque[Point]
    last_ms: int = 0


@dataclass(slots=True)
class History:
    capacity: int = 1800
    forget_after_ms: int = 3_600_000
    _series: dict[tuple[str, str], _Series] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, kind: str, name: str, t_ms: int, value: int) -> None:
        """One observation of `kind` ("lag" of a group, "messages" of a topic) at t_ms. Points older than
        the newest one of the series are ignored: two samplers racing cannot draw a line backwards."""
        with self._lock:
            s = self._series.get((kind, name))
            if s is None:
                s = self._series[(kind, name)] = _Series(deque(maxlen=self.capacity))
            if s.points and t_ms < s.points[-1].t_ms:
                return
            s.points.append(Point(t_ms, value))
            s.last_ms = t_ms

    def series(self, kind: str, name: str, *, since_ms: int = 0) -> list[Point]:
        with self._lock:
            s = self._series.get((kind, name))
            return [p for p in s.points if p.t_ms >= since_ms] if s else []

    def rate(self, kind: str, name: str, *, window_ms: int = 60_000) -> float | None:
        """Change per second over the newest window (None until two points span some time). A value that
        fell (a topic deleted and created again) restarts the window at the fall."""
        points = self.series(kind, name)
        if len(points) < 2:
            return None
        newest = points[-1]
        start = newest
        for p in reversed(points[:-1]):
            if newest.t_ms - p.t_ms > window_ms or p.value > start.value:
                break
            start = p
        span_ms = newest.t_ms - start.t_ms
        return (newest.value - start.value) * 1000 / span_ms if span_ms > 0 else None

    def forget_idle(self, now_ms: int) -> list[tuple[str, str]]:
        """Drop series not recorded for forget_after_ms; returns what was dropped."""
        with self._lock:
            gone = [k for k, s in self._series.items() if now_ms - s.last_ms > self.forget_after_ms]
            for k in gone:
                del self._series[k]
            return gone
