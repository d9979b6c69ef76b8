"""broker/store/reads.py `_runs`: how a properties filter groups records into reads."""

from tidemark.broker.store.reads import RUN_READ_BYTES, _runs


def test_back_to_back_records_are_read_in_runs_of_bounded_size():
    """Regression (review): a run of 256 large records was one read (about 1 GiB at 4 MiB each)."""
    size = 600_000
    entries = [(i * size, size, 0) for i in range(10)]
    runs = _runs(entries, 0)
    assert [len(sizes) for _, sizes in runs] == [1] * 10  # two would pass RUN_READ_BYTES
    assert all(sum(sizes) <= RUN_READ_BYTES for _, sizes in runs)
    small = [(i * 100, 100, 0) for i in range(256)]
    assert [(phys, len(sizes)) for phys, sizes in _runs(small, 0)] == [(0, 256)]


def test_a_gap_or_a_deleted_segment_starts_a_new_run():
    entries = [(0, 100, 0), (100, 100, 0), (500, 100, 0), (600, 50, 0)]
    assert _runs(entries, 0) == [(0, [100, 100]), (500, [100, 50])]
    assert _runs(entries, 200) == [(500, [100, 50])]
    huge = [(0, RUN_READ_BYTES * 2, 0), (RUN_READ_BYTES * 2, 10, 0)]
    assert _runs(huge, 0) == [(0, [RUN_READ_BYTES * 2]), (RUN_READ_BYTES * 2, [10])]
