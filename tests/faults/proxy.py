"""FaultProxy: a TCP proxy between two parties that a test turns hostile.

Placed between a client and a broker (dial the proxy's address instead of
the broker's, or start the broker with `--advertise-addr` naming the proxy so
that routes lead clients through it), between a replica and its master
(`--master` names the proxy) or between a broker and a name server. It runs
its own asyncio loop on a daemon thread; every control method is thread-safe
and returns once the loop has applied it, so a test knows the fault is in
place when the call returns.

Faults, each as a real TCP peer would see it:
- `reset()`: every open connection gets an RST at both ends (SO_LINGER 0), as
  when a middlebox or a peer's kernel drops the connection state.
- `refuse(True)`: new connections are reset at once (a closed port, a
  firewall's REJECT).
- `blackhole(True)`: nothing moves in either direction and new connections
  are accepted but never reach the target, as when packets are silently
  dropped. Bytes are held, not discarded: TCP retransmits what a partition
  dropped, so after `blackhole(False)` the held bytes flow on and both ends
  see an intact byte stream (or their own timeouts fired in the meantime).
- `delay(seconds)`: every chunk is forwarded that much later (order kept).
- `throttle(bytes_per_s)`: each direction forwards at most that rate.
- `half_close(direction)`: one direction is shut down (the far end reads
  EOF) while the other still flows.

`faults` counts what was done, so a run's report can say what it survived.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Direction", "FaultProxy"]

_CHUNK = 256 * 1024
_LINGER_RST = struct.pack("ii", 1, 0)


class Direction(enum.Enum):
    """Which way bytes travel: from the dialling party to the target, or back."""

    UPSTREAM = "upstream"      # client -> target
    DOWNSTREAM = "downstream"  # target -> client


@dataclass
class _Settings:
    refuse: bool = False
    blackhole: bool = False
    delay_s: float = 0.0
    rate_bps: float = 0.0  # 0: unlimited


@dataclass
class _Leg:
    """One direction of one connection: reads `source`, writes `sink`."""

    direction: Direction
    source: asyncio.BaseTransport | None = None
    sink: asyncio.Transport | None = None
    queue: collections.deque[tuple[float, bytes]] = field(default_factory=collections.deque)
    pump: asyncio.TimerHandle | None = None
    next_free_at: float = 0.0  # throttle: when the rate allows the next byte
    eof: bool = False  # the source finished writing: pass it on once the queue is empty
    shut: bool = False


class _Connection:
    """A dialled connection and its link to the target: two legs, closed together."""

    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy
        self.legs = {d: _Leg(d) for d in Direction}
        self.client: asyncio.Transport | None = None
        self.server: asyncio.Transport | None = None
        self.closed = False

    # -- forwarding ---------------------------------------------------------------------------

    def received(self, direction: Direction, data: bytes) -> None:
        leg = self.legs[direction]
        leg.queue.append((time.monotonic() + self.proxy.settings.delay_s, data))
        self.pump(leg)

    def pump(self, leg: _Leg) -> None:
        """Forward what the current faults allow now; come back when more is allowed."""
        if leg.pump is not None:
            leg.pump.cancel()
            leg.pump = None
        if self.closed or leg.sink is None or leg.shut:
            return
        settings = self.proxy.settings
        loop = self.proxy.loop
        while leg.queue and not settings.blackhole:
            now = time.monotonic()
            due, data = leg.queue[0]
            wait = max(due - now, leg.next_free_at - now)
            if wait > 0:
                leg.pump = loop.call_later(wait, self.pump, leg)
                break
            if settings.rate_bps:
                allowed = max(1, int(settings.rate_bps * 0.01))  # 10 ms worth per step
                if len(data) > allowed:
                    leg.queue[0] = (due, data[allowed:])
                    data = data[:allowed]
                else:
                    leg.queue.popleft()
                leg.next_free_at = time.monotonic() + len(data) / settings.rate_bps
            else:
                leg.queue.popleft()
            leg.sink.write(data)
        if leg.eof and not leg.queue and not settings.blackhole:
            self._write_eof(leg)
        # Back-pressure: stop reading a source whose bytes cannot move on.
        source = leg.source
        if source is not None and not source.is_closing():
            if leg.queue:
                source.pause_reading()
            else:
                source.resume_reading()

    # -- ending -------------------------------------------------------------------------------

    def reset(self) -> None:
        """RST both ends."""
        for transport in (self.client, self.server):
            if transport is not None:
                sock = transport.get_extra_info("socket")
                if sock is not None:
                    try:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
                    except OSError:
                        pass
                transport.abort()
        self.close()

    def half_close(self, direction: Direction) -> None:
        leg = self.legs[direction]
        leg.shut = True
        leg.queue.clear()
        if leg.sink is not None and leg.sink.can_write_eof() and not leg.sink.is_closing():
            leg.sink.write_eof()

    def eof(self, direction: Direction) -> None:
        """The source of `direction` finished writing: pass the EOF on once its bytes went."""
        leg = self.legs[direction]
        leg.eof = True
        self.pump(leg)

    def _write_eof(self, leg: _Leg) -> None:
        if leg.sink is not None and not leg.sink.is_closing() and leg.sink.can_write_eof():
            leg.sink.write_eof()
        leg.shut = True
        if all(other.shut for other in self.legs.values()):
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for leg in self.legs.values():
            if leg.pump is not None:
                leg.pump.cancel()
            leg.queue.clear()
        for transport in (self.client, self.server):
            if transport is not None and not transport.is_closing():
                transport.close()
        self.proxy.connections.discard(self)


class _Side(asyncio.Protocol):
    """The protocol of one socket of a connection; what it reads travels in `direction`."""

    def __init__(self, conn: _Connection, direction: Direction) -> None:
        self.conn = conn
        self.direction = direction

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.conn.received(self.direction, data)

    def eof_received(self) -> bool:
        self.conn.eof(self.direction)
        return True  # keep the other direction open (half-close)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.close()


class FaultProxy:
    """A proxy listening on 127.0.0.1 (or `host`) that forwards to `target` ("host:port")."""

    def __init__(self, target: str, *, host: str = "127.0.0.1", port: int = 0, name: str = "") -> None:
        target_host, target_port = target.rsplit(":", 1)
        self.target = (target_host, int(target_port))
        self.name = name or f"proxy->{target}"
        self.settings = _Settings()
        self.connections: set[_Connection] = set()
        self.faults: collections.Counter[str] = collections.Counter()
        self.loop = asyncio.new_event_loop()
        self._listen = (host, port)
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, name=self.name, daemon=True)
        self._thread.start()
        self._call(self._start)
        sock = self._server.sockets[0]
        self.address = "{}:{}".format(*sock.getsockname()[:2])

    # -- control (any thread) ---------------------------------------------------------------------

    def reset(self) -> int:
        """RST every open connection; returns how many there were."""
        return self._call(self._reset_all)

    def refuse(self, on: bool) -> None:
        self._set(refuse=on)

    def blackhole(self, on: bool) -> None:
        self._set(blackhole=on)

    def delay(self, seconds: float) -> None:
        self._set(delay_s=max(0.0, seconds))

    def throttle(self, bytes_per_s: float) -> None:
        """Limit each direction of each connection to `bytes_per_s` (0: unlimited)."""
        self._set(rate_bps=max(0.0, bytes_per_s))

    def half_close(self, direction: Direction) -> int:
        """Shut one direction of every open connection; returns how many."""
        return self._call(self._half_close_all, direction)

    def heal(self) -> None:
        """Back to a plain proxy (open connections carry on; held bytes flow)."""
        self._set(refuse=False, blackhole=False, delay_s=0.0, rate_bps=0.0)

    def open_connections(self) -> int:
        return self._call(lambda: len(self.connections))

    def close(self) -> None:
        """Stop listening, close every connection, stop the loop."""
        if self.loop.is_closed():
            return
        if self.loop.is_running():
            self._call(self._stop)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
        self.loop.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FaultProxy({self.address} -> {self.target[0]}:{self.target[1]}, {self.settings})"

    # -- on the loop ------------------------------------------------------------------------------

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        async def run() -> Any:
            result = fn(*args)
            return await result if asyncio.iscoroutine(result) else result

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def _set(self, **changes: Any) -> None:
        def apply() -> None:
            for key, value in changes.items():
                if value and getattr(self.settings, key) != value:
                    self.faults[key] += 1
                setattr(self.settings, key, value)
            for conn in list(self.connections):
                for leg in conn.legs.values():
                    conn.pump(leg)
                if not self.settings.blackhole and conn.server is None and not conn.closed:
                    self.loop.create_task(self._dial(conn))

        self._call(apply)

    async def _start(self) -> None:
        self._server = await self.loop.create_server(self._accepted, *self._listen, reuse_address=True)

    async def _stop(self) -> None:
        self._server.close()
        for conn in list(self.connections):
            conn.close()

    def _accepted(self) -> asyncio.Protocol:
        conn = _Connection(self)
        self.connections.add(conn)
        side = _Side(conn, Direction.UPSTREAM)
        original = side.connection_made

        def made(transport: asyncio.BaseTransport) -> None:
            original(transport)
            conn.client = transport
            conn.legs[Direction.UPSTREAM].source = transport
            conn.legs[Direction.DOWNSTREAM].sink = transport
            if self.settings.refuse:
                self.faults["refused"] += 1
                conn.reset()
            elif not self.settings.blackhole:
                self.loop.create_task(self._dial(conn))

        side.connection_made = made
        return side

    async def _dial(self, conn: _Connection) -> None:
        if conn.server is not None or conn.closed:
            return
        conn.server = _DIALLING  # one dial per connection
        try:
            transport, _ = await self.loop.create_connection(lambda: _Side(conn, Direction.DOWNSTREAM),
                                                              *self.target)
        except OSError:
            conn.server = None
            conn.reset()  # the target is down: the client sees what a dead port shows, a reset
            return
        if conn.closed:
            transport.abort()
            return
        conn.server = transport
        conn.legs[Direction.UPSTREAM].sink = transport
        conn.legs[Direction.DOWNSTREAM].source = transport
        for leg in conn.legs.values():
            conn.pump(leg)

    def _reset_all(self) -> int:
        conns = list(self.connections)
        for conn in conns:
            conn.reset()
        if conns:
            self.faults["reset"] += len(conns)
        return len(conns)

    def _half_close_all(self, direction: Direction) -> int:
        conns = list(self.connections)
        for conn in conns:
            conn.half_close(direction)
        self.faults[f"half_close_{direction.value}"] += len(conns)
        return len(conns)


class _Dialling:
    """Placeholder for a connection's server side while it is being dialled."""

    def get_extra_info(self, name: str) -> None:
        return None

    def abort(self) -> None:
        pass

    def is_closing(self) -> bool:
        return True

    def close(self) -> None:
        pass


_DIALLING: Any = _Dialling()
