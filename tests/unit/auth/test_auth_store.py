"""AuthStore (broker/auth/store.py): users.json and acls.json, validation, reloads and every failure mode."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import stat

import pytest

from tidemark.broker.auth import AclRule, Action, AuthStore, Decision, Resource, User
from tidemark.broker.disk import metadata_file
from tidemark.broker.errors import (
    AlreadyExistsError,
    ConfigFileError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    StoreError,
)

SECRET = "alice-secret-1"


def rule(user="alice", resource="Topic:orders", actions=(Action.PUB,), decision=Decision.ALLOW, ips=()):
    return AclRule(user, Resource.parse(resource), frozenset(actions), decision, tuple(ips))


@pytest.fixture
def store(tmp_path) -> AuthStore:
    s = AuthStore(tmp_path)
    s.load()
    return s


def reopen(tmp_path) -> AuthStore:
    s = AuthStore(tmp_path)
    s.load()
    return s


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_missing_files_are_an_empty_store(store):
    assert (store.users(), store.rules(), store.has_users()) == ([], [], False)


def test_users_and_rules_survive_a_restart_in_rocketmq_shaped_files(store, tmp_path):
    store.create_user("alice", SECRET)
    store.create_user("root", "root-secret-1", super_user=True)
    store.create_rule(rule(ips=("10.0.0.0/8",)))
    store.create_rule(rule(resource="Group:billing-*", actions=(Action.SUB, Action.PUB), decision=Decision.DENY))
    again = reopen(tmp_path)
    assert again.users() == [User("alice", SECRET), User("root", "root-secret-1", super_user=True)]
    assert again.rules() == store.rules() and len(again.rules()) == 2
    users = json.loads((tmp_path / "users.json").read_text())
    assert users["users"]["alice"] == {"username": "alice", "password": SECRET, "userType": "Normal"}
    acls = json.loads((tmp_path / "acls.json").read_text())
    entries = acls["acls"]["User:alice"]["policies"][0]["entries"]
    assert entries[0] == {"resource": "Topic:orders", "actions": ["Pub"], "sourceIps": ["10.0.0.0/8"],
                          "decision": "Allow"}
    assert entries[1]["actions"] == ["Pub", "Sub"] and entries[1]["decision"] == "Deny"


def test_files_are_written_0600_whatever_the_umask(store, tmp_path):
    old = os.umask(0o000)
    try:
        store.create_user("alice", SECRET)
        store.create_user("bob", "bob-secret-1")  # a second write keeps the first as .bak
        store.create_rule(rule())
    finally:
        os.umask(old)
    for name in ("users.json", "users.json.bak", "acls.json"):
        assert mode(tmp_path / name) == 0o600, name


def test_a_hand_made_file_readable_by_others_is_tightened_at_load(tmp_path, caplog):
    path = tmp_path / "users.json"
    path.write_text(json.dumps({"users": {"alice": {"username": "alice", "password": SECRET}}}))
    os.chmod(path, 0o644)
    with caplog.at_level(logging.WARNING, "tidemark.broker.auth"):
        assert reopen(tmp_path).user("alice") == User("alice", SECRET)
    assert mode(path) == 0o600
    assert "mode is now 0600" in caplog.text


def test_secrets_never_reach_the_log_or_error_messages(store, caplog):
    with caplog.at_level(logging.DEBUG):
        store.create_user("alice", SECRET)
        store.update_user("alice", secret_key="alice-secret-2", super_user=True)
        store.create_user("bob", "bob-secret-1", super_user=True)
        store.delete_user("alice")
        with pytest.raises(InvalidArgumentError) as bad:
            store.create_user("carol", "short")
    assert not any(s in caplog.text for s in (SECRET, "alice-secret-2", "bob-secret-1"))
    assert "short" not in str(bad.value) and "got 5 characters" in str(bad.value)


@pytest.mark.parametrize("name", ["", "a" * 65, "bad name", "ünï", "a/b", "a:b"])
def test_bad_user_names_are_refused(store, name):
    with pytest.raises(InvalidArgumentError, match="user name"):
        store.create_user(name, SECRET)


@pytest.mark.parametrize("secret", ["1234567", "x" * 257, "has space1", "tab\there1", "nön-ascii1"])
def test_bad_secrets_are_refused(store, secret):
    with pytest.raises(InvalidArgumentError, match="secret key must be 8 to 256 visible"):
        store.create_user("alice", secret)


def test_user_lifecycle(store):
    assert store.create_user("a.b_c-1", "x" * 8) == User("a.b_c-1", "x" * 8)
    store.create_user("root", "root-secret-1", super_user=True)
    with pytest.raises(AlreadyExistsError, match="'root' already exists"):
        store.create_user("root", "another-secret")
    assert store.update_user("a.b_c-1", super_user=True).super_user
    assert store.update_user("a.b_c-1", secret_key="y" * 256).secret_key == "y" * 256
    with pytest.raises(InvalidArgumentError, match="nothing to update"):
        store.update_user("root")
    with pytest.raises(NotFoundError, match="'ghost' does not exist"):
        store.update_user("ghost", super_user=True)
    with pytest.raises(NotFoundError):
        store.delete_user("ghost")
    assert [u.name for u in store.users()] == ["a.b_c-1", "root"]


def test_the_last_super_user_can_be_neither_deleted_nor_demoted(store):
    store.create_user("root", "root-secret-1", super_user=True)
    store.create_user("alice", SECRET)
    with pytest.raises(FailedPreconditionError, match="last super user"):
        store.delete_user("root")
    with pytest.raises(FailedPreconditionError, match="last super user"):
        store.update_user("root", super_user=False)
    store.update_user("alice", super_user=True)
    store.update_user("root", super_user=False)
    assert [u.name for u in store.users() if u.super_user] == ["alice"]


def test_deleting_a_user_deletes_its_rules(store):
    store.create_user("alice", SECRET)
    store.create_user("bob", "bob-secret-1")
    store.create_rule(rule())
    store.create_rule(rule(resource="Topic:*", decision=Decision.DENY))
    store.create_rule(rule(user="bob"))
    assert store.delete_user("alice") == 2
    assert store.rules() == [rule(user="bob")] and store.rules("alice") == []


def test_rules_need_an_existing_user_and_are_not_duplicated(store):
    with pytest.raises(NotFoundError, match="'alice' does not exist"):
        store.create_rule(rule())
    store.create_user("alice", SECRET)
    store.create_rule(rule())
    with pytest.raises(AlreadyExistsError, match="already has this rule on Topic:orders"):
        store.create_rule(rule())
    store.create_rule(rule(ips=("10.0.0.0/8",)))  # the same rule from fewer sources is another rule
    assert len(store.rules("alice")) == 2


def test_delete_rules_by_resource_or_all(store):
    store.create_user("alice", SECRET)
    for r in (rule(), rule(actions=(Action.SUB,)), rule(resource="Topic:orders-*"), rule(resource="Cluster")):
        store.create_rule(r)
    assert store.delete_rules("alice", Resource.parse("Topic:orders")) == 2
    with pytest.raises(NotFoundError, match="no ACL rule on Topic:orders$"):
        store.delete_rules("alice", Resource.parse("Topic:orders"))
    assert [str(r.resource) for r in store.rules("alice")] == ["Topic:orders-*", "Cluster"]
    assert store.delete_rules("alice") == 2
    with pytest.raises(NotFoundError, match="'alice' has no ACL rule"):
        store.delete_rules("alice")


def test_authorize_uses_the_current_rules(store):
    alice = store.create_user("alice", SECRET)
    orders = Resource.topic("orders")
    assert store.authorize(alice, orders, Action.PUB, "10.0.0.1") is Decision.DENY
    store.create_rule(rule())
    assert store.authorize(alice, orders, Action.PUB, "10.0.0.1") is Decision.ALLOW
    store.create_rule(rule(decision=Decision.DENY, ips=("10.0.0.0/8",)))
    assert store.authorize(alice, orders, Action.PUB, "10.0.0.1") is Decision.DENY
    assert store.authorize(alice, orders, Action.PUB, "192.168.0.1") is Decision.ALLOW


def test_initial_user_is_created_only_on_an_empty_store(store, tmp_path):
    assert store.ensure_initial_user("admin", "admin-secret-1")
    assert store.user("admin") == User("admin", "admin-secret-1", super_user=True)
    assert not store.ensure_initial_user("admin", "other-secret-1")
    assert not store.ensure_initial_user("root", "root-secret-1")
    assert reopen(tmp_path).users() == [User("admin", "admin-secret-1", super_user=True)]


@pytest.mark.parametrize("name, text, reason", [
    ("users.json", "{not json", "not valid JSON"),
    ("users.json", '{"users": {"alice": {"username": "alice", "password": "short"}}}', "secret key must be"),
    ("users.json", '{"users": {"alice": {"username": "bob", "password": "long-enough"}}}', "has username 'bob'"),
    ("users.json", '{"users": {"alice": {"password": "long-enough", "userType": "Root"}}}', "userType 'Root'"),
    ("acls.json", '{"acls": {"alice": {}}}', "'User:NAME'"),
    ("acls.json", '{"acls": {"User:alice": {"policies": [{"entries": [{"resource": "Topic:o", "actions": ["Pub"],'
                  ' "decision": "Allow", "sourceIps": ["10.0.0.1/8"]}]}]}}}', "host bits set"),
    ("acls.json", '{"acls": {"User:alice": {"policies": [{"entries": [{"resource": "Topic:o",'
                  ' "decision": "Allow"}]}]}}}', "policies\\[0\\].entries\\[0\\] is malformed"),
])
def test_an_unusable_file_at_start_stops_the_broker_saying_why(tmp_path, name, text, reason):
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigFileError, match=reason):
        reopen(tmp_path)


def test_a_damaged_or_deleted_file_stops_the_start_instead_of_falling_back_to_its_backup(store, tmp_path):
    """The .bak is the file before the last write: it could hold a rotated secret or miss a new Deny."""
    store.create_user("alice", SECRET)
    store.create_user("bob", "bob-secret-1")
    (tmp_path / "users.json").write_text("{garbage")
    with pytest.raises(ConfigFileError, match=r"users.json cannot be used: not valid JSON"):
        reopen(tmp_path)
    (tmp_path / "users.json").unlink()
    with pytest.raises(ConfigFileError, match=r"missing while its backup users.json.bak exists"):
        reopen(tmp_path)


def edit(path, doc) -> None:
    """A hand edit: a new file (new inode), so the change is seen even within one mtime tick."""
    tmp = path.with_name(path.name + ".edit")
    tmp.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    os.replace(tmp, path)


def test_hand_edits_are_reloaded_and_our_own_writes_are_not(store, tmp_path):
    store.create_user("alice", SECRET)
    assert not store.reload_if_changed()  # what we wrote ourselves
    users = json.loads((tmp_path / "users.json").read_text())
    users["users"]["bob"] = {"username": "bob", "password": "bob-secret-1", "userType": "Super"}
    edit(tmp_path / "users.json", users)
    edit(tmp_path / "acls.json", {"acls": {"User:alice": {"subject": "User:alice", "policies": [
        {"policyType": "Custom", "entries": [{"resource": "Topic:*", "actions": ["Sub"], "decision": "Allow"}]}]}}})
    assert store.reload_if_changed()
    assert store.user("bob") == User("bob", "bob-secret-1", super_user=True)
    assert store.rules("alice") == [rule(resource="Topic:*", actions=(Action.SUB,))]
    assert not store.reload_if_changed()


def test_a_malformed_edit_keeps_the_previous_rules_and_warns_once_until_the_file_changes(store, tmp_path, caplog):
    store.create_user("alice", SECRET)
    store.create_rule(rule(decision=Decision.DENY))
    before = store.rules()
    with caplog.at_level(logging.WARNING, "tidemark.broker.auth"):
        edit(tmp_path / "acls.json", '{"acls": {"User:alice": {"policies": [{"entries": [{"resource": "Topic:o",'
                                     ' "actions": ["Publish"], "decision": "Allow"}]}]}}}')
        for _ in range(3):
            assert not store.reload_if_changed()
        warnings = [r for r in caplog.records if getattr(r, "tm_event", None) == "auth_reload_failed"]
        assert len(warnings) == 1
        assert "unknown action 'Publish'" in warnings[0].getMessage()
        assert store.rules() == before  # the Deny is still in force
        edit(tmp_path / "acls.json", "")  # changed again, still unusable: one more warning
        assert not store.reload_if_changed()
        assert len([r for r in caplog.records if getattr(r, "tm_event", None) == "auth_reload_failed"]) == 2
    edit(tmp_path / "acls.json", {"acls": {}})
    assert store.reload_if_changed() and store.rules() == []


def test_a_deleted_file_reloads_as_empty(store, tmp_path):
    store.create_user("alice", SECRET)
    store.create_rule(rule())
    (tmp_path / "acls.json").unlink()
    assert store.reload_if_changed()
    assert store.rules() == [] and store.user("alice") is not None


class Disk:
    """Stands in for metadata_file.save_json; full until freed."""

    def __init__(self, monkeypatch) -> None:
        self.full = False
        self._real = metadata_file.save_json
        monkeypatch.setattr(metadata_file, "save_json", self)

    def __call__(self, path, doc, **kw) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        self._real(path, doc, **kw)


def test_a_change_the_disk_cannot_take_is_refused_and_rolled_back(store, tmp_path, monkeypatch):
    disk = Disk(monkeypatch)

    async def flush():
        """As the broker flushes its config files: every one, then the first failure."""
        failed = None
        for f in store.files:
            try:
                await f.flush()
            except StoreError as e:
                failed = failed or e
        if failed is not None:
            raise failed

    async def scenario():
        store.create_user("root", "root-secret-1", super_user=True)
        store.create_user("alice", SECRET)
        store.create_rule(rule())
        await flush()
        disk.full = True
        store.create_user("bob", "bob-secret-1")
        store.update_user("alice", secret_key="alice-secret-2")
        with pytest.raises(StoreError, match="disk full: .*users.json"):
            await flush()
        assert store.user("bob") is None and store.user("alice").secret_key == SECRET
        store.delete_user("alice")
        with pytest.raises(StoreError, match="disk full"):
            await flush()
        assert store.user("alice") is not None and store.rules("alice") == [rule()]
        # While a write is failing, the file on disk is behind memory: reload leaves memory alone.
        assert not store.reload_if_changed()
        disk.full = False
        store.create_user("carol", "carol-secret-1")
        await flush()

    asyncio.run(scenario())
    assert [u.name for u in reopen(tmp_path).users()] == ["alice", "carol", "root"]
    assert reopen(tmp_path).rules("alice") == [rule()]
