"""config/role.json across promotions and a controller-mode rejoin: the latest role is what loads, a torn
write falls back to the one before, and a forgotten role is gone with its backup (which would otherwise
bring back a master of an older epoch)."""

from __future__ import annotations

import pytest

from tidemark.broker.cluster.roles import ROLE_FILE_NAME, Role, forget_role, load_role, save_role
from tidemark.broker.errors import ConfigFileError


def test_the_latest_role_loads_and_a_lost_file_falls_back_to_the_one_before(tmp_path):
    assert load_role(tmp_path) is None
    save_role(tmp_path, Role(0, 2))
    save_role(tmp_path, Role(0, 3))
    assert load_role(tmp_path) == Role(0, 3)
    (tmp_path / ROLE_FILE_NAME).unlink()
    assert load_role(tmp_path) == Role(0, 2)


def test_a_forgotten_role_is_gone_with_its_backup(tmp_path):
    save_role(tmp_path, Role(0, 2))
    save_role(tmp_path, Role(0, 3))
    forget_role(tmp_path)
    assert load_role(tmp_path) is None
    forget_role(tmp_path)  # nothing to forget: fine
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_file_that_is_not_a_role_refuses_to_start(tmp_path):
    (tmp_path / ROLE_FILE_NAME).write_text('{"brokerId": -1, "epoch": 2}')
    with pytest.raises(ConfigFileError, match="holds no role"):
        load_role(tmp_path)
