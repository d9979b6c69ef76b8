"""The broker-wide read/write permission (RocketMQ's brokerPermission), switchable at runtime."""

from __future__ import annotations

from broker.errors import PermissionDeniedError
from tidemark.logs import get_logger

log = get_logger("tidemark.broker.permission")


class BrokerPermission:
    def __init__(self, broker_name: str, *, readable: bool = True, writable: bool = True) -> None:
        self._broker_name = broker_name
        self.readable = readable
        self.writable = writable

    def update(self, *, readable: bool, writable: bool) -> None:
        self.readable, self.writable = readable, writable
        log.warning("broker permission changed",
                    event="broker_permission", broker=self._broker_name, readable=readable, writable=writable)

    def check_writable(self) -> None:
        if not self.writable:
            raise PermissionDeniedError(f"broker {self._broker_name} is not writable (write permission closed)")

    def check_readable(self) -> None:
        if not self.readable:
            raise PermissionDeniedError(f"broker {self._broker_name} is not readable (read permission closed)")
