"""A broker's helper threads (gRPC's poller and EventEngine threads) run under SCHED_BATCH and its event
loop's thread does not (broker/app.py, _batch_helper_threads): woken by the loop, a helper must not
preempt the thread that holds the GIL."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from workload import wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="scheduling policies are Linux's")


def _threads(pid: int) -> dict[int, tuple[str, int]]:
    """Each thread of the process: its name and scheduling policy (threads that end meanwhile left out)."""
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(t)] = (Path(f"/proc/{pid}/task/{t}/comm").read_text().strip(), os.sched_getscheduler(int(t)))
        except OSError:
            continue
    return out


def test_grpc_threads_are_batch_scheduled_and_the_loop_thread_is_not(broker_factory):
    broker = broker_factory()
    pid = broker.proc.pid
    assert (broker.data_dir / "lock").read_text().strip() == str(pid)  # the broker itself (its data dir's lock holder)

    def engine_threads() -> dict[int, int]:
        return {tid: policy for tid, (name, policy) in _threads(pid).items() if name.startswith("event_engine")}

    wait_until(lambda: engine_threads() and all(p == os.SCHED_BATCH for p in engine_threads().values()), 15,
               "gRPC's EventEngine threads batch-scheduled once the broker serves")
    threads = _threads(pid)
    assert threads[pid][1] == os.SCHED_OTHER, "the event loop's thread keeps the normal policy"
    assert sum(policy == os.SCHED_BATCH for _, policy in threads.values()) >= len(engine_threads()) + 1
