"""How a client chooses between name servers and a broker list (ClientSettings, the CLI)."""

from __future__ import annotations

import pytest

from tidemark.client.cli.main import main
from tidemark.client.errors import InvalidArgumentError
from tidemark.client.settings import ClientSettings, parse_addresses


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.delenv("TIDEMARK_BROKER", raising=False)
    monkeypatch.setenv("TIDEMARK_NAMESRV", "ns1:9876,ns2:9876")


def test_the_environments_name_servers_are_used_unless_brokers_are_given():
    s = ClientSettings()
    assert (s.namesrv, s.brokers) == (("ns1:9876", "ns2:9876"), ())
    s = ClientSettings(brokers="b:10911")  # an explicit broker list wins over the environment
    assert (s.namesrv, s.brokers) == ((), ("b:10911",))
    s = ClientSettings(brokers="b:10911", namesrv=["n:1"])  # both given: the name servers are used
    assert s.namesrv == ("n:1",)


def test_without_name_servers_the_default_broker_is_used(monkeypatch):
    monkeypatch.delenv("TIDEMARK_NAMESRV")
    assert (ClientSettings().namesrv, ClientSettings().brokers) == ((), ("127.0.0.1:10911",))
    assert ClientSettings(namesrv="").brokers == ("127.0.0.1:10911",)


@pytest.mark.parametrize("bad", ["nohost", "h:0", "h:70000", ["h:1", "x"]])
def test_a_bad_name_server_address_is_named(bad):
    with pytest.raises(InvalidArgumentError, match="name server address '.*' is not host:port"):
        ClientSettings(namesrv=bad)


def test_a_bad_environment_value_is_reported_as_such(monkeypatch, capsys):
    monkeypatch.setattr("tidemark.client.cli.main.setup_logging", lambda *args, **kwargs: None)  # the process's logging
    monkeypatch.setenv("TIDEMARK_NAMESRV", "broken")
    with pytest.raises(SystemExit) as e:
        main(["topic", "list"])
    assert e.value.code == 2
    assert "name server address 'broken' is not host:port" in capsys.readouterr().err


def test_a_port_of_digits_python_cannot_read_as_a_number_is_refused_not_a_traceback():
    # str.isdigit() is true for '¹' and '٣' (found by the CLI fuzz test); int() raises on the first.
    for bad in ("127.0.0.1:¹", "h:٣٣", "h:１０９１１"):
        with pytest.raises(InvalidArgumentError, match="is not host:port"):
            parse_addresses(bad, "name server")
