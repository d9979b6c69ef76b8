"""The bench report draws a chart for any subset of systems and workloads (issue: a latency-only run
crashed while drawing its log-scaled throughput panel, which had no data)."""

from __future__ import annotations

import pytest

from bench.report import write_chart

pytest.importorskip("matplotlib")


def _run(medians: dict, names: dict) -> dict:
    return {"names": names, "medians": medians, "rounds": 1, "machine": {"cores": 2}}


@pytest.mark.parametrize("medians", [
    {"latency": {"tidemark": {"p50_ms": 3.4, "p99_ms": 9.6}}},
    {"produce": {"tidemark": {"rate": 100_000.0}}},
    {"membership": {"tidemark": {"join_first_ms": 41.0}}},
    {},
])
def test_a_chart_is_drawn_for_any_subset_of_workloads(tmp_path, medians):
    path = tmp_path / "chart.png"
    assert write_chart(path, _run(medians, {"tidemark": "Tidemark"}))
    assert path.stat().st_size > 0
