"""bench.etcd_groups in smoke mode, so that it cannot rot: a real etcd, a few groups, a short steady state.
What it counts follows from the groups it runs, so the counts are asserted; rates and times only exist."""

from __future__ import annotations

import json

import pytest

from bench import etcd_groups

pytestmark = pytest.mark.slow


def test_smoke_run_counts_keys_watchers_renewals_and_takeovers(tmp_path, capsys):
    out = tmp_path / "etcd.json"
    assert etcd_groups.main(["--groups", "3", "--brokers", "3", "--seconds", "3", "--takeovers", "2",
                             "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result == json.loads(capsys.readouterr().out)
    assert result["keys"] == 3 * 4  # master, epoch, in_sync and last_master per group
    assert result["watchers"] == 3 * 2  # one per replica
    assert result["per_second"]["renewals"] > 0 and result["per_second"]["puts"] == 0
    assert result["takeovers"] == 2 and 0 < result["all_taken_over_s"] < 10
