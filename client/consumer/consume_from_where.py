"""computePullFromWhere (RocketMQ's rule): where a consumer starts on a queue it has just been given.

The group's committed offset always wins when there is one (>= 0); only a
queue without one (-1) uses consume_from_where. Retry topics are special:
LAST_OFFSET starts them at 0 (every retry must be seen) and TIMESTAMP at the
max offset.
"""

from __future__ import annotations

from tidemark.client.consumer.offset_store import OffsetStore, ReadOffsetType
from tidemark.client.message import ConsumeFromWhere, MessageQueue
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.common.protocol import is_retry_topic


async def compute_pull_from_where(mq: MessageQueue, *, where: ConsumeFromWhere, consume_timestamp_ms: int,
                                  offset_store: OffsetStore, cluster: BrokerCluster,
                                  committed: int | None = None) -> int:
    """`committed`: the group's offset when the caller read it already (a lock grant carries it)."""
    last = committed if committed is not None else await offset_store.read_offset(mq, ReadOffsetType.READ_FROM_STORE)
    if last >= 0:
        return last
    if where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
        return 0
    conn = await cluster.connection(mq.broker_name)
    if where is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET:
        return 0 if is_retry_topic(mq.topic) else await conn.max_offset(mq)
    if is_retry_topic(mq.topic):
        return await conn.max_offset(mq)
    return await conn.search_offset(mq, consume_timestamp_ms)
