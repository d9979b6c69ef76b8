"""latency_split's relay floor in smoke mode: it relays every message, with the frames it says it sends.

No latency or CPU figure is asserted (benchmarks are not tests); what is held is
that the relay moves the same messages in the same kind of requests as the
broker's producer, or its figures would not be the floor under Tidemark's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import relay_floor

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_natural_batching_puts_the_messages_due_meanwhile_in_one_request():
    # 4,000 msg/s is a message every 250 us, less than a loopback round trip of grpc.aio: some wait.
    row = relay_floor.one_run(4000, 1.0, natural=True)
    assert row["messages_per_request"] > 1.0
    assert row["broker_cpu_us_per_msg"] > 0 and row["producer_cpu_us_per_msg"] > 0
    assert 0 < row["e2e_p50_ms"] <= row["e2e_p99_ms"]


def test_without_batching_every_message_is_a_request_of_its_own():
    row = relay_floor.one_run(1000, 0.5, natural=False)
    assert row["messages_per_request"] == 1.0


def test_latency_split_reports_the_relay_beside_the_broker():
    r = subprocess.run([sys.executable, "-m", "bench.latency_split", "--rates", "500", "--seconds", "0.5",
                        "--rounds", "1", "--consumer", "relay,raw"], cwd=REPO, capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr[-4000:]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert {row["consumer"] for row in rows} == {"relay", "raw"}
    assert all(row["received"] == 250 for row in rows)
