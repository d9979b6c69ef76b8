"""Broker settings: defaults < TOML file < TIDEMARK_* environment < flags; bad values say what is wrong."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import forkserver
import pytest

from tidemark.broker.config import BrokerConfig, FlushDiskType, load_config, render


def test_defaults_match_the_product_contract():
    c = BrokerConfig()
    assert (c.data_dir, c.port, c.broker_name, c.flush) == (Path("./data"), 10911, "broker-a", FlushDiskType.ASYNC)
    assert c.flush_consumer_offset_interval_ms == 5000 and c.flush_interval_ms == 500
    assert c.commitlog_segment_size == 64 * 1024 * 1024 and c.max_message_size == 4 * 1024 * 1024
    assert c.channel_expired_timeout_ms == 120_000 and c.lock_expiry_ms == 60_000
    assert not c.auto_create_topic
    assert c.delay_levels_ms[:4] == (1000, 5000, 10000, 30000) and len(c.delay_levels_ms) == 18


def test_file_then_environment_then_flags(tmp_path):
    file = tmp_path / "broker.toml"
    file.write_text('[broker]\nport = 20000\nbroker_name = "from-file"\nflush = "sync"\nmetrics_port = 9100\n')
    env = {"TIDEMARK_BROKER_NAME": "from-env", "TIDEMARK_METRICS_PORT": "9200"}
    c = load_config(file=file, env=env, overrides={"metrics_port": "9300"})
    assert c.port == 20000                 # file over default
    assert c.flush is FlushDiskType.SYNC   # file
    assert c.broker_name == "from-env"     # environment over file
    assert c.metrics_port == 9300          # flag over environment


@pytest.mark.parametrize("file_text, env, message", [
    ("[broker]\nport = 99999\n", {}, "port must be 0..65535"),
    ("[broker]\nnot_a_setting = 1\n", {}, "unknown setting 'not_a_setting'"),
    ("[broker\n", {}, "not valid TOML"),
    ("", {"TIDEMARK_PORT": "ten"}, "environment TIDEMARK_PORT: invalid value for port"),
    ("", {"TIDEMARK_AUTO_CREATE_TOPIC": "maybe"}, "expected true/false"),
    ("", {"TIDEMARK_DELAY_LEVELS": "1s 5x"}, "delay level '5x'"),
    ("", {"TIDEMARK_FLUSH": "sometimes"}, "invalid value for flush"),
    # a promote waits the switchover timeout plus a lease for its outcome; its client waits 30 s
    ('[broker]\ncontroller = "etcd://127.0.0.1:2379"\ncontroller_lease_s = 15\nswitchover_timeout_ms = 20000\n', {},
     "plus controller_lease_s .15 s. must be at most 28 s: `tidemark broker promote` waits 30 s"),
])
def test_bad_values_are_refused_with_a_clear_message(tmp_path, file_text, env, message):
    file = tmp_path / "b.toml"
    file.write_text(file_text)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        load_config(file=file, env=env)


def test_a_switchover_that_fits_in_the_promote_deadline_is_accepted(tmp_path):
    c = load_config(file=None, env={}, overrides={"controller": "etcd://127.0.0.1:2379", "controller_lease_s": "8",
                                                  "switchover_timeout_ms": "20000"})
    assert (c.controller_lease_s, c.switchover_timeout_ms) == (8, 20000)


def test_render_is_valid_toml_that_loads_back(tmp_path):
    c = load_config(env={}, overrides={"port": "12345", "broker_name": "b-1", "flush": "sync"})
    file = tmp_path / "effective.toml"
    file.write_text(render(c))
    assert tomllib.loads(render(c))["broker"]["port"] == 12345
    assert load_config(file=file, env={}) == c


def test_print_config_and_usage_errors_from_the_command_line():
    out = forkserver.run([sys.executable, "-m", "tidemark.client.cli.main", "broker", "--print-config", "--port", "1234"],
                         capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert tomllib.loads(out.stdout)["broker"]["port"] == 1234
    bad = forkserver.run([sys.executable, "-m", "tidemark.client.cli.main", "broker", "--port", "-1"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "port must be 0..65535" in bad.stderr


def test_help_lists_every_setting():
    out = forkserver.run([sys.executable, "-m", "tidemark.client.cli.main", "broker", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--retry-queue-nums" in out.stdout and "%RETRY%" in out.stdout


def test_the_broker_lets_its_clients_ping_as_often_as_they_do():
    """A client pings every KEEPALIVE_MS to find a silent connection (a partition that drops packets); a
    broker whose ping policy allowed fewer would send its idle connections away (GOAWAY too_many_pings)
    and cut their streams."""
    from tidemark.client.remoting.connection import KEEPALIVE_MS

    assert BrokerConfig().keepalive_min_interval_ms < KEEPALIVE_MS
