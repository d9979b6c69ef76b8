"""The consume services' collaborators for unit tests without a broker: one queue, its messages and
leases, and stand-ins for the fetcher (credit grants), the send-back service and the offset store."""

from __future__ import annotations

from tidemark.client.consumer.lease import QueueLease
from tidemark.client.message import MessageExt, MessageQueue

MQ = MessageQueue("T", "broker-a", 0)


def msg(offset: int, body: bytes = b"x") -> MessageExt:
    return MessageExt("T", "broker-a", 0, offset, f"id{offset}", body, store_size=10)


def lease(start: int = 0, epoch: int | None = 7) -> QueueLease:
    return QueueLease(MQ, client_id="c1", owner_epoch=epoch, reset_generation=0, start_offset=start)


class FakeFetcher:
    def __init__(self) -> None:
        self.granted: list[tuple[int, int]] = []

    def grant(self, lease, messages: int, nbytes: int) -> None:
        self.granted.append((messages, nbytes))


class FakeSendBack:
    def __init__(self, ok: bool = True) -> None:
        self.ok = ok
        self.sent: list[int] = []

    async def send_back(self, m: MessageExt, delay_level: int = 0) -> bool:
        self.sent.append(m.queue_offset)
        return self.ok


class FakeStore:
    def __init__(self) -> None:
        self.offsets: list[int] = []

    def update_offset(self, mq, offset: int, increase_only: bool) -> None:
        self.offsets.append(offset)
