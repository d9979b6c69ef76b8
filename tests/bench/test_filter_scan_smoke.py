"""bench.filter_scan in smoke mode, so that it cannot rot: a small queue, every filter, both read paths (the
run itself asserts that each filter found exactly the matching messages)."""

from __future__ import annotations

from bench import filter_scan


def test_smoke_run_scans_with_every_filter(capsys):
    assert filter_scan.main(["--messages", "3000", "--every", "50", "--repeat", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "3000 messages, 1 in 50 matching (60); best of 1"
    rows = [line.split()[:2] for line in lines[2:]]
    assert [path for path, _ in rows] == ["fetch"] * len(filter_scan.FILTERS) + ["pull"] * len(filter_scan.FILTERS)
