"""The five peer workloads, their sizes, and what every system's client code shares.

Every message is MESSAGE_SIZE bytes: 8 bytes of send time (CLOCK_MONOTONIC, which
every process on the machine shares), 8 bytes of sequence number (to count
duplicates the same way on every system), then fixed padding.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

MESSAGE_SIZE = 1024
_HEADER = struct.Struct("<qQ")
_PADDING = (os.urandom(64) * (MESSAGE_SIZE // 64))[: MESSAGE_SIZE - _HEADER.size]

WORKLOADS = ("produce", "produce_sync", "consume", "commit", "latency", "membership", "send", "latency_curve")
# The latency curve's fixed rates, msg/s (OpenMessaging Benchmark's way: latency percentiles at set rates).
CURVE_RATES = (1_000, 5_000, 20_000, 50_000)
WORKLOAD_TITLES = {
    "produce": "1. produce (1 process)",
    "produce_sync": "1b. produce, sync flush",
    "consume": "2. consume (group of 4)",
    "commit": "3. offset/ack commits (64 queues)",
    "latency": "4. e2e latency at fixed rate",
    "membership": "5. group membership change",
    "send": "6. synchronous send (1 thread)",
    "latency_curve": "7. latency at fixed rates",
}


@dataclass(frozen=True)
class Sizes:
    """Counts and bounds of one run; `full()` is what the issue asks, `smoke()` only proves it runs."""

    messages: int = 200_000          # workloads 1 and 2
    batch: int = 32
    consumers: int = 4
    queues: int = 8                  # Tidemark queues per topic (Redis: one stream; JetStream: one stream)
    commit_queues: int = 64          # workload 3
    commits_per_queue: int = 1_000
    latency_rate: int = 5_000        # workload 4, msg/s
    latency_seconds: float = 8.0
    busy_rate: int = 2_000           # workload 5: steady load on the group, msg/s
    busy_consumers: int = 2
    join_after_s: float = 3.0
    after_join_s: float = 5.0
    sends: int = 5_000               # workload 6: one-at-a-time sends (and as many in batches of `batch`)
    curve_rates: tuple[int, ...] = CURVE_RATES  # workload 7: the rates (times curve_scale), each for
    curve_seconds: float = 4.0                  # this long
    curve_scale: float = 1.0
    rounds: int = 3
    workload_timeout_s: float = 120.0

    @classmethod
    def full(cls) -> Sizes:
        return cls()

    @classmethod
    def smoke(cls) -> Sizes:
        return cls(messages=2_000, commits_per_queue=10, latency_rate=500, latency_seconds=1.0, busy_rate=300,
                   join_after_s=1.0, after_join_s=1.5, sends=300, curve_rates=CURVE_RATES[:2], curve_seconds=1.0,
                   curve_scale=0.02, rounds=1, workload_timeout_s=45.0)

    def scaled(self, factor: float) -> Sizes:
        """Counts multiplied by factor (rates and durations kept), for a slow machine."""
        return dataclasses.replace(self, messages=max(1_000, int(self.messages * factor)),
                                   commits_per_queue=max(10, int(self.commits_per_queue * factor)))

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def payload(seq: int, sent_ns: int | None = None) -> bytes:
    return _HEADER.pack(time.monotonic_ns() if sent_ns is None else sent_ns, seq) + _PADDING


def header(body: bytes) -> tuple[int, int]:
    """(send time ns, sequence number) of a benchmark message."""
    return _HEADER.unpack_from(body)


def round_trips(call, count: int) -> dict:
    """Time `count` calls one after the other (after 200 untimed ones): p50/p99 in microseconds."""
    for _ in range(200):
        call()
    samples = []
    for _ in range(count):
        t0 = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - t0) / 1000)
    return {"p50_us": percentile(samples, 50), "p99_us": percentile(samples, 99)}


PERCENTILES = (("p50", 50), ("p99", 99), ("p999", 99.9))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


class Pacer:
    """Fixed-rate sending: how many messages are due now, never bursting more than `max_burst`.

    Message `seq` falls due `seq / rate` seconds after the start, and carries that time (`stamp`), not
    the time it left: a sender that falls behind shows up as latency instead of silently sending later
    (no coordinated omission). Between messages the sender sleeps until the next one falls due, so at a
    rate it can keep up with, every message leaves alone and on time.
    """

    def __init__(self, rate: float, total: int, max_burst: int = 64, *,
                 clock_ns: Callable[[], int] = time.monotonic_ns,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate = rate
        self.total = total
        self.max_burst = max_burst
        self.sent = 0
        self.publish_us: list[float] = []  # due -> acknowledged, past the first half second
        self._clock_ns = clock_ns
        self._sleep = sleep
        self.started_ns = clock_ns()
        self.started = self.started_ns / 1e9

    def stamp(self, seq: int) -> int:
        return self.started_ns + int(seq * 1e9 / self.rate)

    def next_payload(self) -> bytes:
        """The payload of the next message (its due time, its sequence number); counts it as sent."""
        body = payload(self.sent, self.stamp(self.sent))
        self.sent += 1
        return body

    def _due_now(self) -> tuple[int, float]:
        """(messages due now, seconds until the next one falls due), by the stamps themselves (integer
        nanoseconds), so that a sleep of exactly the wait always finds the next message due."""
        now = self._clock_ns()
        next_due = self.stamp(self.sent)
        if now < next_due:
            return 0, (next_due - now) / 1e9
        should = min(self.total, int((now - self.started_ns) * self.rate / 1e9) + 1)
        while should < self.total and self.stamp(should) <= now:
            should += 1
        while should > self.sent + 1 and self.stamp(should - 1) > now:
            should -= 1
        return min(should - self.sent, self.max_burst), 0.0

    def due(self) -> int:
        """Messages to send now (0 when done); sleeps until at least one is due."""
        while self.sent < self.total:
            n, wait = self._due_now()
            if n > 0:
                return n
            self._sleep(wait)
        return 0

    async def adue(self) -> int:
        import asyncio
        while self.sent < self.total:
            n, wait = self._due_now()
            if n > 0:
                return n
            await asyncio.sleep(wait)
        return 0

    def acked(self, seq: int) -> None:
        """Message `seq` was acknowledged now (any thread): its publish latency, counted from its due time."""
        if seq >= self.rate / 2:
            self.publish_us.append((self._clock_ns() - self.stamp(seq)) / 1000)

    def result(self) -> dict:
        elapsed = self._clock_ns() / 1e9 - self.started
        out = {"sent": self.sent, "elapsed_s": elapsed, "achieved_rate": self.sent / elapsed if elapsed else 0.0}
        if self.publish_us:
            out.update({f"publish_{k}_us": percentile(self.publish_us, q) for k, q in PERCENTILES})
        return out


class Recorder:
    """What a consumer saw: count, first/last receive time, sequence numbers, latencies. Thread-safe."""

    def __init__(self, *, latency: bool = False, keep_seqs: bool = False, warmup: int = 0) -> None:
        self._lock = threading.Lock()
        self.warmup = warmup  # latencies of sequence numbers below this are not kept
        self.count = 0
        self.first = 0.0
        self.last = 0.0
        self.latency = latency
        self.latencies_us: list[float] = []
        self.seqs: list[int] | None = [] if keep_seqs else None

    def record(self, bodies) -> None:
        now_ns = time.monotonic_ns()
        now = now_ns / 1e9
        heads = [header(b) for b in bodies] if (self.latency or self.seqs is not None) else ()
        with self._lock:
            if not self.count:
                self.first = now
            self.count += len(bodies)
            self.last = now
            if self.latency:
                self.latencies_us.extend((now_ns - h[0]) / 1000 for h in heads if h[1] >= self.warmup)
            if self.seqs is not None:
                self.seqs.extend(h[1] for h in heads)

    def idle_for(self) -> float:
        return time.monotonic() - self.last if self.count else 0.0

    def result(self, seqs_path: str | None = None, lat_path: str | None = None) -> dict:
        out = {"count": self.count, "first": self.first, "last": self.last}
        if self.latency:
            out["p50_us"] = percentile(self.latencies_us, 50)
            out["p99_us"] = percentile(self.latencies_us, 99)
            if lat_path:  # every sample, for percentiles over several consumers
                with open(lat_path, "w") as f:
                    f.write("\n".join(f"{v:.1f}" for v in self.latencies_us))
        if self.seqs is not None and seqs_path:
            with open(seqs_path, "w") as f:
                f.write("\n".join(map(str, self.seqs)))
        return out


def consume_until(rec: Recorder, ctl, spec: dict, poll: float = 0.02) -> None:
    """Block until told to stop, or idle for spec['idle_s'] after the first message, or the deadline."""
    deadline = time.monotonic() + spec.get("timeout_s", 120)
    idle_s = spec.get("idle_s")
    expect = spec.get("expect")
    while time.monotonic() < deadline and not ctl.stopped.is_set():
        if expect and rec.count >= expect:
            return
        if idle_s and rec.count and rec.idle_for() >= idle_s:
            return
        time.sleep(poll)


def dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))
