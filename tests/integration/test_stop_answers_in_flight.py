"""A master's graceful stop answers the sends it stored and owes an answer, before it cuts its streams.

A stop ends the broker's streams before the server's own stop (services/streams.py), but not all at once:
a send stored under sync replication waits for its replica, so the replica's stream is cut only once
those sends are answered (within the stop's grace). Here the replica is paused while a unary send and a
Produce stream's batch wait for it; the master is stopped; the replica resumes during the stop. Both
sends are answered OK (cut at once, the replica could not acknowledge them and they ended CANCELLED, an
unknown outcome that a non-idempotent sender stores twice), and the Produce stream then ends with
UNAVAILABLE "the broker is stopping".

What is owed may never come (a replica that stays paused): the stop then ends after its one grace
(`stop_grace_ms`), the ordered end of the streams and grpc.aio's own stop together, and says what it cut
(`stop_unsettled`).
"""

from __future__ import annotations

import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from test_sync_replication_refusal import TOPIC, commit_log_end, replica_of, wait_in_sync
from workload import create_topic, wait_until

from tidemark.common.records import RecordBatchBuilder, encode_properties
from tidemark.v1 import common_pb2, messaging_pb2, messaging_pb2_grpc


def stopping(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1).status
        except grpc.RpcError:
            return True
        return status != health_pb2.HealthCheckResponse.SERVING


def produce_request(queue_id: int) -> messaging_pb2.ProduceRequest:
    batch = RecordBatchBuilder(TOPIC, "h")
    batch.append(b"streamed", encode_properties({"UNIQ_KEY": "K1"}))
    return messaging_pb2.ProduceRequest(request_id=1, topic=TOPIC, queue_id=queue_id, count=1,
                                        records=bytes(batch.buffer))


def test_sends_waiting_for_the_replica_at_a_stop_are_answered(broker_factory):
    master = broker_factory("broker-a", args=("--replication", "sync", "--replication-timeout-ms", "20000"))
    replica = replica_of(broker_factory, master)
    create_topic(master.address, TOPIC, 2)
    wait_in_sync(master)
    replica.pause()
    outcome: dict[str, object] = {}
    hold = threading.Event()  # the Produce stream stays open (no half-close) until the end

    def unary() -> None:
        with grpc.insecure_channel(master.address) as channel:
            try:
                messaging_pb2_grpc.MessagingServiceStub(channel).SendMessage(messaging_pb2.SendMessageRequest(
                    topic=TOPIC, queue_id=0, messages=[common_pb2.Message(body=b"unary")]), timeout=30)
                outcome["unary"] = "OK"
            except grpc.RpcError as e:
                outcome["unary"] = f"{e.code().name}: {e.details()}"

    def requests():
        yield produce_request(queue_id=1)
        hold.wait(60)

    def stream() -> None:
        with grpc.insecure_channel(master.address) as channel:
            answers = []
            try:
                for answer in messaging_pb2_grpc.MessagingServiceStub(channel).Produce(requests(), timeout=30):
                    answers.append(answer.code)
                outcome["stream"] = (answers, "ended")
            except grpc.RpcError as e:
                outcome["stream"] = (answers, f"{e.code().name}: {e.details()}")

    senders = [threading.Thread(target=unary, name="the unary send"),
               threading.Thread(target=stream, name="the streamed batch")]
    code: list[int] = []
    stopper = threading.Thread(target=lambda: code.append(master.stop()))
    try:
        for sender in senders:  # one after the other, each stored (readers see neither before the replica)
            end = commit_log_end(master.address)
            sender.start()
            wait_until(lambda end=end: commit_log_end(master.address) > end, 15, f"{sender.name} stored")
        stopper.start()
        wait_until(lambda: stopping(master.address), 15, "the master stopping")
    finally:
        replica.resume()
    for thread in (*senders, stopper):
        thread.join(60)
    hold.set()
    assert code == [0]
    assert outcome["unary"] == "OK"
    assert outcome["stream"] == ([0], "UNAVAILABLE: the broker is stopping")


GRACE_S = 8.0


def test_a_stop_whose_replica_never_acknowledges_ends_within_one_grace(broker_factory):
    """The send waits for the paused replica past the whole stop (replication timeout 60 s): the ordered
    end of the streams waits for it until the grace is over, and grpc.aio's stop then cuts the calls at
    once, having no grace of its own left (before: a second grace, 2 x 8 s, the unary send still waiting).
    The bound is the grace plus 5 s: the defect is a whole second grace, not a speed."""
    master = broker_factory("broker-a", args=("--replication", "sync", "--replication-timeout-ms", "60000",
                                              "--stop-grace-ms", str(int(GRACE_S * 1000))))
    replica = replica_of(broker_factory, master)
    create_topic(master.address, TOPIC, 2)
    wait_in_sync(master)
    replica.pause()
    outcome: list[str] = []

    def unary() -> None:
        with grpc.insecure_channel(master.address) as channel:
            try:
                messaging_pb2_grpc.MessagingServiceStub(channel).SendMessage(messaging_pb2.SendMessageRequest(
                    topic=TOPIC, queue_id=0, messages=[common_pb2.Message(body=b"unary")]), timeout=120)
                outcome.append("OK")
            except grpc.RpcError as e:
                outcome.append(e.code().name)

    sender = threading.Thread(target=unary)
    try:
        end = commit_log_end(master.address)
        sender.start()
        wait_until(lambda: commit_log_end(master.address) > end, 15, "the send stored")
        began = time.monotonic()
        code = master.stop(timeout=60)  # SIGTERM, then until the process exits
        took = time.monotonic() - began
    finally:
        replica.resume()
    sender.join(60)
    assert code == 0
    assert "event=stop_unsettled" in master.log_text()
    assert outcome and outcome != ["OK"]  # never acknowledged: cut at the stop
    assert took < GRACE_S + 5, f"the stop took {took:.1f} s with a grace of {GRACE_S} s"
