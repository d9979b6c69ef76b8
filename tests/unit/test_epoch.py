"""EpochSequence: strictly increasing, and larger than anything an earlier process issued."""

import time

import pytest

from tidemark.broker.membership.epoch import EpochSequence


def test_explicit_seed_gives_predictable_strictly_increasing_values():
    seq = EpochSequence(seed=100)
    assert [seq.next() for _ in range(3)] == [101, 102, 103]
    assert seq.last == 103


def test_default_seed_is_wall_clock_microseconds(monkeypatch):
    monkeypatch.setattr(time, "time_ns", lambda: 1_700_000_000_123_456_789)
    seq = EpochSequence()
    assert seq.next() == 1_700_000_000_123_456 + 1


def test_later_instance_issues_larger_values_than_an_earlier_one():
    # Two "broker processes": the first issues many epochs, the second starts later.
    first = EpochSequence()
    issued = [first.next() for _ in range(1000)]
    assert issued == sorted(set(issued))
    time.sleep(0.002)
    second = EpochSequence()
    assert second.next() > max(issued)


@pytest.mark.parametrize("seed", [0, 5, 10**15])
def test_values_never_repeat(seed):
    seq = EpochSequence(seed=seed)
    values = [seq.next() for _ in range(100)]
    assert len(set(values)) == 100
    assert all(b > a for a, b in zip(values, values[1:], strict=False))
