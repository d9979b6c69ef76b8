"""A queue that begins draining while its frame is half consumed leaves no gap for its next owner to read again.

Found in a full suite run: test_consumer_groups' zero-duplicate handover delivered 12 messages twice. The old
owner had consumed offsets 2400-2406 and 2408-2419 of one frame and never 2407: the consume thread that took
2407's batch lost the CPU before its check, another thread ran the rest of the frame, the rebalance drained
the lease meanwhile, and the late check skipped 2407. The final commit stopped at 2407, so the next owner
consumed 2408-2419 again. Driven here step by step on one thread: the batches' order is the threads'.
"""

from __future__ import annotations

import asyncio

import pytest
from consumer_testlib import FakeFetcher, FakeStore, lease, msg

from tidemark.client.consumer.consume_concurrently import ConsumeMessageConcurrentlyService
from tidemark.client.consumer.consume_pool import ConsumeThreadPool
from tidemark.client.message import ConsumeConcurrentlyStatus
from tidemark.client.settings import PushConsumerSettings


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()  # (the pool's; nothing here runs on it)
    yield loop
    loop.close()


def _service(consumed: list[int], store: FakeStore, loop) -> ConsumeMessageConcurrentlyService:
    def listener(msgs, ctx):
        consumed.extend(m.queue_offset for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    pool = ConsumeThreadPool(max_threads=1, name="t", loop=loop)
    return ConsumeMessageConcurrentlyService(
        listener=listener, settings=PushConsumerSettings(group="g"), pool=pool, offset_store=store,
        send_back=None, fetcher=FakeFetcher(), clustering=True, suspended=lambda: False)


def test_a_batch_handed_out_before_the_drain_runs_even_if_it_starts_after_a_later_one_finished(loop):
    consumed, store = [], FakeStore()
    service = _service(consumed, store, loop)
    le = lease()
    msgs = [msg(0), msg(1), msg(2)]
    le.pq.put_messages(msgs)
    le.running += 3  # handed to the pool, a batch each (as submit does)
    service._consume(le, [msgs[0]])()  # (each returns its completion, which the loop runs)
    service._consume(le, [msgs[2]])()
    le.drain()  # the rebalance: the queue goes to another member
    service._consume(le, [msgs[1]])()  # the thread that took it before the drain gets the CPU back
    service.apply_finished()
    assert consumed == [0, 2, 1]
    assert store.offsets[-1] == 3 and le.running == 0  # the final commit covers all three: nothing read twice


def test_a_frame_that_arrives_while_draining_is_left_to_the_next_owner(loop):
    consumed, store = [], FakeStore()
    service = _service(consumed, store, loop)
    le = lease()
    le.drain()
    msgs = [msg(0), msg(1)]
    le.pq.put_messages(msgs)
    service.submit(le, msgs)  # (a frame already on its way when the fetcher stopped the queue)
    assert le.running == 0 and consumed == [] and le.pq.msg_count == 2  # the final commit stops before it
