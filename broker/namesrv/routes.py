"""RouteTable: what a name server knows, which brokers are alive and which topics each serves.

RocketMQ's RouteInfoManager, reduced to what Tidemark's clients ask:

- A broker is known by (broker name, broker id); id 0 is the master of its
  name, ids above 0 are replicas. Each registration replaces the broker's
  previous one whole, topics included, so a deleted topic leaves its routes
  at the next registration, and a broker restarted under another name on the
  same address replaces the old entry (an address is one broker).
- A registration lasts `expiry_ms` (RocketMQ's 120 s) unless renewed;
  `expire` drops the silent ones, `unregister` a stopping one at once (only
  from the address that registered, so a late unregister of a broker already
  replaced changes nothing).
- A master (id 0) registers with its **epoch**, raised by each promotion of
  a replica (`tidemark broker promote`). The table keeps the newest epoch
  per broker name, for as long as the process lives (expiry included), and
  refuses a master with an older one (FencedError): a replaced master that
  comes back never serves writes for its name again.
- A topic's route has one entry per broker name that serves it: the
  master's address and queues with the master's permission. A broker name
  whose master is gone is routed to its lowest-id replica, readable and never
  writable (writes go to a master only): RocketMQ's read-from-replica.

Pure: the clock is an argument, no I/O, no grpc. Validation happens before
any change (BrokerError subclasses with the offending value).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tidemark.broker.errors import FencedError, InvalidArgumentError, NotFoundError
from tidemark.common.protocol import InvalidNameError, check_topic_name, is_system_topic

DEFAULT_EXPIRY_MS = 120_000
MAX_TOPICS = 1_000_000
# Cluster and broker names: what RocketMQ accepts, printable and without separators.
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,127}")
_ADDRESS_RE = re.compile(r"[A-Za-z0-9_.:\[\]-]{1,253}:([0-9]{1,5})")


@dataclass(frozen=True, slots=True)
class TopicQueues:
    name: str
    read_queue_nums: int
    write_queue_nums: int
    readable: bool = True
    writable: bool = True


@dataclass(frozen=True, slots=True)
class Registration:
    cluster_name: str
    broker_name: str
    broker_id: int
    address: str
    version: str = ""
    readable: bool = True
    writable: bool = True
    topics: tuple[TopicQueues, ...] = ()
    uptime_ms: int = 0
    replica_lag_bytes: int = 0
    replica_lag_ms: int = 0
    in_sync_replicas: tuple[int, ...] = ()
    epoch: int = 0

    @property
    def key(self) -> tuple[str, int]:
        return self.broker_name, self.broker_id

    @property
    def is_master(self) -> bool:
        return self.broker_id == 0


@dataclass(frozen=True, slots=True)
class Registered:
    registration: Registration
    last_update_ms: int
    topics: dict[str, TopicQueues]  # by name, for routes
    user_topic_count: int  # counted once per registration: the cluster view is asked far more often


@dataclass(frozen=True, slots=True)
class QueueRoute:
    """One broker name's share of a topic: where to dial and which queues."""

    broker_name: str
    address: str
    read_queue_nums: int
    write_queue_nums: int
    readable: bool
    writable: bool


def check_registration(r: Registration) -> None:
    """InvalidArgumentError naming the first thing wrong with a registration."""
    for label, name in (("cluster name", r.cluster_name), ("broker name", r.broker_name)):
        if not _NAME_RE.fullmatch(name):
            raise InvalidArgumentError(f"{label} {name!r} must be 1-127 of A-Z a-z 0-9 _ . -")
    if not 0 <= r.broker_id < 2**31:
        raise InvalidArgumentError(f"broker id {r.broker_id} is outside 0..{2**31 - 1}")
    m = _ADDRESS_RE.fullmatch(r.address)
    if m is None or not 0 < int(m.group(1)) < 65536:
        raise InvalidArgumentError(f"broker address {r.address!r} is not host:port")
    if r.uptime_ms < 0:
        raise InvalidArgumentError(f"uptime {r.uptime_ms} ms is negative")
    if r.epoch < 0:
        raise InvalidArgumentError(f"epoch {r.epoch} is negative")
    if len(r.topics) > MAX_TOPICS:
        raise InvalidArgumentError(f"{len(r.topics)} topics is more than {MAX_TOPICS}")
    seen: set[str] = set()
    for t in r.topics:
        try:
            check_topic_name(t.name)
        except InvalidNameError as e:
            raise InvalidArgumentError(str(e)) from None
        if t.name in seen:
            raise InvalidArgumentError(f"topic {t.name!r} is listed twice")
        seen.add(t.name)
        for label, n in (("read", t.read_queue_nums), ("write", t.write_queue_nums)):
            if not 0 <= n <= 65535:
                raise InvalidArgumentError(f"topic {t.name!r}: {label} queue count {n} is outside 0..65535")


class RouteTable:
    def __init__(self, expiry_ms: int = DEFAULT_EXPIRY_MS) -> None:
        if expiry_ms <= 0:
            raise ValueError(f"expiry must be > 0 ms, got {expiry_ms}")
        self.expiry_ms = expiry_ms
        self._brokers: dict[tuple[str, int], Registered] = {}
        self._epochs: dict[str, int] = {}  # broker name -> newest master epoch seen

    def __len__(self) -> int:
        return len(self._brokers)

    def master_epoch(self, broker_name: str) -> int:
        """The newest master epoch known for the broker name (0 when none)."""
        return self._epochs.get(broker_name, 0)

    # -- changes -------------------------------------------------------------------------------

    def register(self, r: Registration, now_ms: int) -> bool:
        """Add or renew a broker; True when it is new (or came back under a new address). FencedError for
        a master whose epoch is older than its name's newest."""
        check_registration(r)
        if r.is_master:
            newest = self._epochs.get(r.broker_name, 0)
            if r.epoch < newest:
                current = self._brokers.get(r.key)
                where = f" at {current.registration.address}" if current is not None else ""
                raise FencedError(f"broker {r.broker_name!r} has a master with epoch {newest}{where}; this one "
                                  f"({r.address}) has epoch {r.epoch}: it was replaced and must not take writes")
            current = self._brokers.get(r.key)
            if r.epoch == newest and newest > 0 and current is not None and current.registration.address != r.address:
                raise FencedError(f"broker {r.broker_name!r} has a master with epoch {newest} at "
                                  f"{current.registration.address}; {r.address} claims the same epoch (two "
                                  f"promotions at once?): refused until that one leaves")
            self._epochs[r.broker_name] = r.epoch
        previous = self._brokers.get(r.key)
        for key, other in list(self._brokers.items()):
            if key != r.key and other.registration.address == r.address:
                del self._brokers[key]  # the address is this broker's now (restarted under a new name)
        self._brokers[r.key] = Registered(r, now_ms, {t.name: t for t in r.topics},
                                          sum(1 for t in r.topics if not is_system_topic(t.name)))
        return previous is None or previous.registration.address != r.address

    def unregister(self, broker_name: str, broker_id: int, address: str) -> bool:
        current = self._brokers.get((broker_name, broker_id))
        if current is None or current.registration.address != address:
            return False
        del self._brokers[(broker_name, broker_id)]
        return True

    def expire(self, now_ms: int) -> list[Registered]:
        """Drop and return the brokers whose last registration is older than the expiry."""
        gone = [b for b in self._brokers.values() if now_ms - b.last_update_ms > self.expiry_ms]
        for b in gone:
            del self._brokers[b.registration.key]
        return gone

    # -- queries -------------------------------------------------------------------------------

    def brokers(self) -> list[Registered]:
        """Every broker, by cluster, name and id."""
        return sorted(self._brokers.values(),
                      key=lambda b: (b.registration.cluster_name, b.registration.broker_name, b.registration.broker_id))

    def route(self, topic: str) -> list[QueueRoute]:
        """The topic's queues per broker name (see the module docstring); NotFoundError when no broker
        serves it."""
        serving: dict[str, Registered] = {}
        for b in self._brokers.values():
            r = b.registration
            if topic in b.topics and (r.broker_name not in serving
                                      or r.broker_id < serving[r.broker_name].registration.broker_id):
                serving[r.broker_name] = b
        if not serving:
            raise NotFoundError(f"topic {topic!r} is not served by any registered broker")
        routes = []
        for name in sorted(serving):
            b = serving[name]
            r, t = b.registration, b.topics[topic]
            routes.append(QueueRoute(name, r.address, t.read_queue_nums, t.write_queue_nums,
                                     readable=t.readable and r.readable,
                                     writable=t.writable and r.writable and r.is_master))
        return routes
