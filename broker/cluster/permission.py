"""The broker-wide read/write permission (RocketMQ's brokerPermission), switchable at runtime."""

from __future__ import annotations

from collections.abc import Callable

from tidemark.broker.errors import NotCurrentError, PermissionDeniedError
from tidemark.common.logs import get_logger

log = get_logger("tidemark.broker.cluster.permission")


class BrokerPermission:
    def __init__(self, broker_name: str, *, readable: bool = True, writable: bool = True,
                 replica_of: str = "") -> None:
        self._broker_name = broker_name
        self.readable = readable
        # A replica takes no writes: they go to its master (RocketMQ's slave is read-only too).
        self.replica_of = replica_of
        self.fenced = ""  # why this master was replaced (a name server or etcd said so): no writes, for good
        # Controller mode: the replica this master is handing its mastership to (broker/cluster/switchover.py):
        # no writes while it catches up, then either fenced (handed over) or writable again (given up).
        self.handing_over = ""
        self._writable = writable and not replica_of
        # Controller mode: whether the master's lease in etcd is certainly still this broker's, asked on
        # every write (a master resumed after a pause refuses writes before any timer of it runs); writes
        # wait while it is uncertain and go on once a renewal is answered.
        self.lease_valid: Callable[[], bool] = lambda: True

    @property
    def writable(self) -> bool:
        return self._writable and not self.handing_over and self.lease_valid()

    @writable.setter
    def writable(self, value: bool) -> None:
        self._writable = value

    def update(self, *, readable: bool, writable: bool) -> None:
        self.readable, self.writable = readable, writable and not self.replica_of and not self.fenced
        log.warning("broker permission changed",
                    event="broker_permission", broker=self._broker_name, readable=readable, writable=writable)

    def follow(self, master: str) -> None:
        """A replica copying another master from now on: writes go there."""
        if self.replica_of:
            self.replica_of = master

    def promote(self) -> None:
        """The replica became the master of its name: writes are its own now."""
        self.replica_of = ""
        self.writable = not self.fenced

    def fence(self, why: str) -> None:
        """A name server says a newer master serves this name: take no more writes."""
        if not self.fenced:
            log.error("broker fenced, writes refused from now on: %s", why, event="broker_fenced",
                      broker=self._broker_name)
        self.fenced, self.writable = why, False

    def check_writable(self) -> None:
        """PermissionDeniedError while writes are closed here for good (a replica, the write permission);
        NotCurrentError (retriable: the client asks the name server again) while this master may have been
        replaced, fenced or unsure of its lease: what Kafka's NOT_LEADER_OR_FOLLOWER is to its producers."""
        if self.fenced:
            raise NotCurrentError(f"broker {self._broker_name} here is fenced: {self.fenced}; writes go to the "
                                  f"master the name server names")
        if self.replica_of:
            raise PermissionDeniedError(f"broker {self._broker_name} here is a replica; writes go to its master "
                                        f"{self.replica_of}")
        if self.handing_over:
            raise NotCurrentError(f"broker {self._broker_name} here is handing its mastership to {self.handing_over} "
                                  f"(a planned switchover); writes go to the master the name server names next")
        if not self.lease_valid():
            raise NotCurrentError(f"broker {self._broker_name} here cannot confirm its master lease in etcd "
                                  f"right now; writes wait until it can, or go to the master etcd elects")
        if not self._writable:
            raise PermissionDeniedError(f"broker {self._broker_name} is not writable (write permission closed)")

    @property
    def stale(self) -> str:
        """Why this master may have been replaced ("" while it certainly has not): fenced, or its lease in
        etcd uncertain. A stale master keeps what only the master may change (offsets) as it is, and bounds
        reads at what its replicas hold, so nobody sees state the next master will not have."""
        if self.fenced:
            return f"fenced: {self.fenced}"
        if self.handing_over:
            return f"it is handing its mastership to {self.handing_over}"
        if not self.lease_valid():
            return "it cannot confirm its master lease in etcd right now"
        return ""

    def check_current(self) -> None:
        """NotCurrentError while `stale`."""
        why = self.stale
        if why:
            raise NotCurrentError(f"broker {self._broker_name} here may no longer be the master ({why}); "
                                   f"commit to the master the name server names")

    def check_readable(self) -> None:
        if not self.readable:
            raise PermissionDeniedError(f"broker {self._broker_name} is not readable (read permission closed)")
