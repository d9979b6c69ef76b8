"""The benchmark harnesses in smoke mode, so that they cannot rot.

Each runs as `make bench` would (a subprocess, real servers, tiny counts) and
must finish and report a result for every system and workload. No numbers are
asserted: benchmarks are not tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = ("produce", "consume", "commit", "latency", "membership", "send", "latency_curve")
PEERS = ("redis", "nats")

pytestmark = pytest.mark.slow


def run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-6000:]}\n{r.stderr[-6000:]}"
    return r


@pytest.fixture(scope="module")
def peer_smoke(tmp_path_factory) -> tuple[dict, str, Path]:
    d = tmp_path_factory.mktemp("bench-smoke")
    run(["-m", "bench", "--smoke", "--out", str(d / "benchmarks.md"), "--json", str(d / "run.json")], 280)
    return json.loads((d / "run.json").read_text()), (d / "benchmarks.md").read_text(), d


def test_tidemark_and_transport_ceiling_have_a_result_for_every_workload(peer_smoke):
    result, markdown, _ = peer_smoke
    assert result["errors"] == []
    for workload in WORKLOADS:
        assert result["results"][workload]["tidemark"], f"no Tidemark result for {workload}"
        if workload not in ("membership", "latency_curve"):
            assert result["results"][workload]["echo"], f"no gRPC echo result for {workload}"
    assert markdown.count("<!-- bench:peers:begin -->") == 1 and markdown.count("<!-- bench:peers:end -->") == 1
    assert "| Workload | Metric | Tidemark |" in markdown
    assert "python -m bench --smoke" in markdown
    curve = result["medians"]["latency_curve"]["tidemark"]
    for rate in result["sizes"]["curve_rates"]:  # every rate of the curve measured, end to end and publish
        assert curve[f"e2e_p50_ms@{rate}"] > 0 and curve[f"pub_p99_ms@{rate}"] > 0, rate
        assert curve[f"missing@{rate}"] == 0, rate
    assert result["medians"]["send"]["tidemark"]["p50_us"] > 0
    assert result["medians"]["send"]["echo"]["p50_us"] > 0


@pytest.mark.parametrize("peer", PEERS)
def test_each_peer_has_a_result_for_every_workload(peer_smoke, peer):
    result, markdown, _ = peer_smoke
    if peer in result["skipped"]:
        pytest.skip(f"{peer} skipped by the harness: {result['skipped'][peer]}")
    for workload in WORKLOADS:
        assert result["results"][workload][peer], f"no {peer} result for {workload}"
    assert result["names"][peer] in markdown


def test_chart_is_a_png(peer_smoke):
    _, _, d = peer_smoke
    pytest.importorskip("matplotlib")
    assert (d / "benchmarks-peers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (d / "benchmarks-peers-latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_client_e2e_and_rebalance_smoke_fill_their_section(tmp_path):
    out = tmp_path / "benchmarks.md"
    out.write_text("# Benchmarks\n\nwritten by someone else\n")
    run(["-m", "bench.client_e2e", "--smoke", "--out", str(out)], 120)
    run(["-m", "bench.rebalance", "--smoke", "--out", str(out)], 180)
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\nwritten by someone else\n")
    section = text[text.index("<!-- bench:client:begin -->"):text.index("<!-- bench:client:end -->")]
    assert "max end-to-end rate" in section and "latency p99" in section
    for mode in ("handover", "rocketmq"):
        assert f"| 2 | {mode} | join |" in section and f"| 2 | {mode} | leave |" in section
