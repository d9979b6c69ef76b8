"""The short set of fault runs (tests/faults/): every scenario once, a few seconds of faults each.

Each run starts real brokers (and name servers, a replica, a network
namespace or a small tmpfs where the scenario needs them), drives producers
and consumer groups through them while the seeded nemesis injects its faults,
then reads every queue back and judges the history (tests/faults/checker.py).
A run passes when it broke none of the promises of its mode (docs/guarantees.md)
and no process logged a traceback. A failure prints the run's findings and the
`make torture` command that repeats its seed; the long set is `make torture`.

The seeds are fixed so that CI runs the same schedules; `TIDEMARK_FAULT_SEED`
picks others.
"""

from __future__ import annotations

import os

import pytest
from faults.scenarios import SHORT_DURATION, SHORT_SET, default_mode, run_scenario, skip_reason

SEED = int(os.environ.get("TIDEMARK_FAULT_SEED", "7"))
DURATION = float(os.environ.get("TIDEMARK_FAULT_DURATION", "8"))


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("scenario", SHORT_SET)
def test_fault_run_keeps_every_promise(scenario, tmp_path):
    why = skip_reason(scenario)
    if why:
        pytest.skip(why)
    mode = default_mode(scenario)
    duration = SHORT_DURATION.get(scenario, DURATION)
    outcome = run_scenario(scenario, SEED, tmp_path / scenario, duration=duration, mode=mode)
    print(outcome.describe())
    mode_arg = ",".join(f"{k}={str(v).lower()}" for k, v in mode.items())
    assert outcome.ok, (f"{outcome.describe()}\nrepeat: make torture SCENARIOS={scenario} RUNS=1 SEED={SEED} "
                        f"MODE={mode_arg} DURATION={duration:g}")
    assert outcome.report.acknowledged > 0, "the workload acknowledged nothing: the run proved nothing"
    assert outcome.report.delivered > 0, "no consumer got anything: the run proved nothing"
    assert outcome.nemesis != "no faults" and "could not be applied" not in outcome.nemesis, outcome.nemesis
