"""The nemesis: faults, and a seeded schedule that applies them while the workloads run.

A `Fault` begins and ends (heals); an instant one (a reset) only begins. The
schedule is drawn from the run's seed before anything starts: when each
fault begins and how long it holds, so the same seed gives the same
schedule (the timing of what the clients do in between is the machine's).
`Nemesis.play` runs the schedule, logging each step with the run's clock,
and ends whatever is in force before it returns, so the read-back always
happens on a healed cluster.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .history import History

__all__ = ["Action", "Fault", "Nemesis", "Step", "schedule"]


@dataclass
class Fault:
    """A named fault: `begin` applies it, `end` heals it (None: instant)."""

    name: str
    begin: Callable[[], object]
    end: Callable[[], object] | None = None
    hold: tuple[float, float] = (0.5, 3.0)  # how long it holds, seconds (drawn per step)
    once: bool = False  # at most one step of it per run (a failover)
    weight: float = 1.0  # how often it is drawn relative to the others


@dataclass(frozen=True)
class Step:
    at: float    # seconds after the nemesis starts
    fault: Fault
    hold: float  # 0 for an instant fault


@dataclass(frozen=True)
class Action:
    """One line of the nemesis log."""

    time: float
    fault: str
    phase: str  # "begin", "end" or "error"
    detail: str = ""


def schedule(rng: random.Random, faults: Sequence[Fault], length_s: float, *,
             gap: tuple[float, float] = (0.5, 2.0), settle_s: float = 1.0) -> list[Step]:
    """Faults one after another over `length_s` seconds: a quiet gap, a fault, its hold, a gap... The
    first `settle_s` seconds are quiet (the workload gets going), and the last fault ends by length_s."""
    steps: list[Step] = []
    used: set[str] = set()
    t = settle_s
    while True:
        choices = [f for f in faults if not (f.once and f.name in used)]
        if not choices:
            break
        t += rng.uniform(*gap)
        fault = rng.choices(choices, weights=[f.weight for f in choices])[0]
        hold = rng.uniform(*fault.hold) if fault.end is not None else 0.0
        if t + hold > length_s:
            break
        steps.append(Step(round(t, 3), fault, round(hold, 3)))
        used.add(fault.name)
        t += hold
    return steps


class Nemesis:
    """Plays a schedule in the calling thread. Processes a fault restarts are children of that thread, and
    tests start children with PR_SET_PDEATHSIG, which fires when the creating *thread* ends: the thread that
    plays the schedule must outlive the run (the test's main thread), never a helper thread."""

    def __init__(self, steps: Sequence[Step], history: History) -> None:
        self.steps = list(steps)
        self.history = history
        self.log: list[Action] = []

    def play(self, length_s: float = 0.0) -> None:
        """Apply each step at its time, then wait out the rest of `length_s` (the workload goes on healed);
        whatever happens, every fault ends healed."""
        start = self.history.now()
        for step in self.steps:
            time.sleep(max(0.0, start + step.at - self.history.now()))
            self._do(step.fault, "begin")
            if step.fault.end is None:
                continue
            try:
                time.sleep(step.hold)
            finally:
                self._do(step.fault, "end")
        time.sleep(max(0.0, start + length_s - self.history.now()))

    def _do(self, fault: Fault, phase: str) -> None:
        action = fault.begin if phase == "begin" else fault.end
        try:
            result = action()
        except Exception as e:  # a fault that could not be applied is logged; the run goes on
            self.log.append(Action(self.history.now(), fault.name, "error", f"{phase}: {type(e).__name__}: {e}"))
            return
        self.log.append(Action(self.history.now(), fault.name, phase, "" if result is None else str(result)))

    def summary(self) -> str:
        begun = [a for a in self.log if a.phase == "begin"]
        counts: dict[str, int] = {}
        for a in begun:
            counts[a.fault] = counts.get(a.fault, 0) + 1
        errors = [a for a in self.log if a.phase == "error"]
        text = ", ".join(f"{name} x{n}" for name, n in sorted(counts.items())) or "no faults"
        return text + (f"; {len(errors)} could not be applied ({errors[0].detail})" if errors else "")
