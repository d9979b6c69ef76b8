"""The console's memory of lag and message counts: bounded, never drawn backwards, rates over a window."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidemark.client.console.history import History, Point


def test_series_keep_the_newest_points_up_to_capacity():
    h = History(capacity=3)
    for t in range(5):
        h.record("lag", "g", t * 1000, 10 - t)
    assert h.series("lag", "g") == [Point(2000, 8), Point(3000, 7), Point(4000, 6)]
    assert h.series("lag", "g", since_ms=3000) == [Point(3000, 7), Point(4000, 6)]
    assert h.series("lag", "other") == []


def test_a_point_older_than_the_newest_is_ignored():
    h = History()
    h.record("lag", "g", 2000, 5)
    h.record("lag", "g", 1000, 9)  # a slow request answering after a newer sample
    assert h.series("lag", "g") == [Point(2000, 5)]


def test_rate_over_the_window_and_restarted_by_a_fall():
    h = History()
    assert h.rate("messages", "t") is None
    h.record("messages", "t", 0, 0)
    assert h.rate("messages", "t") is None
    h.record("messages", "t", 10_000, 100)
    assert h.rate("messages", "t") == 10.0
    h.record("messages", "t", 100_000, 1000)  # the older points are now outside the 60 s window
    assert h.rate("messages", "t") is None
    h.record("messages", "t", 130_000, 1600)
    assert h.rate("messages", "t") == 20.0
    h.record("messages", "t", 140_000, 5)  # topic deleted and created again
    assert h.rate("messages", "t") is None
    h.record("messages", "t", 150_000, 25)
    assert h.rate("messages", "t") == 2.0


def test_idle_series_are_forgotten():
    h = History(forget_after_ms=1000)
    h.record("lag", "old", 0, 1)
    h.record("lag", "new", 1500, 1)
    assert h.forget_idle(2000) == [("lag", "old")]
    assert h.series("lag", "old") == [] and h.series("lag", "new") == [Point(1500, 1)]


@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 10**9)), max_size=200), st.integers(1, 50))
def test_series_are_bounded_and_time_ordered(points, capacity):
    h = History(capacity=capacity)
    for t, v in points:
        h.record("lag", "g", t, v)
    got = h.series("lag", "g")
    assert len(got) <= capacity
    assert all(a.t_ms <= b.t_ms for a, b in zip(got, got[1:], strict=False))
