"""Seeded fault runs in bulk: `make torture`, or `python -m tests.faults.torture` from the repository root.

    make torture                                  # every scenario, 5 seeds each, modes drawn per seed
    make torture SCENARIOS=kill RUNS=50 SEED=1000 # 50 runs of one scenario, seeds 1000..1049
    make torture SCENARIOS=failover MODE=replication=sync DURATION=60

Each run prints one line (and its findings when it fails) with the command
that repeats it; at the end a table by scenario and mode with every counter
of the checker and the longest windows without an acknowledged send and
without a delivery. Artifacts of failed runs stay in --workdir; the exit
status is 1 when any run failed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

# tests/ (brokerproc, workload) and the repository root (bench.procs) on the path, as conftest.py sets them.
_TESTS = Path(__file__).resolve().parent.parent
for _p in (str(_TESTS), str(_TESTS.parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from .scenarios import SCENARIOS, run_scenario, skip_reason  # noqa: E402


def _mode(text: str) -> dict:
    out = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        out[key.strip()] = {"true": True, "false": False}.get(value.strip().lower(), value.strip())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.faults.torture", description=__doc__.split("\n\n")[0])
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated (default: all)")
    p.add_argument("--runs", type=int, default=5, help="runs per scenario")
    p.add_argument("--seed", type=int, default=1, help="first seed; run i uses seed+i")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of faults per run")
    p.add_argument("--mode", default="", help="fix mode choices, e.g. flush=sync,idempotence=true")
    p.add_argument("--workdir", type=Path, default=None, help="artifacts (default: a temp dir)")
    p.add_argument("--json", type=Path, default=None, help="write every run's figures here")
    p.add_argument("--keep", action="store_true", help="keep artifacts of passing runs too")
    args = p.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tidemark-torture-"))
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    fixed = _mode(args.mode)
    rows, failed = [], 0
    for scenario in scenarios:
        why = skip_reason(scenario)
        if why:
            print(f"{scenario}: skipped ({why})", flush=True)
            continue
        for i in range(args.runs):
            seed = args.seed + i
            where = workdir / f"{scenario}-{seed}"
            shutil.rmtree(where, ignore_errors=True)
            outcome = run_scenario(scenario, seed, where, duration=args.duration, mode=fixed)
            print(outcome.describe(), flush=True)
            mode = ",".join(f"{k}={str(v).lower()}" for k, v in outcome.mode.items())
            if not outcome.ok:
                failed += 1
                print(f"  repeat: make torture SCENARIOS={scenario} RUNS=1 SEED={seed} MODE={mode} "
                      f"DURATION={args.duration:g}", flush=True)
            elif not args.keep:
                shutil.rmtree(where, ignore_errors=True)
            rows.append(outcome.to_json())
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    print(table(rows))
    print(f"{len(rows)} runs, {failed} failed; artifacts in {workdir}")
    return 1 if failed else 0


COLUMNS = ("acknowledged", "lost", "unexpected", "duplicated", "recovered", "refused_stored", "misplaced",
           "offsets_backwards", "order", "overlap", "undelivered")


def table(rows: list[dict]) -> str:
    """Runs grouped by scenario and mode: counts summed, windows at their worst."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["scenario"], ",".join(f"{k}={v}" for k, v in r["mode"].items()))].append(r)
    head = ["scenario", "mode", "runs", "failed", *COLUMNS, "max send gap s", "max delivery gap s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (scenario, mode), rs in sorted(groups.items()):
        sums = [sum(r["figures"][c] for r in rs) for c in COLUMNS]
        lines.append("| " + " | ".join(map(str, [
            scenario, mode, len(rs), sum(not r["ok"] for r in rs), *sums,
            max(r["figures"]["send_gap_s"] for r in rs), max(r["figures"]["delivery_gap_s"] for r in rs)])) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
