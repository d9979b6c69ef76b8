"""TransactionTable (pure): open halves, ends, floors for the next start, when checks are due."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.broker.transactions.table import Outcome, TransactionTable


def table(**kw) -> TransactionTable:
    return TransactionTable(timeout_ms=100, check_interval_ms=50, max_checks=2, **kw)


def test_checks_are_due_after_the_timeout_then_every_interval_and_discard_after_the_maximum():
    t = table()
    t.add(0, "g", "m0", "T", stored_ms=1000)
    assert t.due(1099) == []
    (due,) = t.due(1100)
    assert due.half.msg_id == "m0" and not due.discard
    t.checked(0, 1100)
    assert t.due(1149) == [] and len(t.due(1150)) == 1
    t.checked(0, 1150)
    (due,) = t.due(1200)
    assert due.discard, "checked max_checks times: roll back"


def test_ends_advance_the_floors_past_every_resolved_half():
    t = table()
    for offset in range(3):
        t.add(offset, "g", f"m{offset}", "T", stored_ms=0)
    t.resolve(1, Outcome.COMMIT, op_offset=0)
    assert (t.floor, t.outcome(1)) == (0, Outcome.COMMIT), "half 0 is still open"
    t.resolve(0, Outcome.ROLLBACK, op_offset=1)
    assert t.floor == 2 and t.outcome(0) is None, "below the floor, outcomes are forgotten"
    assert t.op_floor == 0, "moves only once the ops up to an end were applied (advance_op_floor)"
    t.resolve(2, Outcome.COMMIT, op_offset=2)
    t.advance_op_floor(3)
    assert (t.floor, t.op_floor, len(t)) == (3, 3, 0)
    t.add(1, "g", "old", "T", stored_ms=0)
    assert len(t) == 0, "a half below the floor is resolved already"


@settings(max_examples=200, deadline=None)
@given(st.permutations(range(12)), st.integers(0, 12))
def test_a_restart_from_the_floors_rebuilds_the_same_open_halves(order, ended):
    """Ends in any order; a new table built from the floors by scanning halves and ops from there
    (as TransactionService.load does) holds exactly the halves still open."""
    t = table()
    for offset in range(12):
        t.add(offset, "g", f"m{offset}", "T", stored_ms=0)
    ops = []
    for op_offset, half in enumerate(order[:ended]):
        t.resolve(half, Outcome.COMMIT, op_offset)
        ops.append(half)
    t.advance_op_floor(len(ops))
    again = table(floor=t.floor, op_floor=t.op_floor)
    for offset in range(t.floor, 12):
        again.add(offset, "g", f"m{offset}", "T", stored_ms=0)
    for op_offset in range(t.op_floor, len(ops)):
        again.resolve(ops[op_offset], Outcome.COMMIT, op_offset)
    assert [h.offset for h in again.halves()] == [h.offset for h in t.halves()] == sorted(order[ended:])


def test_open_halves_are_found_by_group_and_message_id_until_they_end():
    table = TransactionTable(timeout_ms=1000, check_interval_ms=1000, max_checks=3)
    table.add(0, "g", "id-1", "T", 0)
    table.add(1, "g", "id-1", "T", 0)  # a second copy (stored before the broker deduplicated): the first wins
    table.add(2, "other", "id-1", "T", 0)
    assert table.open_offset("g", "id-1") == 0 and table.open_offset("other", "id-1") == 2
    assert table.open_offset("g", "id-2") is None
    table.resolve(1, Outcome.ROLLBACK, 0)
    assert table.open_offset("g", "id-1") == 0, "ending another copy does not forget the indexed one"
    table.resolve(0, Outcome.COMMIT, 1)
    assert table.open_offset("g", "id-1") is None


def test_committed_halves_are_remembered_by_id_for_retries_and_rolled_back_ones_are_not(monkeypatch):
    from tidemark.broker.transactions import table as table_module
    monkeypatch.setattr(table_module, "COMMITTED_IDS_KEPT", 2)
    table = TransactionTable(timeout_ms=1000, check_interval_ms=1000, max_checks=3)
    for offset, msg_id in enumerate(["a", "b", "c", "d"]):
        table.add(offset, "g", msg_id, "T", 0)
    table.resolve(0, Outcome.COMMIT, 0)
    table.resolve(1, Outcome.ROLLBACK, 1)  # a retry after a rollback is a new attempt
    assert table.committed_offset("g", "a") == 0 and table.committed_offset("g", "b") is None
    assert table.committed_offset("other", "a") is None
    table.resolve(2, Outcome.COMMIT, 2)
    table.resolve(3, Outcome.COMMIT, 3)
    assert table.committed_offset("g", "a") is None, "only the latest COMMITTED_IDS_KEPT are kept"
    assert (table.committed_offset("g", "c"), table.committed_offset("g", "d")) == (2, 3)
