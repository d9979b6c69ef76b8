"""The history checker (tests/faults/checker.py): a faithful run passes; each kind of broken promise is
counted exactly, whichever run it is planted in."""

from __future__ import annotations

import random

from faults.checker import Expect, check
from faults.history import Event, History, Kind, Phase
from hypothesis import given, settings
from hypothesis import strategies as st

TOPIC, BROKER = "T", "broker-a"


def run(seed: int, sends: int, queues: int = 3):
    """A faithful random run: (history events, read-back, values acked, values unknown-and-stored).

    Every acknowledged send is stored once where its acknowledgement says; definite failures are not
    stored; unknown outcomes are stored or not; a consumer group delivers every stored value in queue
    order in listener calls that begin when the last one ended (with some redeliveries, by another
    member after the first's call) and its committed offsets only grow."""
    rnd = random.Random(seed)
    h = History()
    stored: dict = {(TOPIC, BROKER, q): [] for q in range(queues)}
    acked, recovered = [], []
    for i in range(sends):
        value = f"v{i}"
        process = f"p{rnd.randrange(3)}"
        h.invoke_send(process, value, TOPIC)
        fate = rnd.random()
        q = (TOPIC, BROKER, rnd.randrange(queues))
        if fate < 0.7:
            offset = len(stored[q])
            stored[q].append((offset, value))
            h.send_ok(process, value, q, offset)
            acked.append(value)
        elif fate < 0.8:
            h.send_failed(process, value, TOPIC, ValueError("bad"), definite=True)
        else:
            if rnd.random() < 0.5:
                stored[q].append((len(stored[q]), value))
                recovered.append(value)
            h.send_failed(process, value, TOPIC, TimeoutError("timed out"), definite=False)
    for q, entries in stored.items():
        committed = 0
        for offset, value in entries:
            h.call_started("c0", "g", value, q, offset)
            h.delivered("c0", "g", value, q, offset)
            if rnd.random() < 0.1:
                h.call_started("c1", "g", value, q, offset)  # a redelivery, once c0's call has ended
                h.delivered("c1", "g", value, q, offset)
            if rnd.random() < 0.3:
                committed = offset + 1
                h.offset_seen("observer", "g", q, committed)
    return h.events(), stored, acked, recovered


EXPECT = Expect(no_loss=True, no_duplicates=True, orderly_groups=frozenset({"g"}),
                drained={"g": frozenset({TOPIC})})

runs = st.tuples(st.integers(0, 2**32), st.integers(1, 120))


@settings(max_examples=60, deadline=None)
@given(runs)
def test_a_faithful_run_breaks_no_promise(params):
    events, stored, acked, recovered = run(*params)
    report = check(events, stored, EXPECT)
    assert report.violations(EXPECT) == []
    assert report.acknowledged == len(acked)
    assert report.recovered.n == len(recovered)
    assert report.stored == len(acked) + len(recovered)


@settings(max_examples=60, deadline=None)
@given(runs, st.randoms())
def test_an_acknowledged_message_missing_is_lost_not_misplaced(params, rnd):
    events, stored, acked, _ = run(*params)
    if not acked:
        return
    victim = rnd.choice(acked)
    for q, entries in stored.items():
        stored[q] = [(o, v) for o, v in entries if v != victim]
    report = check(events, stored, EXPECT)
    assert report.lost.n == 1 and victim in report.lost.examples[0]
    assert report.misplaced.n == 0
    assert report.undelivered.n == 0  # the group got it before it went missing from the read-back
    assert any(v.startswith("lost") for v in report.violations(EXPECT))
    assert not any(v.startswith("lost") for v in report.violations(Expect(no_loss=False)))


def test_a_send_stored_after_the_drain_is_recovered_not_undelivered():
    """A request the network held back (TCP retransmits it after a partition heals) is stored after the
    groups drained: it counts as a recovered unknown outcome, and only what the drain waited for must
    have been delivered."""
    events, stored, _, _ = run(7, 40)
    h = History(events)
    h.invoke_send("p0", "late", TOPIC)
    h.send_failed("p0", "late", TOPIC, TimeoutError("no answer"), definite=False)
    drained = {q: list(entries) for q, entries in stored.items()}
    q = (TOPIC, BROKER, 1)
    final = {**drained, q: [*drained[q], (len(drained[q]), "late")]}
    report = check(h.events(), final, EXPECT, drained_stored=drained)
    assert report.violations(EXPECT) == [] and "late" in " ".join(report.recovered.examples)
    # Stored before the drain ended and never delivered: the group is stuck, whichever read-back judged.
    report = check(h.events(), final, EXPECT, drained_stored=final)
    assert report.undelivered.n == 1 and "never got late" in report.undelivered.examples[0]
    assert [v.split(":")[0] for v in report.violations(EXPECT)] == ["undelivered"]


@settings(max_examples=60, deadline=None)
@given(runs, st.randoms(), st.integers(1, 3))
def test_extra_copies_are_duplicates(params, rnd, extra):
    events, stored, acked, _ = run(*params)
    if not acked:
        return
    value = rnd.choice(acked)
    q = (TOPIC, BROKER, 0)
    for _ in range(extra):
        stored[q].append((len(stored[q]), value))
    report = check(events, stored, EXPECT)
    assert report.duplicated.n == extra
    assert report.lost.n == report.misplaced.n == 0
    assert [v.split(":")[0] for v in report.violations(EXPECT)] == ["duplicated"]
    assert report.violations(Expect(no_duplicates=False)) == []


def test_the_sequence_reuse_bug_is_lost():
    """The defect the proxy found: a failed send's batch was stored; the next batch reused its sequence
    and was acknowledged with the first batch's offset, holding the other message."""
    h = History()
    q = (TOPIC, BROKER, 0)
    h.invoke_send("p", "a", TOPIC)
    h.send_failed("p", "a", TOPIC, RuntimeError("Internal error from Core"), definite=False)
    h.invoke_send("p", "b", TOPIC)
    h.send_ok("p", "b", q, 0)
    report = check(h.events(), {q: [(0, "a")]}, Expect())
    assert report.lost.n == 1 and report.recovered.n == 1 and report.misplaced.n == 0
    assert report.violations(Expect()) and not report.violations(Expect(no_loss=False))


@settings(max_examples=60, deadline=None)
@given(runs, st.randoms())
def test_an_acknowledgement_naming_the_wrong_place_is_misplaced_in_every_mode(params, rnd):
    events, stored, acked, _ = run(*params)
    if len(acked) < 2:
        return
    a, b = rnd.sample(acked, 2)
    for q, entries in stored.items():  # the two messages swap places
        stored[q] = [(o, b if v == a else a if v == b else v) for o, v in entries]
    report = check(events, stored, Expect(no_loss=False))
    assert report.misplaced.n == 2 and report.lost.n == 0
    assert [v.split(":")[0] for v in report.violations(Expect(no_loss=False))] == ["misplaced"]


def test_a_refused_send_that_was_stored_is_a_violation_in_every_mode():
    h = History()
    q = (TOPIC, BROKER, 0)
    h.invoke_send("p", "a", TOPIC)
    h.send_failed("p", "a", TOPIC, RuntimeError("no in-sync replica"), definite=True)
    report = check(h.events(), {q: [(0, "a")]}, Expect())
    assert report.refused_stored.n == 1
    assert report.violations(Expect(no_loss=False)) != []


def test_values_nobody_sent_are_unexpected():
    h = History()
    q = (TOPIC, BROKER, 0)
    h.invoke_send("p", "a", TOPIC)
    h.send_ok("p", "a", q, 0)
    h.delivered("c", "g", "ghost", q, 7)
    report = check(h.events(), {q: [(0, "a"), (1, "stray")]}, Expect())
    assert report.unexpected.n == 2


@settings(max_examples=60, deadline=None)
@given(runs, st.randoms())
def test_an_offset_observed_lower_than_before_moved_backwards(params, rnd):
    events, stored, _, _ = run(*params)
    offsets = [e for e in events if e.kind is Kind.OFFSET and e.offset > 0]
    if not offsets:
        return
    late = rnd.choice(offsets)
    events.append(Event(Kind.OFFSET, Phase.OK, "observer", time=events[-1].time + 1, topic=late.topic,
                        broker=late.broker, queue_id=late.queue_id, offset=late.offset - 1, group="g"))
    report = check(events, stored, EXPECT)
    assert report.offsets_backwards.n >= 1


def test_orderly_first_deliveries_must_follow_queue_order():
    h = History()
    q = (TOPIC, BROKER, 0)
    for i, v in enumerate("abc"):
        h.invoke_send("p", v, TOPIC)
        h.send_ok("p", v, q, i)
    stored = {q: [(0, "a"), (1, "b"), (2, "c")]}
    for v, o in (("a", 0), ("b", 1), ("a", 0), ("c", 2)):  # a redelivery of a is no disorder
        h.delivered("c", "g", v, q, o)
    assert check(h.events(), stored, Expect(orderly_groups=frozenset({"g"}))).order.n == 0
    h2 = History(e for e in h.events() if e.kind is Kind.SEND)
    for v, o in (("a", 0), ("c", 2), ("b", 1)):
        h2.delivered("c", "g", v, q, o)
    assert check(h2.events(), stored, Expect(orderly_groups=frozenset({"g"}))).order.n == 1
    assert check(h2.events(), stored, Expect()).order.n == 0  # a concurrent group promises no order


def _calls(spans):
    """Orderly listener calls of queue 0 of group g: (process, start, end) each, one message each."""
    q = (TOPIC, BROKER, 0)
    events = [Event(Kind.SEND, Phase.INVOKE, "p", value="a", topic=TOPIC),
              Event(Kind.SEND, Phase.OK, "p", value="a", topic=TOPIC, broker=BROKER, queue_id=0, offset=0)]
    for process, start, end in spans:
        events += [Event(Kind.DELIVER, Phase.INVOKE, process, value="a", time=start, group="g", topic=TOPIC,
                         broker=BROKER, queue_id=0, offset=0),
                   Event(Kind.DELIVER, Phase.OK, process, value="a", time=end, group="g", topic=TOPIC,
                         broker=BROKER, queue_id=0, offset=0)]
    return events, {q: [(0, "a")]}


def test_two_members_calling_a_listener_with_one_queue_at_once_is_an_overlap():
    orderly = Expect(orderly_groups=frozenset({"g"}))
    events, stored = _calls([("c0", 1.0, 1.2), ("c1", 1.1, 1.3), ("c0", 1.4, 1.5), ("c1", 1.5, 1.6)])
    report = check(events, stored, orderly)
    assert report.overlap.n == 1 and report.violations(orderly)  # (1.1 < 1.2; 1.5 is not before 1.5)
    assert report.delivered == 4  # a call's start is no delivery
    events, stored = _calls([("c0", 1.0, 1.2), ("c0", 1.2, 1.3), ("c1", 1.3, 1.4)])
    assert check(events, stored, orderly).overlap.n == 0  # one member's calls after one another
    events, stored = _calls([("c0", 1.0, 1.2), ("c1", 1.1, 1.3)])
    assert check(events, stored, Expect()).overlap.n == 0  # a concurrent group promises no exclusivity


def test_fifo_keys_are_stored_in_acknowledgement_order():
    h = History()
    q = (TOPIC, BROKER, 0)
    for v, o in (("a", 1), ("b", 0)):
        h.invoke_send("p", v, TOPIC, key="k")
        h.send_ok("p", v, q, o, key="k")
    report = check(h.events(), {q: [(0, "b"), (1, "a")]}, Expect(fifo=True))
    assert report.order.n == 1 and report.violations(Expect(fifo=True))


def test_the_longest_window_without_an_acknowledgement():
    events = []
    for t, phase in ((0.0, Phase.INVOKE), (1.0, Phase.OK), (1.5, Phase.INVOKE), (6.0, Phase.OK),
                     (6.1, Phase.INVOKE), (7.0, Phase.OK)):
        events.append(Event(Kind.SEND, phase, "p", value=f"v{int(t)}", time=t, topic=TOPIC, broker=BROKER,
                            queue_id=0, offset=-1))
    report = check(events, {}, Expect(no_loss=False))
    assert report.send_gap_s == 5.0


def test_a_history_survives_its_file(tmp_path):
    events, stored, _, _ = run(7, 50)
    h = History(events)
    h.dump(tmp_path / "h.jsonl")
    again = History.load(tmp_path / "h.jsonl").events()
    assert again == events
    assert check(again, stored, EXPECT).row() == check(events, stored, EXPECT).row()
