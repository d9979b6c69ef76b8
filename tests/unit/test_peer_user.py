"""peer_user: the user a broker signs its own calls with (a replica's to its master, registrations), so that
user need not be the super user init_user creates."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tidemark.broker.config import load_config, render
from tidemark.broker.controller import BrokerController


def peer_credentials(config):
    return BrokerController._peer_credentials(SimpleNamespace(config=config))


def test_peer_user_signs_the_brokers_own_calls_and_init_user_only_without_it(tmp_path):
    peer = tmp_path / "peer_user"
    peer.write_text("broker:a-peer-secret\n")
    config = load_config(env={"TIDEMARK_INIT_USER": "root:a-root-secret", "TIDEMARK_PEER_USER_FILE": str(peer)})
    assert (peer_credentials(config).access_key, peer_credentials(config).secret_key) == ("broker", "a-peer-secret")
    assert "a-peer-secret" not in repr(config) and "a-peer-secret" not in render(config)
    alone = load_config(env={"TIDEMARK_INIT_USER": "root:a-root-secret"})
    assert peer_credentials(alone).access_key == "root"
    assert peer_credentials(load_config(env={})) is None


def test_a_malformed_peer_user_is_refused_naming_it():
    with pytest.raises(ValueError, match="peer_user must be NAME:SECRET"):
        load_config(env={"TIDEMARK_PEER_USER": "broker:short"})
