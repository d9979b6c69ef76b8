"""Sending a failed message back for retry (client side: CONSUMER_SEND_MSG_BACK, falling back to
a local retry when the broker cannot take it).

First ConsumerSendMsgBack to the broker that stored it; if that fails, a direct
send of a copy to %RETRY%<group> with delay level 3 + reconsume times (the
broker moves it to the DLQ past max reconsume times); if that fails too, the
caller keeps the message for local re-consumption.
"""

from __future__ import annotations

from tidemark.client.errors import TidemarkError
from tidemark.client.message import Message, MessageExt
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.common.logs import get_logger
from tidemark.common.protocol import PropertyKey, retry_topic

log = get_logger("tidemark.client.retry")


class SendBackService:
    def __init__(self, *, cluster: BrokerCluster, group: str, client_id: str, max_reconsume_times: int) -> None:
        self._cluster = cluster
        self._group = group
        self._client_id = client_id
        self.max_reconsume_times = max_reconsume_times
        self.sent_back = 0
        self.fallback_sends = 0
        self.failed = 0

    async def send_back(self, msg: MessageExt, delay_level: int = 0) -> bool:
        """True when the broker has the message for retry (or in the DLQ)."""
        try:
            conn = await self._cluster.connection(msg.broker_name)
            await conn.send_back(self._group, msg, delay_level=delay_level,
                                 max_reconsume_times=self.max_reconsume_times, client_id=self._client_id)
            self.sent_back += 1
            return True
        except TidemarkError as e:
            log.warning("send back failed, sending to retry topic directly",
                        event="send_back_failed", group=self._group, msg_id=msg.msg_id, error=e)
        try:
            await self._send_to_retry_topic(msg, delay_level)
            self.fallback_sends += 1
            return True
        except TidemarkError as e:
            self.failed += 1
            log.warning("retry send failed, consuming again locally",
                        event="retry_send_failed", group=self._group, msg_id=msg.msg_id, error=e)
            return False

    async def _send_to_retry_topic(self, msg: MessageExt, delay_level: int) -> None:
        props = dict(msg.properties)
        # A committed transactional message still carries TRAN_MSG=true, as RocketMQ's does: its copy is
        # a plain retry, not a new half (RocketMQ's sendMessageBack clears it too), which the broker would
        # refuse on a retry topic.
        props.pop(PropertyKey.TRANSACTION_PREPARED, None)
        props.setdefault(PropertyKey.RETRY_TOPIC, msg.topic)
        props[PropertyKey.UNIQ_KEY] = msg.msg_id
        props[PropertyKey.RECONSUME_TIME] = str(msg.reconsume_times + 1)
        if self.max_reconsume_times > 0:
            props[PropertyKey.MAX_RECONSUME_TIMES] = str(self.max_reconsume_times)
        conn = await self._cluster.connection(msg.broker_name)
        info = conn.info if conn.info is not None else await conn.broker_info()
        copy = Message(topic=retry_topic(self._group), body=msg.body, tags=msg.tags, keys=msg.keys,
                       properties=props,
                       delay_level=retry_delay_level(msg.reconsume_times, delay_level, len(info.delay_levels)))
        await conn.send(copy.topic, [copy])


def retry_delay_level(reconsume_times: int, requested: int, levels: int) -> int:
    """The delay level of a retry: the one asked for, else 3 + reconsume times (RocketMQ's rule), capped at
    the broker's own number of levels (a broker configured with fewer would refuse a higher one)."""
    level = requested if requested > 0 else 3 + reconsume_times
    return max(1, min(level, levels))
