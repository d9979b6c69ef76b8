"""A broker process imports numpy without OpenBLAS's helper threads (broker/__init__.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# The broker's whole import, then the process's threads and the setting OpenBLAS read.
PROBE = ("import os, tidemark.broker.app, tidemark.broker.server; "
         "print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))")


def _probe(**env: str) -> tuple[int, str]:
    base = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**base, **env}, capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    return int(out[0]), out[1]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or (os.cpu_count() or 1) < 2,
                    reason="counts threads in /proc; OpenBLAS starts helpers only with 2 or more cores")
def test_the_broker_imports_numpy_without_openblas_helper_threads() -> None:
    assert _probe() == (1, "1")


def test_an_operators_own_openblas_setting_is_kept() -> None:
    assert _probe(OPENBLAS_NUM_THREADS="2")[1] == "2"
