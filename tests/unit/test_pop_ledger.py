"""PopLedger: pop, ack, change, revive, FIFO redelivery, renewal, reset, and their invariants.

The property test runs random operations against the ledger and against a
plain model that stores every offset's status explicitly (the ledger stores
only what is unfinished), and checks after every step that the two agree,
that the watermark never moves back, and that replaying the emitted events
gives the live state.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tidemark.broker.pop.handles import HandleFields, QueueKey, StaleReceiptHandleError
from tidemark.broker.pop.ledger import (
    Acked,
    Changed,
    Pending,
    PopLedger,
    Popped,
    PopSettings,
    PopStateError,
    Renewed,
    Reset,
)

K = QueueKey("g", "T", 0)
MIN = 60_000


def ledger_with(*, start=0, cap=100, events=None, **kw) -> PopLedger:
    sink = events.extend if events is not None else None
    ledger = PopLedger(PopSettings(max_inflight_per_queue=cap, **kw), sink=sink)
    ledger.ensure_queue(K, start)
    return ledger


def pop(ledger, offsets, next_cursor, *, now=0, invisible=MIN, client="c1", auto_renew=False, attempt=1):
    return ledger.pop(K, [(o, attempt) for o in offsets], next_cursor, now_ms=now, invisible_ms=invisible,
                      client_id=client, auto_renew=auto_renew)


def replayed(events, settings=None) -> PopLedger:
    again = PopLedger(settings)
    assert all(again.apply(e) for e in events)
    return again


# -- watermark ------------------------------------------------------------------------------------


def test_the_watermark_waits_for_the_slowest_message():
    ledger = ledger_with(start=100)
    r = pop(ledger, [100, 101, 102], 103)
    assert [h.offset for h in r.handles] == [100, 101, 102] and r.watermark is None
    assert ledger.ack(r.handles[2]) is None and ledger.ack(r.handles[1]) is None
    assert ledger.watermark(K) == 100
    assert ledger.ack(r.handles[0]) == 103


def test_filtered_offsets_are_done_at_once_and_cost_nothing():
    ledger = ledger_with()
    r = pop(ledger, [10**9], 10**9 + 1)  # a tag filter skipped a billion offsets
    assert r.watermark == 10**9
    assert ledger.ack(r.handles[0]) == 10**9 + 1
    assert pop(ledger, [], 2 * 10**9).watermark == 2 * 10**9


def test_a_pop_that_hands_out_nothing_and_skips_nothing_changes_nothing():
    events = []
    ledger = ledger_with(start=5, events=events)
    assert pop(ledger, [], 5) == pop(ledger, [], 5)
    assert pop(ledger, [], 5).handles == () and len(events) == 1  # only the ensure_queue Reset


def test_pop_ids_increase_and_every_handle_names_its_delivery():
    ledger = ledger_with()
    a = pop(ledger, [0, 1], 2).handles
    b = pop(ledger, [3], 4, attempt=2).handles
    assert [h.pop_id for h in a + b] == sorted({h.pop_id for h in a + b})
    assert b[0] == HandleFields("g", "T", 0, 3, b[0].pop_id, 2)


# -- stale handles ----------------------------------------------------------------------------------


def test_ack_twice_is_stale():
    ledger = ledger_with()
    (h,) = pop(ledger, [0], 1).handles
    ledger.ack(h)
    with pytest.raises(StaleReceiptHandleError, match="already acked"):
        ledger.ack(h)


def test_change_invisible_makes_a_new_handle_and_the_old_one_stale():
    ledger = ledger_with()
    (h,) = pop(ledger, [0], 1, now=0, invisible=MIN).handles
    new = ledger.change_invisible(h, now_ms=1000, invisible_ms=5000)
    assert new.pop_id > h.pop_id and (new.offset, new.attempt) == (h.offset, h.attempt)
    assert ledger.inflight(K)[0].deadline_ms == 6000
    with pytest.raises(StaleReceiptHandleError, match="superseded"):
        ledger.ack(h)
    assert ledger.ack(new) == 1


def test_an_ack_after_the_deadline_but_before_revive_counts_and_after_revive_is_stale():
    ledger = ledger_with()
    a, b = pop(ledger, [0, 1], 2, now=0, invisible=1000).handles
    assert [e.offset for e in ledger.expired(1000)] == [0, 1]
    ledger.ack(a)  # late, but nobody revived it yet
    (exp,) = ledger.expired(1000)
    assert ledger.revived(exp.key, exp.offset, exp.entry.pop_id) == 2
    with pytest.raises(StaleReceiptHandleError):
        ledger.ack(b)


def test_a_handle_of_a_reset_or_dropped_queue_is_stale():
    ledger = ledger_with()
    (h,) = pop(ledger, [0], 1).handles
    ledger.reset(K, 0)
    with pytest.raises(StaleReceiptHandleError):
        ledger.ack(h)
    (h2,) = pop(ledger, [0], 1).handles  # the same offset again, a new delivery
    assert h2.pop_id != h.pop_id
    assert ledger.drop(K) and not ledger.drop(K)
    with pytest.raises(StaleReceiptHandleError, match="reset or removed"):
        ledger.ack(h2)


def test_revive_after_an_ack_is_refused_so_the_service_can_skip_it():
    ledger = ledger_with()
    (h,) = pop(ledger, [0], 1, invisible=0).handles
    (exp,) = ledger.expired(0)
    ledger.ack(h)
    with pytest.raises(StaleReceiptHandleError):
        ledger.revived(K, 0, exp.entry.pop_id)


# -- expiry, FIFO ---------------------------------------------------------------------------------------


def test_expired_entries_come_earliest_first_and_stay_until_revived():
    ledger = ledger_with()
    pop(ledger, [0], 1, now=0, invisible=3000)
    pop(ledger, [1], 2, now=0, invisible=1000)
    pop(ledger, [2], 3, now=0, invisible=2000)
    assert ledger.next_deadline() == 1000
    assert [e.offset for e in ledger.expired(2500)] == [1, 2]
    assert [e.offset for e in ledger.expired(2500, limit=1)] == [1]
    assert [e.offset for e in ledger.expired(2500)] == [1, 2]  # asking again changes nothing
    for e in ledger.expired(2500):
        ledger.revived(e.key, e.offset, e.entry.pop_id)
    assert [e.offset for e in ledger.expired(10_000)] == [0]
    assert ledger.watermark(K) == 0


def test_fifo_expiry_redelivers_in_place_before_the_cursor():
    ledger = ledger_with()
    first = pop(ledger, [0, 1], 2, invisible=1000).handles
    ledger.ack(first[0])
    (exp,) = ledger.expired(1000)
    assert ledger.redeliver_in_place(K, 1, exp.entry.pop_id) == Pending(1, 2, exp.entry.pop_id)
    assert ledger.fifo_ready(K, 9) == ledger.pending(K) == [Pending(1, 2, exp.entry.pop_id)]
    assert ledger.watermark(K) == 1 and ledger.expired(10**6) == []
    with pytest.raises(StaleReceiptHandleError, match="redelivered"):
        ledger.ack(first[1])
    with pytest.raises(ValueError, match="attempt 2"):
        ledger.pop(K, [(1, 1)], 2, now_ms=0, invisible_ms=1, client_id="c")
    (again,) = ledger.pop(K, [(1, 2)], 2, now_ms=2000, invisible_ms=1000, client_id="c").handles
    assert (again.offset, again.attempt) == (1, 2) and ledger.pending(K) == []
    assert ledger.ack(again) == 2


def test_a_pending_redelivery_can_go_to_the_dlq_instead():
    ledger = ledger_with()
    pop(ledger, [0], 1, invisible=0)
    (exp,) = ledger.expired(0)
    pending = ledger.redeliver_in_place(K, 0, exp.entry.pop_id)
    assert ledger.revived(K, 0, pending.pop_id) == 1


# -- cap, validation, sink ------------------------------------------------------------------------------


def test_a_full_queue_hands_out_fewer_and_keeps_the_rest_at_the_cursor():
    ledger = ledger_with(cap=3)
    r = pop(ledger, [0, 2, 4, 6], 8)
    assert [h.offset for h in r.handles] == [0, 2, 4] and r.next_cursor == 6
    assert ledger.cursor(K) == 6 and ledger.room(K) == 0
    assert pop(ledger, [6], 7).handles == ()
    ledger.ack(r.handles[0])
    assert [h.offset for h in pop(ledger, [6, 7], 8).handles] == [6]


@pytest.mark.parametrize("taken, next_cursor, match", [
    ([(1, 1), (0, 1)], 5, "increase"),
    ([(0, 1), (0, 1)], 5, "increase"),
    ([(5, 1)], 5, "neither pending"),
    ([(0, 0)], 5, "below 1"),
    ([], -1, "below the cursor"),
])
def test_a_bad_pop_raises_and_changes_nothing(taken, next_cursor, match):
    events = []
    ledger = ledger_with(events=events)
    before = ledger.snapshot()
    with pytest.raises(ValueError, match=match):
        ledger.pop(K, taken, next_cursor, now_ms=0, invisible_ms=1, client_id="c")
    assert ledger.snapshot() == before and len(events) == 1


def test_when_the_sink_fails_nothing_changes():
    ledger = ledger_with()
    (h,) = pop(ledger, [0], 1).handles

    def full_disk(events):
        raise OSError(28, "No space left on device")

    ledger.sink = full_disk
    before, version = ledger.snapshot(), ledger.version
    with pytest.raises(OSError):
        ledger.ack(h)
    with pytest.raises(OSError):
        pop(ledger, [1], 2)
    assert ledger.snapshot() == before and ledger.version == version
    ledger.sink = None
    assert ledger.ack(h) == 1  # the refused ack can be retried


def test_unknown_queues_are_a_caller_bug():
    with pytest.raises(KeyError, match="ensure_queue"):
        PopLedger().pop(K, [], 1, now_ms=0, invisible_ms=1, client_id="c")
    ledger = ledger_with(start=7)
    assert not ledger.ensure_queue(K, 0) and ledger.cursor(K) == 7


# -- renewal ---------------------------------------------------------------------------------------------


def test_auto_renew_extends_live_clients_only_keeps_the_handle_and_stops_at_the_limit():
    events = []
    ledger = ledger_with(events=events, renew_slice_ms=MIN, renew_ahead_ms=10_000, max_renew_ms=100_000)
    (h,) = pop(ledger, [0], 1, now=0, invisible=MIN, client="alive", auto_renew=True).handles
    (other,) = pop(ledger, [1], 2, now=0, invisible=MIN, client="gone", auto_renew=True).handles
    pop(ledger, [2], 3, now=0, invisible=MIN, client="alive", auto_renew=False)
    assert ledger.renewals(40_000, {"alive", "gone"}) == []  # not due yet
    renewed = ledger.renewals(55_000, {"alive"})
    assert renewed == [Renewed(K, 0, h.pop_id, 100_000)]  # 55 s + 60 s, cut to 100 s after the pop
    assert events[-1:] == renewed and ledger.inflight(K)[0].deadline_ms == 100_000
    assert ledger.renewals(95_000, {"alive"}) == []  # at the 100 s limit: it expires normally
    assert ledger.ack(h) == 1  # the same handle still works
    assert ledger.renewals(10**6, {"gone"}) == []  # past its deadline: for the revive scan, not renewal
    assert [e.offset for e in ledger.expired(10**6)] == [1, 2]
    assert other.pop_id in {e.entry.pop_id for e in ledger.expired(10**6)}


def test_a_renewed_entry_does_not_expire_at_its_old_deadline():
    ledger = ledger_with()
    pop(ledger, [0], 1, now=0, invisible=MIN, auto_renew=True)
    ledger.renewals(55_000, {"c1"})
    assert ledger.expired(MIN) == [] and ledger.next_deadline() == 115_000
    assert [e.entry.deadline_ms for e in ledger.expired(115_000)] == [115_000]


def test_heaps_stay_bounded_and_right_through_compaction():
    ledger = ledger_with(cap=1000)
    handles = pop(ledger, range(300), 300, now=0, invisible=1).handles
    (first,) = ledger.expired(1, limit=1)
    ledger.redeliver_in_place(K, 0, first.entry.pop_id)  # the smallest offset is pending now
    for h in handles[1:]:
        h = ledger.change_invisible(h, now_ms=0, invisible_ms=MIN)
        ledger.ack(h)
    assert ledger.watermark(K) == 0 and len(ledger._deadlines) < 100
    (again,) = ledger.pop(K, [(0, 2)], 300, now_ms=0, invisible_ms=1, client_id="c").handles
    assert ledger.ack(again) == 300


def test_change_invisible_ends_auto_renewal():
    ledger = ledger_with()
    (h,) = pop(ledger, [0], 1, now=0, invisible=MIN, auto_renew=True).handles
    ledger.change_invisible(h, now_ms=0, invisible_ms=1000)  # a push consumer's nack: redeliver soon
    assert ledger.renewals(500, {"c1"}) == []
    assert [e.offset for e in ledger.expired(1000)] == [0]


def test_renewals_of_many_entries_are_one_sink_call():
    calls = []
    ledger = ledger_with()
    pop(ledger, range(50), 50, now=0, invisible=MIN, auto_renew=True)
    ledger.sink = calls.append
    assert len(ledger.renewals(55_000, {"c1"})) == 50
    assert len(calls) == 1


# -- snapshot ------------------------------------------------------------------------------------------


def test_a_snapshot_round_trips_and_keeps_pop_ids_growing():
    ledger = ledger_with()
    a = pop(ledger, [0, 1, 3], 4, auto_renew=True).handles
    (exp,) = [e for e in ledger.expired(MIN) if e.offset == 1]
    ledger.redeliver_in_place(K, 1, exp.entry.pop_id)
    doc = ledger.snapshot()
    again = PopLedger.from_snapshot(doc)
    assert again.snapshot() == doc
    assert again.watermark(K) == 0 and again.expired(MIN) == ledger.expired(MIN)
    assert again.ack(a[0]) == 1
    (b,) = pop(again, [4], 5).handles
    assert b.pop_id > max(h.pop_id for h in a)
    floor = PopLedger.from_snapshot(doc, pop_id_floor=10**15)
    assert pop(floor, [4], 5).handles[0].pop_id == 10**15 + 1


@pytest.mark.parametrize("damage", [
    lambda d: d.pop("lastPopId"),
    lambda d: d.update(queues="nope"),
    lambda d: d["queues"][0].update(cursor=-1),
    lambda d: d["queues"][0].update(cursor=1),  # in-flight offset 3 at or above the cursor
    lambda d: d["queues"][0]["inflight"][0].__setitem__(5, 2),  # auto_renew not 0/1
    lambda d: d["queues"][0]["pending"].append([0, 1, 1]),  # both in flight and pending
    lambda d: d["queues"].append(dict(d["queues"][0])),  # the same queue twice
    lambda d: d["queues"][0]["inflight"][0].__delitem__(slice(-2, None)),  # too short (7 values: an older state)
    lambda d: d["queues"][0]["inflight"][0].append(1),  # too long
])
def test_a_damaged_snapshot_is_refused(damage):
    ledger = ledger_with()
    pop(ledger, [0, 3], 4)
    doc = ledger.snapshot()
    damage(doc)
    with pytest.raises(PopStateError):
        PopLedger.from_snapshot(doc)


def test_events_that_do_not_fit_are_skipped_on_replay():
    ledger = PopLedger()
    assert ledger.apply(Reset(K, 5))
    assert not ledger.apply(Popped(K, 4, 6, 0, "c", False, 0, ((5, 1, 1),)))  # not at the cursor
    assert not ledger.apply(Acked(K, 5, 1))  # nothing in flight there
    assert ledger.apply(Popped(K, 5, 6, 0, "c", False, 0, ((5, 1, 1),)))
    assert not ledger.apply(Changed(K, 5, 99, 100, 10))  # not the current pop id
    assert not ledger.apply(Acked(QueueKey("other", "T", 0), 5, 1))
    assert ledger.version == 2 and ledger.last_pop_id == 1


# -- the property test ----------------------------------------------------------------------------------

KEYS = [K, QueueKey("g", "U", 1)]
CLIENTS = ["a", "b"]


@dataclass
class Delivery:  # the model's in-flight entry
    pop_id: int
    deadline: int
    attempt: int
    client: str
    auto_renew: bool
    until: int


class PopModel(RuleBasedStateMachine):
    """Random operations against the ledger and a model that keeps every offset's fate explicitly:
    in flight, pending, or done (acked, filtered out, revived)."""

    @initialize(cap=st.integers(1, 6))
    def start(self, cap):
        self.settings = PopSettings(max_inflight_per_queue=cap, renew_slice_ms=5000, renew_ahead_ms=2000,
                                    max_renew_ms=20_000)
        self.events = []
        self.ledger = PopLedger(self.settings, sink=self.events.extend)
        self.now = 0
        self.issued = []  # every handle ever handed out
        self.pop_ids = []
        self.inflight, self.pending, self.done, self.base, self.last_watermark = {}, {}, {}, {}, {}
        for key in KEYS:
            self._reset(key, 0)

    def _reset(self, key, offset):
        self.ledger.reset(key, offset)
        self.inflight[key], self.pending[key], self.done[key] = {}, {}, set()
        self.base[key] = self.last_watermark[key] = offset

    def _is_current(self, h):
        d = self.inflight[h.key].get(h.offset)
        return d is not None and d.pop_id == h.pop_id

    def _issue(self, h):
        assert not self.pop_ids or h.pop_id > max(self.pop_ids)
        self.issued.append(h)
        self.pop_ids.append(h.pop_id)

    @rule(key=st.sampled_from(KEYS), mask=st.lists(st.booleans(), max_size=6), take_pending=st.booleans(),
          client=st.sampled_from(CLIENTS), invisible=st.integers(0, 4000), auto_renew=st.booleans(),
          attempt=st.integers(1, 3))
    def pop(self, key, mask, take_pending, client, invisible, auto_renew, attempt):
        cursor = self.ledger.cursor(key)
        pending = sorted(self.pending[key].items()) if take_pending else []
        fresh = [(cursor + i, attempt) for i, take in enumerate(mask) if take]
        room = self.settings.max_inflight_per_queue - len(self.inflight[key]) - len(self.pending[key])
        result = self.ledger.pop(key, pending + fresh, cursor + len(mask), now_ms=self.now,
                                 invisible_ms=invisible, client_id=client, auto_renew=auto_renew)
        expected = pending + fresh[:max(room, 0)]
        assert [(h.offset, h.attempt) for h in result.handles] == expected  # redeliveries never wait for room
        assert result.next_cursor == (fresh[room][0] if len(fresh) > room else cursor + len(mask))
        self.done[key] |= set(range(cursor, result.next_cursor)) - {o for o, _ in expected}
        for h in result.handles:
            self._issue(h)
            self.pending[key].pop(h.offset, None)
            self.inflight[key][h.offset] = Delivery(h.pop_id, self.now + invisible, h.attempt, client, auto_renew,
                                                    self.now + 20_000 if auto_renew else 0)

    @precondition(lambda self: self.issued)
    @rule(data=st.data())
    def ack(self, data):
        h = data.draw(st.sampled_from(self.issued))
        if self._is_current(h):
            self.ledger.ack(h)
            del self.inflight[h.key][h.offset]
            self.done[h.key].add(h.offset)
        else:
            before = self.ledger.snapshot()
            with pytest.raises(StaleReceiptHandleError):
                self.ledger.ack(h)
            assert self.ledger.snapshot() == before

    @precondition(lambda self: self.issued)
    @rule(data=st.data(), invisible=st.integers(0, 4000))
    def change(self, data, invisible):
        h = data.draw(st.sampled_from(self.issued))
        if not self._is_current(h):
            with pytest.raises(StaleReceiptHandleError):
                self.ledger.change_invisible(h, now_ms=self.now, invisible_ms=invisible)
            return
        new = self.ledger.change_invisible(h, now_ms=self.now, invisible_ms=invisible)
        self._issue(new)
        d = self.inflight[h.key][h.offset]
        d.pop_id, d.deadline, d.auto_renew, d.until = new.pop_id, self.now + invisible, False, 0

    @rule(ms=st.integers(0, 3000))
    def tick(self, ms):
        self.now += ms

    @rule(fifo=st.booleans(), limit=st.integers(1, 3))
    def revive(self, fifo, limit):
        due = sorted(d.deadline for key in KEYS for d in self.inflight[key].values() if d.deadline <= self.now)
        expired = self.ledger.expired(self.now, limit)
        assert [e.entry.deadline_ms for e in expired] == due[:limit]
        for e in expired:
            assert self.inflight[e.key][e.offset].pop_id == e.entry.pop_id
            d = self.inflight[e.key].pop(e.offset)
            if fifo:
                assert self.ledger.redeliver_in_place(e.key, e.offset, d.pop_id).attempt == d.attempt + 1
                self.pending[e.key][e.offset] = d.attempt + 1
            else:
                self.ledger.revived(e.key, e.offset, d.pop_id)
                self.done[e.key].add(e.offset)

    @rule(alive=st.sets(st.sampled_from(CLIENTS)))
    def renew(self, alive):
        s, now = self.settings, self.now
        expected = {(key, o): min(now + s.renew_slice_ms, d.until) for key in KEYS
                    for o, d in self.inflight[key].items()
                    if d.auto_renew and d.client in alive and now < d.deadline <= now + s.renew_ahead_ms
                    and min(now + s.renew_slice_ms, d.until) > d.deadline}
        renewed = self.ledger.renewals(now, alive)
        assert {(r.key, r.offset): r.deadline_ms for r in renewed} == expected
        for r in renewed:
            d = self.inflight[r.key][r.offset]
            assert r.pop_id == d.pop_id  # the client's handle stays valid
            d.deadline = r.deadline_ms

    @rule(key=st.sampled_from(KEYS), offset=st.integers(0, 30))
    def admin_reset(self, key, offset):
        self._reset(key, offset)

    @rule()
    def restart(self):
        doc = self.ledger.snapshot()
        self.ledger = PopLedger.from_snapshot(doc, self.settings, sink=self.events.extend)
        assert self.ledger.snapshot() == doc

    @invariant()
    def the_ledger_holds_what_the_model_holds(self):
        for key in KEYS:
            assert {o: (e.pop_id, e.deadline_ms, e.attempt) for o, e in self.ledger.inflight(key).items()} == \
                {o: (d.pop_id, d.deadline, d.attempt) for o, d in self.inflight[key].items()}
            assert {p.offset: p.attempt for p in self.ledger.pending(key)} == self.pending[key]

    @invariant()
    def every_offset_below_the_cursor_is_in_exactly_one_state(self):
        for key in KEYS:
            cursor = self.ledger.cursor(key)
            inflight, pending, done = set(self.inflight[key]), set(self.pending[key]), self.done[key]
            for o in range(self.base[key], cursor):
                assert (o in inflight) + (o in pending) + (o in done) == 1, (key, o)
            assert all(self.base[key] <= o < cursor for o in inflight | pending | done)
            assert len(inflight) + len(pending) <= self.settings.max_inflight_per_queue

    @invariant()
    def the_watermark_is_the_smallest_unfinished_offset_and_never_moves_back(self):
        for key in KEYS:
            cursor = self.ledger.cursor(key)
            watermark = self.ledger.watermark(key)
            assert watermark == next((o for o in range(self.base[key], cursor) if o not in self.done[key]), cursor)
            assert watermark <= min([*self.inflight[key], *self.pending[key], cursor])
            assert watermark >= self.last_watermark[key]
            self.last_watermark[key] = watermark

    @invariant()
    def replaying_the_events_gives_the_live_state(self):
        assert replayed(self.events, self.settings).snapshot() == self.ledger.snapshot()


PopModel.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestPopModel = PopModel.TestCase
