"""bench.round_cost in smoke mode: each round appends a batch and serves it in the frame it wakes.

No CPU figure is asserted (benchmarks are not tests); what is held is that the round the
benchmark times is the broker's work for one request of the latency workload, the batch in and the
same records out, or its figure would measure something else.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from bench import round_cost

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_every_round_serves_the_batch_it_appended(tmp_path):
    us = asyncio.run(round_cost._rounds(tmp_path, 4, 300, profile=False))
    assert us > 0


def test_the_command_runs_its_rounds_in_a_child_and_prints_the_median():
    r = subprocess.run([sys.executable, "-m", "bench.round_cost", "--runs", "1", "--requests", "200"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "this:" in r.stdout
