"""Tables, the docs/benchmarks.md section between marker lines, the chart, machine facts."""

from __future__ import annotations

import math
import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from bench.procs import REPO
from bench.workloads import CURVE_RATES, MESSAGE_SIZE, PERCENTILES, WORKLOAD_TITLES

PEERS_BEGIN, PEERS_END = "<!-- bench:peers:begin -->", "<!-- bench:peers:end -->"
PEERS = ("redis", "nats")

# workload -> [(metric, label, higher is better)]
_CPU = ("server_cpu_ms_per_1k", "server CPU ms / 1k", False)
METRICS = {
    "produce": [("rate", "msgs/s", True), _CPU],
    "produce_sync": [("rate", "msgs/s", True), _CPU],
    "consume": [("rate", "msgs/s", True), _CPU],
    "commit": [("rate", "commits/s", True), _CPU],
    "latency": [("p50_ms", "p50 ms", False), ("p99_ms", "p99 ms", False), _CPU],
    "membership": [("join_first_ms", "join -> 1st msg ms", False), ("duplicates", "duplicates", False)],
    "send": [("p50_us", "send p50 us", False), ("p99_us", "send p99 us", False),
             ("batch_rate", "send_batch(32) msgs/s", True)],
    "latency_curve": [(f"{kind}_{name}_ms@{rate}", f"{label} {name} ms at {rate:,}/s", False)
                      for rate in CURVE_RATES for kind, label in (("e2e", "e2e"), ("pub", "publish"))
                      for name, _ in PERCENTILES],
}
# Which echo figure is the ceiling of which workload.
ECHO_NOTE = {"produce": "32 x 1 KiB per frame", "consume": "32 x 1 KiB per frame",
             "commit": "1 KiB per frame", "latency": "1 KiB round trip", "send": "blocking unary call of 1 KiB"}


def brief(workload: str, r: dict) -> str:
    if not r:
        return "n/a"
    return "  ".join(f"{label}={_fmt(r.get(m))}" for m, label, _ in METRICS[workload] if m in r) + (
        f"  missing={r['missing']}" if r.get("missing") else "")


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float) and abs(v) < 100:
        return f"{v:.2f}"
    return f"{v:,.0f}"


def _ratio(t, p) -> str:
    if t is None or p is None or p == 0 or any(isinstance(x, float) and math.isnan(x) for x in (t, p)):
        return "-"
    return f"{t / p:.2f}x"


def _pkg(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def machine_facts() -> dict:
    mem_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    cpu = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "")
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    return {"cores": os.cpu_count(), "ram_gib": round(mem_kb / 1024 / 1024, 1), "cpu": cpu,
            "kernel": platform.release(), "os": _os_name(), "python": platform.python_version(),
            "load_avg_start": [round(x, 2) for x in os.getloadavg()], "commit": commit,
            "clients": {p: _pkg(p) for p in ("grpcio", "protobuf", "redis", "hiredis", "nats-py")}}


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.system()


def _rows(run: dict) -> list[tuple]:
    """(workload title, metric label, {system: value}, higher_better) for every metric measured."""
    rows = []
    for workload, metrics in METRICS.items():
        by_system = run["medians"].get(workload)
        if not by_system:
            continue
        for metric, label, higher in metrics:
            rows.append((workload, label, {k: v.get(metric) for k, v in by_system.items()}, higher))
    return rows


def _columns(run: dict) -> list[str]:
    return [k for k in ("tidemark", "redis", "nats", "echo") if k in run["names"]]


def console_table(run: dict) -> str:
    cols = _columns(run)
    peers = [p for p in PEERS if p in cols]
    head = ["workload", "metric", *[run["names"][c].split(" (")[0] for c in cols],
            *[f"T/{run['names'][p].split()[0]}" for p in peers], *(["T/echo"] if "echo" in cols else [])]
    lines = [head]
    for workload, label, vals, _ in _rows(run):
        t = vals.get("tidemark")
        lines.append([WORKLOAD_TITLES[workload], label, *[_fmt(vals.get(c)) for c in cols],
                      *[_ratio(t, vals.get(p)) for p in peers], *([_ratio(t, vals.get("echo"))] if "echo" in cols else [])])
    widths = [max(len(str(r[i])) for r in lines) for i in range(len(head))]
    text = [f"bench: medians of {run['rounds']} round(s); ratios are Tidemark / other "
            "(throughput: >1 = Tidemark faster; latency and time: <1 = Tidemark better)"]
    text += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in lines]
    for key, why in run["skipped"].items():
        text.append(f"bench: skipped {key}: {why}")
    text += [f"bench: note: {n}" for n in run["notes"]] + [f"bench: error: {e}" for e in run["errors"]]
    return "\n".join(text)


def markdown_section(run: dict, chart: Path, out: Path) -> str:
    cols = _columns(run)
    peers = [p for p in PEERS if p in cols]
    names = run["names"]
    m, s = run["machine"], run["sizes"]
    lines = [PEERS_BEGIN, "## Tidemark and its peers (`python -m bench`)", "",
             f"Generated by `{run['command']}` (wired to `make bench`) at commit `{m['commit']}`"
             f"{' — SMOKE RUN, tiny counts, numbers meaningless' if run.get('smoke') else ''}. "
             f"Medians of {run['rounds']} round(s); in each round every workload ran against every system in turn "
             f"(Tidemark, Redis, NATS, echo), each client in its own process, all servers on 127.0.0.1. "
             f"Ratios are Tidemark / peer: for throughput above 1 means Tidemark is faster, for latency and "
             f"times below 1 means Tidemark is better. 'server CPU ms / 1k' is the CPU (user + system) the "
             f"server process used during the workload per 1,000 messages (or commits).", ""]
    head = ["Workload", "Metric", *[names[c] for c in cols], *[f"Tidemark / {names[p]}" for p in peers],
            *(["Tidemark / echo"] if "echo" in cols else [])]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for workload, label, vals, _ in _rows(run):
        t = vals.get("tidemark")
        cells = [WORKLOAD_TITLES[workload], label, *[_fmt(vals.get(c)) for c in cols],
                 *[_ratio(t, vals.get(p)) for p in peers], *([_ratio(t, vals.get("echo"))] if "echo" in cols else [])]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("| durable storage | flush policy | " + " | ".join(run["settings"][c].get("flush", "-") for c in cols)
                 + " |" + " |" * (len(head) - 2 - len(cols)))
    lines += ["", f"![throughput per system and workload]({os.path.relpath(chart, out.parent)})", ""]
    if run["medians"].get("latency_curve"):
        lines += [f"![latency at fixed rates]({os.path.relpath(curve_path(chart), out.parent)})", ""]
    lines += [
              "### Workloads", "",
              f"Every message is {MESSAGE_SIZE} bytes (send time, sequence number, padding); the same counts "
              "for every system.",
              f"1. Produce {s['messages']:,} messages from one process, each system's way to keep several in "
              f"flight: Tidemark Producer.send_async per message (the producer batches them into record "
              f"batches on its Produce stream), Redis pipelines of {s['batch']}, JetStream async publish with a "
              "window of outstanding acks. Durable storage, each system's default flush policy (see settings). "
              "1b: the same against a second Tidemark broker with sync flush (a send is acknowledged once "
              "fsynced, group commit).",
              f"2. Consume those {s['messages']:,} with one group of {s['consumers']} consumer processes, "
              "committing/acking as each system does by default; from the first consumer's start to the last "
              "message received. Consumers start one after another, each once the previous one has joined "
              "(a rolling start, the same for every system).",
              f"3. Commits only: {s['commit_queues']} queues x {s['commits_per_queue']:,} commits. One commit = "
              "one queue offset (Tidemark) = one XACK of one id (Redis) = one ack of one message (JetStream), "
              "against real pending entries/deliveries; timed until the server has applied all of them.",
              f"4. End-to-end latency (send -> listener/handler) at a fixed {s['latency_rate']:,} msg/s for "
              f"{s['latency_seconds']:g} s, one consumer process; each message carries the time it was due, so a "
              "sender that falls behind shows as latency; the first 0.5 s is warm-up. Every message is sent as "
              "it falls due: Producer.send_async (Tidemark, default linger 0), a pipeline of the due ones "
              "(Redis), async publishes (JetStream).",
              f"5. Group membership change: {s['busy_consumers']} consumers under {s['busy_rate']:,} msg/s; "
              f"after {s['join_after_s']:g} s a third (already started process) joins: time from its join call "
              "to its first message; duplicates = deliveries beyond the first of any message, over the whole run.",
              f"6. Synchronous sends from one thread: {s['sends']:,} sends of one message, each waiting for its "
              f"answer (p50/p99), then as many in batches of {s['batch']} (msgs/s): Producer.send and "
              f"Producer.send_batch (Tidemark, defaults: idempotent), one XADD and a pipeline of {s['batch']} "
              "XADD (Redis); the echo figure is a blocking gRPC client's unary call of 1 KiB, the floor of a "
              "synchronous send over gRPC.",
              f"7. Latency at fixed rates ({', '.join(f'{r:,}' for r in CURVE_RATES)} msg/s, "
              f"{s['curve_seconds']:g} s each), as the OpenMessaging Benchmark reports it: one topic of 16 queues "
              "(Redis, JetStream: one stream), one producer process sending each message as it falls due, a "
              "group of two consumer processes; publish latency is due -> acknowledged, end to end is due -> "
              "handed to the listener; p50/p99/p99.9 over both consumers, the first half second left out.",
              "", "### Settings", ""]
    for key in cols:
        lines.append(f"- **{names[key]}** ({run['versions'][key]}): " + "; ".join(
            f"{k}: {v}" for k, v in run["settings"][key].items()))
    lines += ["", "### Machine", "",
              f"- {m['cores']} cores ({m['cpu']}), {m['ram_gib']} GiB RAM, {m['os']}, kernel {m['kernel']}",
              f"- Python {m['python']}; clients: " + ", ".join(f"{k} {v}" for k, v in m["clients"].items()),
              f"- load average at start {m['load_avg_start']}, at end "
              f"{[round(x, 2) for x in run['machine_end_load']]}; whole run {run['elapsed_s']:.0f} s"]
    extra = [f"- skipped {k}: {v}" for k, v in run["skipped"].items()] + [f"- note: {n}" for n in run["notes"]] + [
        f"- error: {e}" for e in run["errors"]]
    if extra:
        lines += ["", "### Notes", "", *extra]
    lines.append(PEERS_END)
    return "\n".join(lines)


def replace_section(path: Path, begin: str, end: str, section: str) -> None:
    """Put section (which starts with begin and ends with end) in path, touching nothing outside the markers."""
    text = path.read_text("utf-8") if path.exists() else "# Benchmarks\n"
    i, j = text.find(begin), text.find(end)
    if i >= 0 and j > i:
        text = text[:i] + section + text[j + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, "utf-8")


def write_markdown(out: Path, run: dict, chart: Path) -> None:
    replace_section(out, PEERS_BEGIN, PEERS_END, markdown_section(run, chart, out))


def curve_path(chart: Path) -> Path:
    """Where the latency curve's chart goes, beside the main one."""
    return chart.with_name(chart.stem + "-latency" + chart.suffix)


def write_curve_chart(path: Path, run: dict) -> bool:
    """Workload 7's chart: end-to-end and publish latency (p50 solid, p99 dashed) against the rate, per system;
    False when matplotlib is missing or the workload did not run."""
    curve = run["medians"].get("latency_curve")
    try:
        import matplotlib
    except ImportError:
        return False
    if not curve:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"tidemark": "#1f77b4", "redis": "#d62728", "nats": "#2ca02c"}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax, kind, title in ((axes[0], "e2e", "End to end (due -> listener)"),
                            (axes[1], "pub", "Publish (due -> acknowledged)")):
        drawn = False
        for key, values in curve.items():
            for name, style in (("p50", "-"), ("p99", "--")):
                points = [(r, values.get(f"{kind}_{name}_ms@{r}")) for r in CURVE_RATES]
                points = [(r, v) for r, v in points if v is not None and not math.isnan(v) and v > 0]
                if points:
                    ax.plot(*zip(*points, strict=True), style, marker="o", color=colors.get(key),
                            label=f"{run['names'][key]} {name}")
                    drawn = True
        ax.set_xscale("log")
        if drawn:
            ax.set_yscale("log")
        ax.set_xlabel("rate, msg/s (1 KiB, 16 queues, 1 producer, group of 2)")
        ax.set_ylabel("ms, log scale")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Latency at fixed rates, medians of {run['rounds']} round(s)"
                 + (" (smoke run)" if run.get("smoke") else ""), fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_chart(path: Path, run: dict) -> bool:
    """The PNG chart; False when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = _columns(run)
    names, med = run["names"], run["medians"]
    colors = {"tidemark": "#1f77b4", "redis": "#d62728", "nats": "#2ca02c", "echo": "#7f7f7f"}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8), gridspec_kw={"width_ratios": [3, 2, 1.4]})
    panels = [
        (axes[0], [("produce", "rate", "1. produce"), ("consume", "rate", "2. consume (4)"),
                   ("commit", "rate", "3. commits")], "msgs/s (commits/s), log scale", "Throughput (higher is better)",
         cols),
        (axes[1], [("latency", "p50_ms", "p50"), ("latency", "p99_ms", "p99")], "ms, log scale",
         "4. Latency at fixed rate (lower is better)", cols),
        (axes[2], [("membership", "join_first_ms", "join -> 1st msg")], "ms", "5. Group membership change",
         [c for c in cols if c != "echo"]),
    ]
    for ax, groups, ylabel, title, systems in panels:
        width = 0.8 / max(1, len(systems))
        for i, key in enumerate(systems):
            vals = [med.get(w, {}).get(key, {}).get(metric, float("nan")) for w, metric, _ in groups]
            xs = [g + (i - (len(systems) - 1) / 2) * width for g in range(len(groups))]
            bars = ax.bar(xs, vals, width, label=names[key], color=colors[key],
                          hatch="//" if key == "echo" else None, alpha=0.6 if key == "echo" else 1.0)
            for b, v in zip(bars, vals, strict=True):
                if not math.isnan(v):
                    ax.annotate(_fmt(v), (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom",
                                fontsize=7, rotation=90 if len(systems) > 3 else 0)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([label for _, _, label in groups])
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        measured = [v for w, metric, _ in groups for key in systems
                    if (v := med.get(w, {}).get(key, {}).get(metric)) is not None and v > 0]
        if not measured:  # a panel none of the chosen workloads measured: say so instead of an empty log axis
            ax.text(0.5, 0.5, "not measured in this run", ha="center", va="center", transform=ax.transAxes)
        elif "log" in ylabel:
            ax.set_yscale("log")
        ax.margins(y=0.25)
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle(f"Tidemark vs peers, {MESSAGE_SIZE} B messages, medians of {run['rounds']} round(s), "
                 f"{run['machine']['cores']} cores" + (" — SMOKE" if run.get("smoke") else ""), fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


CLIENT_BEGIN, CLIENT_END = "<!-- bench:client:begin -->", "<!-- bench:client:end -->"
CLIENT_PARTS = ("e2e", "rebalance")


def write_client_part(path: Path, part: str, body: str) -> None:
    """Replace one part (bench.client_e2e or bench.rebalance) inside the bench:client section of path,
    creating the section (with an empty slot for each part) when it is missing."""
    begin, end = f"<!-- bench:client:{part}:begin -->", f"<!-- bench:client:{part}:end -->"
    text = path.read_text("utf-8") if path.exists() else ""
    i, j = text.find(CLIENT_BEGIN), text.find(CLIENT_END)
    if i >= 0 and j > i:
        section = text[i:j + len(CLIENT_END)]
    else:
        slots = "\n".join(f"<!-- bench:client:{p}:begin -->\n<!-- bench:client:{p}:end -->" for p in CLIENT_PARTS)
        section = f"{CLIENT_BEGIN}\n## Client library and consumer groups (`python -m bench.client_e2e`, " \
                  f"`python -m bench.rebalance`)\n\n{slots}\n{CLIENT_END}"
    a, b = section.find(begin), section.find(end)
    if a < 0 or b < a:
        section = section.replace(CLIENT_END, f"{begin}\n{end}\n{CLIENT_END}")
        a, b = section.find(begin), section.find(end)
    section = section[:a] + begin + "\n" + body.strip("\n") + "\n" + section[b:]
    replace_section(path, CLIENT_BEGIN, CLIENT_END, section)


def markdown_table(head: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_fmt(c) if not isinstance(c, str) else c for c in r) + " |" for r in rows]
    return "\n".join(lines)


def machine_line(m: dict) -> str:
    return (f"{m['cores']} cores ({m['cpu']}), {m['ram_gib']} GiB RAM, {m['os']}, Python {m['python']}, "
            f"grpcio {m['clients']['grpcio']}, commit `{m['commit']}`, load average at start {m['load_avg_start']}")
