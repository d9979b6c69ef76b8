"""A Docker engine for the container tests: the running one, or dockerd started (and stopped) here.

Where none can run (no root, no docker.io), every test in this directory is skipped with one line
saying why.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from container_engine import Engine  # noqa: E402


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory):
    engine = Engine(tmp_path_factory.mktemp("dockerd") / "dockerd.log")
    reason = engine.start()
    if reason is not None:
        engine.stop()
        pytest.skip(reason)
    try:
        yield engine
    finally:
        engine.stop()
