"""The broker keeps what it holds once it serves out of the garbage collector's full passes (app.py,
_freeze_heap): a full pass over grpc's, protobuf's and the broker's own objects held its loop 13-17 ms at
a time under load."""

from __future__ import annotations

import re

from brokerproc import BrokerProcess
from workload import wait_until

FROZEN = re.compile(r"event=heap_frozen.*?objects=(\d+)")


def test_a_serving_broker_freezes_its_heap_once(broker: BrokerProcess) -> None:
    wait_until(lambda: FROZEN.search(broker.log_text()) is not None, 30, "the broker's heap_frozen event",
               details=lambda: broker.log_text()[-2000:])
    frozen = [int(n) for n in FROZEN.findall(broker.log_text())]
    assert len(frozen) == 1
    assert frozen[0] > 10_000  # the modules alone are tens of thousands of objects
