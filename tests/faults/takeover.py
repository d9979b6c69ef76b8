"""How fast controller mode replaces a master, and what it costs: `python -m tests.faults.takeover`.

    python -m tests.faults.takeover                       # 20 of each fault: kill, stop, etcd-cut
    python -m tests.faults.takeover --faults kill --times 5

For each kind of fault one run of the `takeover` scenario (tests/faults/controller.py):
two brokers in controller mode with the default lease and sync replication, the
fault workload of every scenario, and the fault on whoever is master, `--times`
times, each once the pair is healthy again. Printed per fault: the seconds from
the fault to the first acknowledged send after it (p50 and max), the same for
deliveries (per fault the last consumer group to deliver again; each group's
in the JSON), and the history checker's verdict (acknowledged messages lost,
positions acknowledged for two different messages, duplicates stored,
redeliveries per group).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

_TESTS = Path(__file__).resolve().parent.parent
for _p in (str(_TESTS), str(_TESTS.parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from .controller import TAKEOVER_FAULTS, TAKEOVER_HOLD_S, takeovers  # noqa: E402
from .history import History  # noqa: E402
from .scenarios import run_scenario  # noqa: E402

# Per fault: its hold, the gap before the next (1.25 s on average) and the restart of the broker it hit.
SECONDS_PER_FAULT = TAKEOVER_HOLD_S + 1.25 + 2.5


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", default=",".join(TAKEOVER_FAULTS))
    parser.add_argument("--times", type=int, default=20)
    parser.add_argument("--seed", type=int, default=2900)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tidemark-takeover-"))
    rows, failed = [], False
    for i, fault in enumerate(filter(None, args.faults.split(","))):
        duration = 2.0 + args.times * SECONDS_PER_FAULT  # the first second is quiet
        outcome = run_scenario("takeover", args.seed + i, workdir / fault, duration=duration,
                               mode={"fault": fault, "idempotence": True})
        print(outcome.describe(), flush=True)
        doc = json.loads((outcome.workdir / "outcome.json").read_text())
        history = History.load(outcome.workdir / "history.jsonl")
        measured = takeovers(fault, history.events(), doc["nemesis_log"])
        row = {**measured.row(), **{k: outcome.report.row()[k] for k in
                                    ("acknowledged", "lost", "misplaced", "duplicated", "offsets_backwards")},
               "ok": outcome.ok}
        rows.append(row)
        failed |= not outcome.ok
    print("| fault | takeovers | p50 s | max s | delivery p50 s | delivery max s | acknowledged | lost | misplaced | "
          "duplicated | offsets back | redelivered | ok |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['fault']} | {r['takeovers']} (missed {r['missed']}) | {r['p50_s']} | {r['max_s']} | "
              f"{r['delivery_p50_s']} | {r['delivery_max_s']} | "
              f"{r['acknowledged']} | {r['lost']} | {r['misplaced']} | {r['duplicated']} | {r['offsets_backwards']} | "
              f"{r['redelivered']} | {r['ok']} |")
    for r in rows:
        print(f"{r['fault']}: delivery per group {r['delivery_by_group']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
