"""PullMessageService: one pull loop per owned queue (RocketMQ's pullMessage + PullCallback).

The loop continues from the broker's next_begin_offset (never from the
committed offset), long-polls at the end of the queue, pauses when the
ProcessQueue holds too much (flow control), piggybacks the queue's commit with
its fence, and reacts to OFFSET_ILLEGAL, OFFSET_RESET and a lost lock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from client.consumer.offset_store import OffsetStore, RemoteBrokerOffsetStore
from client.consumer.queue_state import OwnedQueue
from client.errors import FencedError, NotFoundError, TidemarkError
from client.message import MessageExt, PullStatus
from client.remoting.cluster import BrokerCluster
from client.settings import ConsumerSettings
from client.types import OffsetCommit
from tidemark.protocol import parse_tag_expression

log = logging.getLogger("tidemark.client.pull")

FLOW_CONTROL_DELAY_S = 0.05
EXCEPTION_DELAY_S = 3.0

Dispatch = Callable[[OwnedQueue, list[MessageExt]], None]
Lose = Callable[[OwnedQueue, str], Awaitable[None]]


class PullMessageService:
    def __init__(self, *, cluster: BrokerCluster, settings: ConsumerSettings, client_id: str,
                 offset_store: OffsetStore, subscription: Callable[[str], str], dispatch: Dispatch, lose: Lose,
                 max_span: int | None, piggyback_commit: bool = True,
                 suspended: Callable[[], bool] = lambda: False) -> None:
        self._cluster = cluster
        self._settings = settings
        self._client_id = client_id
        self._store = offset_store
        self._subscription = subscription
        self._dispatch = dispatch
        self._lose = lose
        self._max_span = max_span
        self._suspended = suspended
        # The push consumer piggybacks its commit on pulls (RocketMQ's commitOffset); the lite pull
        # consumer commits only when the application (or auto commit) says so.
        self._piggyback = piggyback_commit and isinstance(offset_store, RemoteBrokerOffsetStore)
        self.flow_control_times = 0

    def start(self, oq: OwnedQueue) -> asyncio.Task:
        return asyncio.get_running_loop().create_task(self._run(oq), name=f"pull:{oq.mq}")

    def _flow_controlled(self, oq: OwnedQueue) -> bool:
        if self._suspended():
            return True
        s, pq = self._settings, oq.pq
        if pq.msg_count > s.pull_threshold_for_queue or pq.msg_size > s.pull_threshold_size_for_queue:
            return True
        return self._max_span is not None and pq.max_span() > self._max_span

    def _fence(self, oq: OwnedQueue) -> OffsetCommit:
        return OffsetCommit(self._settings.group, oq.mq, 0, client_id=self._client_id,
                            owner_epoch=oq.owner_epoch, reset_generation=oq.reset_generation)

    async def _run(self, oq: OwnedQueue) -> None:
        s = self._settings
        mq = oq.mq
        while oq.pulling:
            if self._flow_controlled(oq):
                self.flow_control_times += 1
                await asyncio.sleep(FLOW_CONTROL_DELAY_S)
                continue
            commit = self._store.commit_for(mq) if self._piggyback else None
            expression = self._subscription(mq.topic)
            try:
                conn = await self._cluster.connection(mq.broker_name)
                result = await conn.pull(s.group, mq, oq.next_offset, max_nums=s.pull_batch_size,
                                         suspend_ms=s.broker_suspend_max_time_ms, subscription=expression,
                                         commit=commit, fence=self._fence(oq))
            except FencedError as e:
                await self._lose(oq, f"pull fenced: {e}")
                return
            except NotFoundError as e:
                log.warning("pull target gone event=pull_not_found queue=%s error=%s", mq, e)
                await asyncio.sleep(EXCEPTION_DELAY_S)
                continue
            except TidemarkError as e:
                log.warning("pull failed event=pull_failed queue=%s offset=%d error=%s", mq, oq.next_offset, e)
                await asyncio.sleep(EXCEPTION_DELAY_S)
                continue
            if not oq.pulling:
                return
            self._handle(oq, result, expression)

    def _handle(self, oq: OwnedQueue, result, expression: str) -> None:
        mq = oq.mq
        status = result.status
        if status is PullStatus.FOUND:
            oq.next_offset = result.next_begin_offset
            tags = parse_tag_expression(expression)
            msgs = [m for m in result.messages if tags.matches_tag(m.tags)]
            if msgs:
                oq.pq.put_messages(msgs)
                self._dispatch(oq, msgs)
            elif oq.pq.msg_count == 0:
                self._store.update_offset(mq, result.next_begin_offset, increase_only=True)
        elif status in (PullStatus.NO_NEW_MSG, PullStatus.NO_MATCHED_MSG):
            oq.next_offset = result.next_begin_offset
            if oq.pq.msg_count == 0 and status is PullStatus.NO_MATCHED_MSG:
                # RocketMQ's correctTagsOffset: skipped messages count as consumed when nothing is cached.
                self._store.update_offset(mq, result.next_begin_offset, increase_only=True)
        elif status is PullStatus.OFFSET_ILLEGAL:
            log.warning("pull offset illegal event=offset_illegal queue=%s offset=%d next=%d min=%d max=%d",
                        mq, oq.next_offset, result.next_begin_offset, result.min_offset, result.max_offset)
            self._restart_at(oq, result.next_begin_offset)
        elif status is PullStatus.OFFSET_RESET:
            log.info("offset reset by admin event=offset_reset_seen queue=%s offset=%d generation=%d",
                     mq, result.next_begin_offset, result.reset_generation)
            oq.reset_generation = result.reset_generation
            self._restart_at(oq, result.next_begin_offset)

    def _restart_at(self, oq: OwnedQueue, offset: int) -> None:
        """Forget cached messages and continue from offset; results of batches in flight are ignored."""
        oq.pq.clear()
        oq.epoch_of_cache += 1
        oq.next_offset = offset
        self._store.update_offset(oq.mq, offset, increase_only=False)
        self._store.set_fence(oq.mq, owner_epoch=oq.owner_epoch, reset_generation=oq.reset_generation)
