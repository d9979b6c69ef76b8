"""Secrets through NAME_FILE (common/env_secrets.py): the broker's secret settings, the name server's
broker user and the client's secret key read a mounted file instead of an environment variable."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tidemark.broker.config import load_config
from tidemark.client.errors import InvalidArgumentError
from tidemark.client.security import credentials_from_env
from tidemark.common.env_secrets import secret_from_env


def test_the_value_wins_then_the_file_without_its_newline(tmp_path):
    f = tmp_path / "s"
    f.write_text("from-file\n")
    assert secret_from_env({"K": "v", "K_FILE": str(f)}, "K") == "v"
    assert secret_from_env({"K_FILE": str(f)}, "K") == "from-file"
    assert secret_from_env({"K": "", "K_FILE": str(f)}, "K") == "from-file"
    assert secret_from_env({}, "K") == ""


def test_an_unreadable_file_is_one_line_naming_the_variable(tmp_path):
    with pytest.raises(ValueError, match=r"^K_FILE=.*/missing: cannot read it \(No such file or directory\)$"):
        secret_from_env({"K_FILE": str(tmp_path / "missing")}, "K")


def test_broker_secret_settings_read_files_and_other_settings_do_not(tmp_path):
    user = tmp_path / "init_user"
    user.write_text("root:a-long-secret\n")
    config = load_config(env={"TIDEMARK_INIT_USER_FILE": str(user), "TIDEMARK_CONTROLLER_USER_FILE": str(user),
                              "TIDEMARK_BROKER_NAME_FILE": str(user)})
    assert (config.init_user, config.controller_user, config.broker_name) == (
        "root:a-long-secret", "root:a-long-secret", "broker-a")
    assert "a-long-secret" not in repr(config)
    with pytest.raises(ValueError, match="TIDEMARK_INIT_USER_FILE="):
        load_config(env={"TIDEMARK_INIT_USER_FILE": str(tmp_path / "nope")})


def test_client_secret_key_from_a_file(tmp_path):
    f = tmp_path / "secret_key"
    f.write_text("s3cret\n")
    creds = credentials_from_env({"TIDEMARK_ACCESS_KEY": "root", "TIDEMARK_SECRET_KEY_FILE": str(f)})
    assert (creds.access_key, creds.secret_key) == ("root", "s3cret")
    with pytest.raises(InvalidArgumentError, match="TIDEMARK_SECRET_KEY_FILE"):
        credentials_from_env({"TIDEMARK_ACCESS_KEY": "root", "TIDEMARK_SECRET_KEY_FILE": str(tmp_path / "x")})


def test_the_name_server_refuses_an_unreadable_broker_user_file_in_one_line(tmp_path):
    env = {"TIDEMARK_BROKER_USER_FILE": str(tmp_path / "missing"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "tidemark.broker.namesrv.server", "--port", "0"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"tidemark namesrv: TIDEMARK_BROKER_USER_FILE={tmp_path / 'missing'}: cannot read it (No such file or "
        f"directory)"]


def test_the_cli_takes_its_secret_key_from_a_file(tmp_path, monkeypatch):
    import argparse

    from tidemark.client.cli.connect import resolve

    f = tmp_path / "secret_key"
    f.write_text("s3cret\n")
    for key in ("TIDEMARK_SECRET_KEY", "TIDEMARK_TLS_CA_FILE", "TIDEMARK_TLS_CERT_FILE", "TIDEMARK_TLS_KEY_FILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TIDEMARK_ACCESS_KEY", "root")
    monkeypatch.setenv("TIDEMARK_SECRET_KEY_FILE", str(f))
    args = argparse.Namespace(access_key=None, secret_key=None, tls=False, tls_ca_file=None, tls_cert_file=None,
                              tls_key_file=None, tls_server_name=None)
    resolve(args)
    assert (args.credentials.access_key, args.credentials.secret_key) == ("root", "s3cret")
    monkeypatch.setenv("TIDEMARK_SECRET_KEY_FILE", str(tmp_path / "gone"))
    with pytest.raises(InvalidArgumentError, match="TIDEMARK_SECRET_KEY_FILE=.*cannot read it"):
        resolve(args)
