"""The hop planner of delivery times (tidemark.broker.ingest.delays.hop_level): pure tests, no broker.

A message sent for a delivery time hops through the delay levels: each hop takes the
largest level not past the delivery time (the shortest level when all are longer), so
it is never early, at most the shortest level late, and a day takes a bounded number of hops.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemark.broker.ingest.delays import hop_level
from tidemark.broker.ingest.send import MAX_DELIVERY_DELAY_MS
from tidemark.common.protocol import DEFAULT_DELAY_LEVELS, parse_delay_levels

LEVELS = parse_delay_levels(DEFAULT_DELAY_LEVELS)
SMALLEST = min(LEVELS)
# Worst case for the default table over 0..24 h, whatever the lateness of each hop (computed
# exhaustively at 1 ms): at most 12 hops of 2 h, then at most 12 shorter ones.
MAX_HOPS_PER_DAY = 24

remaining_ms = st.integers(min_value=0, max_value=MAX_DELIVERY_DELAY_MS)


def plan(remaining: int, late: list[int] | None = None) -> tuple[list[int], int]:
    """Simulate the hops of a message due `remaining` ms from now: the levels taken and when it arrives
    (ms from now). Hop k is delivered late[k] ms after its due time (the delivery loop's lag)."""
    late = late or []
    levels, t = [], 0
    while t < remaining:
        level = hop_level(remaining - t, LEVELS)
        levels.append(level)
        t += LEVELS[level - 1] + (late[len(levels) - 1] if len(levels) <= len(late) else 0)
        assert len(levels) <= 1000, "hops do not converge"
    return levels, t


@given(remaining_ms)
def test_the_hop_is_never_past_the_delivery_time_unless_it_is_the_shortest_level(remaining):
    delay = LEVELS[hop_level(remaining, LEVELS) - 1]
    assert delay <= remaining or (delay == SMALLEST and remaining < SMALLEST)
    # The largest such level: the next longer level would be past the delivery time.
    assert all(d > remaining or d <= delay for d in LEVELS)


@given(remaining_ms)
def test_on_time_hops_arrive_not_early_and_less_than_the_shortest_level_late(remaining):
    levels, arrival = plan(remaining)
    assert remaining <= arrival < remaining + SMALLEST
    assert sum(LEVELS[level - 1] for level in levels) == arrival
    assert len(levels) <= MAX_HOPS_PER_DAY


@given(remaining_ms, st.lists(st.integers(min_value=0, max_value=2_000), max_size=40))
def test_late_hops_are_never_early_and_only_the_last_one_adds_to_the_lateness(remaining, late):
    levels, arrival = plan(remaining, late)
    assert arrival >= remaining
    last_lag = late[len(levels) - 1] if 0 < len(levels) <= len(late) else 0
    assert arrival - last_lag < remaining + SMALLEST
    assert len(levels) <= MAX_HOPS_PER_DAY


def test_examples_with_the_default_levels():
    assert plan(0) == ([], 0)
    assert plan(1) == ([1], 1000)
    assert plan(120_000) == ([6], 120_000)  # 2 min: one hop
    assert plan(137_500)[0] == [6, 3, 2, 1, 1, 1]  # 2m, 10s, 5s, 1s, 1s, then 0.5 s left: 1s
    assert plan(MAX_DELIVERY_DELAY_MS) == ([18] * 12, MAX_DELIVERY_DELAY_MS)  # 12 hops of 2 h


@given(st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=20).filter(any),
       st.integers(min_value=0, max_value=100_000))
def test_any_level_table_picks_the_largest_fitting_positive_level(levels, remaining):
    levels = tuple(levels)
    chosen = levels[hop_level(remaining, levels) - 1]
    positive = [d for d in levels if d > 0]
    assert chosen > 0, "a 0 ms level would never move the clock"
    fitting = [d for d in positive if d <= remaining]
    assert chosen == (max(fitting) if fitting else min(positive))


def test_a_table_without_a_positive_level_cannot_plan():
    with pytest.raises(ValueError, match="no delay level"):
        hop_level(5_000, (0, 0))
