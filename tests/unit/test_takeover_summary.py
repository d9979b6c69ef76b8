"""The takeover tool's summary (tests/faults/controller.py, `takeovers`): an orderly listener's call is
recorded as its invoke and its end, one delivery; only a value delivered again is a redelivery."""

from __future__ import annotations

from faults.controller import takeovers
from faults.history import Event, Kind, Phase

NEMESIS = ["3.0 kill begin kill 127.0.0.1:5", "3.1 kill end kill 127.0.0.1:5"]


def deliver(phase: Phase, value: str, t: float, group: str = "orderly") -> Event:
    return Event(Kind.DELIVER, phase, f"{group}/0", value=value, time=t, topic="F", broker="broker-a", queue_id=1,
                 offset=0, group=group)


def test_a_call_recorded_as_invoke_and_end_is_one_delivery_and_a_call_again_a_redelivery():
    once = [deliver(Phase.INVOKE, "a", 1.0), deliver(Phase.OK, "a", 1.0), deliver(Phase.OK, "b", 1.1, "push")]
    assert takeovers("kill", once, NEMESIS).redelivered == {}
    again = [*once, deliver(Phase.INVOKE, "a", 5.0), deliver(Phase.OK, "a", 5.0)]
    assert takeovers("kill", again, NEMESIS).redelivered == {"orderly": 1}
    failed_then_retried = [deliver(Phase.INVOKE, "c", 1.0), deliver(Phase.FAIL, "c", 1.0),
                           deliver(Phase.INVOKE, "c", 2.0), deliver(Phase.OK, "c", 2.0)]
    assert takeovers("kill", failed_then_retried, NEMESIS).redelivered == {"orderly": 1}
