"""broker/store/reads.py `_runs`: how a properties filter groups records into reads; `_fitting_rows`: the
loop a small read takes instead of numpy's calls."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tidemark.broker.store.codec import CQ_DTYPE
from tidemark.broker.store.reads import (
    RUN_READ_BYTES,
    _fitting,
    _fitting_rows,
    _row_run_bounds,
    _run_bounds,
    _runs,
)


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


@given(sizes=st.lists(st.integers(1, 300), max_size=15), gaps=st.lists(st.booleans(), min_size=15, max_size=15),
       commit_log_min=st.integers(0, 3000), planned=st.integers(0, 5), nbytes=st.integers(0, 500),
       max_count=st.integers(1, 8), max_bytes=st.integers(1, 1500))
def test_a_small_read_takes_what_the_vectorised_one_takes(sizes, gaps, commit_log_min, planned, nbytes, max_count,
                                                          max_bytes):
    """The loop over a few entries (Python tuples) and the numpy path agree: the same records taken, the same
    first refused entry, the same runs, with entries below the commit log's start (retention) skipped."""
    phys, at = [], 0
    for size, gap in zip(sizes, gaps, strict=False):
        at += 50 * gap
        phys.append(at)
        at += size
    entries = np.array([(p, s, 0) for p, s in zip(phys, sizes, strict=True)], dtype=CQ_DTYPE)
    chosen = np.flatnonzero(entries["phys"] >= commit_log_min)
    took, refused = _fitting(entries["size"][chosen], planned, nbytes, max_count, max_bytes)
    cut, taken_phys, taken_sizes = _fitting_rows(entries.tolist(), commit_log_min, planned, nbytes, max_count,
                                                 max_bytes)
    assert (cut < len(entries), len(taken_phys)) == (refused, took)
    assert cut == (int(chosen[took]) if refused else len(entries))
    assert taken_phys == entries["phys"][chosen[:took]].tolist()
    assert taken_sizes == entries["size"][chosen[:took]].tolist()
    assert _row_run_bounds(taken_phys, taken_sizes) == _run_bounds(entries["phys"][chosen[:took]],
                                                                   entries["size"][chosen[:took]])
