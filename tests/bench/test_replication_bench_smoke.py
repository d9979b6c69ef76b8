"""bench.replication in smoke mode, so that it cannot rot.

Runs the script's main in-process (real brokers as child processes, about
1 s of producing per mode, a 4 MiB backlog) and asserts that every figure is
produced and positive; how large they are is not asserted: benchmarks are
not tests.
"""

from __future__ import annotations

import json

import pytest

from bench import replication

pytestmark = pytest.mark.slow


def test_smoke_run_measures_every_mode_and_the_copy(tmp_path, capsys):
    out = tmp_path / "replication.json"
    result = replication.main(["--smoke", "--json", str(out)])
    printed = capsys.readouterr().out

    for mode in replication.MODES:
        r = result["produce"][mode]
        assert r["msgs_per_s"] > 0 and r["mib_per_s"] > 0, (mode, r)
        assert r["messages"] > 0 and r["errors"] == 0, (mode, r)
        assert r["stored"] == r["messages"], (mode, r)  # nothing lost, nothing stored twice
        assert f"| {replication.MODE_LABELS[mode]} " in printed
    for mode in ("async", "sync"):
        r = result["produce"][mode]
        assert r["lag_samples"] > 0 and r["lag_max"] >= 0 and r["catch_up_s"] >= 0, (mode, r)
    assert result["ratios"]["async_vs_none"] > 0 and result["ratios"]["sync_vs_none"] > 0

    b = result["backlog"]
    assert b["mib_per_s"] > 0 and b["msgs_per_s"] > 0 and b["seconds"] > 0, b
    assert b["messages"] == 4 * 1024 and b["commit_log_mib"] >= b["payload_mib"], b
    assert "| replication throughput " in printed and "SMOKE RUN" in printed

    assert json.loads(out.read_text())["backlog"]["mib_per_s"] == b["mib_per_s"]


def test_brokers_are_stopped_when_a_phase_fails(monkeypatch):
    started = []
    real_start = replication.start_broker

    def recording_start(*a, **kw):
        server, address = real_start(*a, **kw)
        started.append(server.proc)
        return server, address

    def no_producer(*a, **kw):
        raise RuntimeError("producer refused")

    monkeypatch.setattr(replication, "start_broker", recording_start)
    monkeypatch.setattr(replication, "ProducerProc", no_producer)
    with pytest.raises(RuntimeError, match="producer refused"):
        replication.main(["--smoke"])
    assert started and all(proc.poll() is not None for proc in started)
