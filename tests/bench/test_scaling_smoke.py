"""bench.scaling with tiny sizes, so that it cannot rot.

Runs in-process (no servers): 3 brokers, 50 queues, 5 consumers. Asserts that
every figure docs/scaling.md quotes is produced and positive, and that the
sizes (deterministic) hang together; timings are not asserted.
"""

from __future__ import annotations

import json

from bench import scaling

TINY = ["--brokers", "3", "--queues", "50", "--consumers", "5", "--producers", "2", "--groups", "1,2",
        "--sweep-topics", "10", "--reps", "1"]

EXPECTED = [
    "code.register_interval_s", "code.heartbeat_s", "code.rebalance_s", "code.watch_grace_s",
    "code.offset_flush_s",
    "ns.registration_bytes", "ns.registration_ms", "ns.registrations_per_s", "ns.registration_bytes_per_s",
    "ns.route_bytes", "ns.route_ms", "ns.route_per_s", "ns.cluster_bytes", "ns.cluster_ms",
    "ns.cluster_per_s", "ns.read_cpu", "ns.memory", "ns.memory_per_entry", "ns.max_topics",
    "sweep.10.registration_bytes", "sweep.10.build_ms", "sweep.10.registration_ms", "sweep.10.cluster_ms",
    "sweep.10.memory",
    "hb.request_bytes_owning", "hb.request_bytes_other", "hb.response_bytes", "hb.broker_ms",
    "hb.per_s_per_broker", "hb.bytes_in_per_s_per_broker", "hb.bytes_out_per_s_per_broker",
    "watch.push_bytes", "watch.broker_ms_per_change", "watch.pushes_per_change", "watch.bytes_per_change",
    "watch.formation_bytes_per_broker",
    "rb.pass_ms", "rb.queues_per_consumer_max", "rb.queues_per_consumer_min", "rb.moved_on_join",
    "rb.propagation_s", "rb.crash_detect_s", "rb.silent_detect_s",
    "off.broker.1.bytes", "off.broker.1.encode_ms", "off.broker.1.write_ms", "off.broker.2.bytes",
    "off.all.1.bytes", "off.all.1.encode_ms", "off.all.1.write_ms", "off.all.2.bytes", "off.memory_per_entry",
    "mem.broker_per_queue", "mem.namesrv_per_entry",
]


def test_tiny_run_produces_every_figure(tmp_path, capsys):
    out = tmp_path / "scaling.json"
    work = tmp_path / "work"
    results = scaling.main([*TINY, "--dir", str(work), "--json", str(out)])
    printed = capsys.readouterr().out

    missing = [k for k in EXPECTED if k not in results.rows]
    assert not missing, missing
    for key, row in results.rows.items():
        assert row.value > 0, f"{key} = {row.value}"
        assert row.kind in ("measured", "extrapolated", "derived", "code", "cited"), key
        assert f"| {row.label} |" in printed, key
    assert "| Figure | Value | How |" in printed and "3 brokers, 50 queues" in printed
    assert list(work.iterdir()) == []  # the offset files' temp dir is removed
    assert set(json.loads(out.read_text())["rows"]) == set(results.rows)


def test_sizes_are_deterministic_and_consistent(tmp_path, capsys):
    first = scaling.main([*TINY, "--dir", str(tmp_path)]).rows
    second = scaling.main([*TINY, "--dir", str(tmp_path)]).rows
    capsys.readouterr()
    sizes = [k for k, row in first.items() if row.unit == "B" and row.kind == "measured"
             and not k.endswith("memory") and "memory_per_entry" not in k]
    assert sizes and all(first[k].value == second[k].value for k in sizes)

    v = {k: row.value for k, row in first.items()}
    assert v["ns.registrations_per_s"] == 3 / v["code.register_interval_s"]
    assert v["watch.pushes_per_change"] == 3 * 5
    assert v["hb.request_bytes_owning"] > v["hb.request_bytes_other"]
    assert v["rb.queues_per_consumer_max"] == v["rb.queues_per_consumer_min"] == 10  # 50 queues / 5
    assert v["off.all.1.bytes"] > v["off.broker.1.bytes"] and v["off.all.2.bytes"] > v["off.all.1.bytes"]
    assert v["sweep.10.registration_bytes"] > v["ns.registration_bytes"]
