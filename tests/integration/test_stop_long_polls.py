"""A broker's stop while consumers long-poll: RocketMQ 5's ReceiveMessage (pop) and PullMessage (answers
streamed by a generator, not a stream that writes: services/streams.py) and Tidemark v1's PullMessage
(unary, with a suspend).

A poll parked at the end of an empty queue, for longer than the stop's grace, is answered at once when
the stop begins, with what it has, nothing (nothing was popped for it); the stop then takes a fraction
of its grace (without the release: the whole grace, then UNAVAILABLE "Cancelling all calls").

A poll that comes while the stop lasts (here: a sync master waiting for its paused replica) is refused
with UNAVAILABLE "the broker is stopping": answered "nothing" at once instead, a client that polls again
as soon as it hears nothing loops on the stopping broker (thousands of polls a second).
"""

from __future__ import annotations

import threading
import time

import grpc
from brokerproc import free_port
from google.protobuf.duration_pb2 import Duration
from rmq5lib import Rmq5Stub, resource
from test_stop_answers_in_flight import stopping
from test_sync_replication_refusal import TOPIC as SYNCED
from test_sync_replication_refusal import commit_log_end, replica_of, wait_in_sync
from workload import create_topic, metric, wait_until

from tidemark.rmq5.v2 import messaging_pb2 as pb
from tidemark.v1 import common_pb2, messaging_pb2, messaging_pb2_grpc

TOPIC = "LongPolls"
GRACE_S = 8.0
POLL_S = 25  # longer than the grace: a poll the stop does not end outlives it
STOPPING = "UNAVAILABLE: the broker is stopping"


class Polls:
    """The three long polls, each on an empty queue of TOPIC; each returns (what it was answered, how the
    call ended)."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._rmq5 = Rmq5Stub(channel)
        self._v1 = messaging_pb2_grpc.MessagingServiceStub(channel)

    @staticmethod
    def _streamed(call) -> tuple[list[str], str]:
        got = []
        try:
            for answer in call:
                got.append(pb.Code.Name(answer.status.code) if answer.HasField("status")
                           else answer.WhichOneof("content"))
            return got, "OK"
        except grpc.RpcError as e:
            return got, f"{e.code().name}: {e.details()}"

    def receive(self) -> tuple[list[str], str]:
        return self._streamed(self._rmq5.ReceiveMessage(pb.ReceiveMessageRequest(
            group=resource("pops"), message_queue=pb.MessageQueue(topic=resource(TOPIC)), batch_size=4,
            invisible_duration=Duration(seconds=30), long_polling_timeout=Duration(seconds=POLL_S)), timeout=60))

    def pull(self) -> tuple[list[str], str]:
        return self._streamed(self._rmq5.PullMessage(pb.PullMessageRequest(
            group=resource("pulls"), message_queue=pb.MessageQueue(topic=resource(TOPIC), id=0), offset=0,
            batch_size=4, filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
            long_polling_timeout=Duration(seconds=POLL_S)), timeout=60))

    def v1_pull(self) -> tuple[list[str], str]:
        try:
            answer = self._v1.PullMessage(messaging_pb2.PullMessageRequest(
                group="v1-pulls", topic=TOPIC, queue_id=0, queue_offset=0, max_msg_nums=4,
                suspend_timeout_ms=POLL_S * 1000), timeout=60)
            return [messaging_pb2.PullStatus.Name(answer.status)], "OK"
        except grpc.RpcError as e:
            return [], f"{e.code().name}: {e.details()}"

    def all(self) -> dict:
        return {"receive": self.receive, "pull": self.pull, "v1_pull": self.v1_pull}


def test_polls_parked_at_a_stop_are_answered_at_once(broker_factory):
    port = free_port()
    broker = broker_factory(args=("--stop-grace-ms", str(int(GRACE_S * 1000)), "--metrics-port", str(port)))
    create_topic(broker.address, TOPIC, 1)
    outcome: dict[str, tuple[list[str], str]] = {}
    with grpc.insecure_channel(broker.address) as channel:
        threads = []

        def parks(name: str, poll) -> None:
            before = metric(port, "tidemark_long_polls_waiting")
            threads.append(threading.Thread(target=lambda: outcome.update({name: poll()})))
            threads[-1].start()
            wait_until(lambda: metric(port, "tidemark_long_polls_waiting") > before, 15, f"the {name} parked")

        for name, poll in Polls(channel).all().items():
            parks(name, poll)
        began = time.monotonic()
        code = broker.stop(timeout=60)  # SIGTERM, then until the process exits
        took = time.monotonic() - began
        for thread in threads:
            thread.join(60)
    assert code == 0
    assert outcome == {"receive": (["MESSAGE_NOT_FOUND", "delivery_timestamp"], "OK"),
                       "pull": (["MESSAGE_NOT_FOUND", "next_offset"], "OK"),
                       "v1_pull": (["NO_NEW_MSG"], "OK")}
    # A bound on a hang (a poll the stop waits for holds it for the whole grace), not a speed.
    assert took < GRACE_S / 2, f"the stop took {took:.1f} s with a grace of {GRACE_S} s"


def test_polls_that_come_while_a_stop_lasts_are_refused(broker_factory):
    master = broker_factory("broker-a", args=("--replication", "sync", "--replication-timeout-ms", "60000",
                                              "--stop-grace-ms", str(int(GRACE_S * 1000))))
    replica = replica_of(broker_factory, master)
    create_topic(master.address, SYNCED, 1)
    create_topic(master.address, TOPIC, 1)
    wait_in_sync(master)
    replica.pause()
    code: list[int] = []
    stopper = threading.Thread(target=lambda: code.append(master.stop(timeout=60)))
    channel = grpc.insecure_channel(master.address)
    try:
        end = commit_log_end(master.address)

        def send() -> None:
            try:
                messaging_pb2_grpc.MessagingServiceStub(channel).SendMessage(messaging_pb2.SendMessageRequest(
                    topic=SYNCED, queue_id=0, messages=[common_pb2.Message(body=b"held")]), timeout=60)
            except grpc.RpcError:
                pass  # (its outcome is test_stop_answers_in_flight's)

        sender = threading.Thread(target=send)
        sender.start()  # stored, and waiting for the paused replica: the stop waits for its answer
        wait_until(lambda: commit_log_end(master.address) > end, 15, "the send stored")
        stopper.start()
        wait_until(lambda: stopping(master.address), 15, "the master stopping")
        outcome = {name: poll() for name, poll in Polls(channel).all().items()}
    finally:
        replica.resume()
    stopper.join(60)
    sender.join(60)
    channel.close()
    assert code == [0]
    assert outcome == {name: ([], STOPPING) for name in ("receive", "pull", "v1_pull")}
