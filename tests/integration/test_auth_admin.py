"""Users and ACL rules against a real broker: the admin RPCs, the Admin client, the `tidemark user` and
`tidemark acl` commands, the files they leave in config/ and hand edits picked up without a restart.

Authorization itself (--auth) is tested with the request interceptor; this module tests the management
functions: what they store, answer and refuse. They are served only by a broker started with --auth, to a
super user, so every broker here starts with `--auth --init-user op:op-secret-001` and every call is signed
as `op`."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import forkserver
import grpc
import pytest
from brokerproc import BrokerProcess, BrokerStubs
from workload import wait_until

from tidemark.client import (
    Admin,
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)
from tidemark.common.auth import Credentials
from tidemark.v1 import admin_pb2

REPO = Path(__file__).resolve().parents[2]
OP_SECRET = "op-secret-001"
AUTH = ("--auth", "--init-user", f"op:{OP_SECRET}")
OP = Credentials("op", OP_SECRET)  # the super user every call is signed as
OP_ENV = {"TIDEMARK_ACCESS_KEY": "op", "TIDEMARK_SECRET_KEY": OP_SECRET}
SECRETS = ("alice-secret-1", "alice-secret-2", "root-secret-1", "cli-secret-01", "file-secret-01",
           "env-secret-01", "rotated-secret-1", OP_SECRET)


@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory) -> BrokerProcess:
    b = BrokerProcess(tmp_path_factory.mktemp("auth") / "data", args=AUTH).start()
    yield b
    b.kill()


def config(broker: BrokerProcess, name: str) -> Path:
    return broker.data_dir / "config" / name


def code_of(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()


def test_admin_rpcs_manage_users_and_rules_and_never_answer_a_secret(auth_broker):
    with BrokerStubs(auth_broker.address, credentials=OP) as s:
        a = s.admin
        created = a.CreateUser(admin_pb2.CreateUserRequest(name="alice", secret_key="alice-secret-1"))
        assert (created.name, created.super_user) == ("alice", False)
        a.CreateUser(admin_pb2.CreateUserRequest(name="root", secret_key="root-secret-1", super_user=True))
        listed = a.ListUsers(admin_pb2.ListUsersRequest())
        assert [(u.name, u.super_user) for u in listed.users] == [("alice", False), ("op", True), ("root", True)]
        assert b"secret" not in listed.SerializeToString()
        assert {f.name for f in admin_pb2.UserInfo.DESCRIPTOR.fields} == {"name", "super_user"}

        assert code_of(lambda: a.CreateUser(admin_pb2.CreateUserRequest(name="alice", secret_key="another-1"))) \
            == (grpc.StatusCode.ALREADY_EXISTS, "user 'alice' already exists")
        code, details = code_of(lambda: a.CreateUser(admin_pb2.CreateUserRequest(name="bad name",
                                                                                 secret_key="whatever-1")))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "'bad name'" in details
        code, details = code_of(lambda: a.CreateUser(admin_pb2.CreateUserRequest(name="bob", secret_key="short")))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "short" not in details

        rule = a.CreateAcl(admin_pb2.CreateAclRequest(user="alice", resource="topic:orders-*",
                                                      actions=["sub", "Pub"], decision="allow",
                                                      source_ips=["10.0.0.1"]))
        assert (rule.user, rule.resource, list(rule.actions), rule.decision, list(rule.source_ips)) == \
            ("alice", "Topic:orders-*", ["Pub", "Sub"], "Allow", ["10.0.0.1/32"])
        a.CreateAcl(admin_pb2.CreateAclRequest(user="alice", resource="Cluster", actions=["Get"], decision="Deny"))
        for request, bad in [
            (admin_pb2.CreateAclRequest(user="alice", resource="Queue:x", actions=["Pub"], decision="Allow"),
             "'Queue:x'"),
            (admin_pb2.CreateAclRequest(user="alice", resource="Topic:x", actions=["Publish"], decision="Allow"),
             "'Publish'"),
            (admin_pb2.CreateAclRequest(user="alice", resource="Topic:x", actions=[], decision="Allow"),
             "names no action"),
            (admin_pb2.CreateAclRequest(user="alice", resource="Topic:x", actions=["Pub"], decision="Maybe"),
             "'Maybe'"),
            (admin_pb2.CreateAclRequest(user="alice", resource="Topic:x", actions=["Pub"], decision="Allow",
                                        source_ips=["10.0.0.0/33"]), "'10.0.0.0/33'"),
        ]:
            code, details = code_of(lambda r=request: a.CreateAcl(r))
            assert code is grpc.StatusCode.INVALID_ARGUMENT and bad in details, details
        assert code_of(lambda: a.CreateAcl(admin_pb2.CreateAclRequest(
            user="ghost", resource="Topic:x", actions=["Pub"], decision="Allow")))[0] is grpc.StatusCode.NOT_FOUND

        assert [r.resource for r in a.ListAcls(admin_pb2.ListAclsRequest(user="alice")).rules] == \
            ["Topic:orders-*", "Cluster"]
        assert a.ListAcls(admin_pb2.ListAclsRequest(user="root")).rules == []
        assert a.DeleteAcl(admin_pb2.DeleteAclRequest(user="alice", resource="Cluster")).deleted == 1
        assert code_of(lambda: a.DeleteAcl(admin_pb2.DeleteAclRequest(user="alice", resource="Cluster")))[0] \
            is grpc.StatusCode.NOT_FOUND

        updated = a.UpdateUser(admin_pb2.UpdateUserRequest(name="alice", secret_key="alice-secret-2"))
        assert (updated.name, updated.super_user) == ("alice", False)
        # With `op` a super user too, root may be demoted; then `op` is the last one and may be neither.
        demoted = a.UpdateUser(admin_pb2.UpdateUserRequest(name="root", super_user=False))
        assert (demoted.name, demoted.super_user) == ("root", False)
        last = (grpc.StatusCode.FAILED_PRECONDITION,
                "user 'op' is the last super user; make another user a super user first")
        assert code_of(lambda: a.UpdateUser(admin_pb2.UpdateUserRequest(name="op", super_user=False))) == last
        assert code_of(lambda: a.DeleteUser(admin_pb2.DeleteUserRequest(name="op"))) == last

    # Answered means on disk: the files hold it, 0600, in RocketMQ's field names.
    users = json.loads(config(auth_broker, "users.json").read_text())["users"]
    assert users["alice"] == {"username": "alice", "password": "alice-secret-2", "userType": "Normal"}
    assert users["op"] == {"username": "op", "password": OP_SECRET, "userType": "Super"}
    assert users["root"]["userType"] == "Normal"
    for name in ("users.json", "acls.json"):
        assert stat.S_IMODE(config(auth_broker, name).stat().st_mode) == 0o600
    assert not any(s in auth_broker.log_text() for s in SECRETS)

    auth_broker.restart()
    with BrokerStubs(auth_broker.address, credentials=OP) as s:
        assert [(u.name, u.super_user) for u in s.admin.ListUsers(admin_pb2.ListUsersRequest()).users] == \
            [("alice", False), ("op", True), ("root", False)]
        assert s.admin.DeleteUser(admin_pb2.DeleteUserRequest(name="alice")).deleted_acls == 1
        assert s.admin.ListAcls(admin_pb2.ListAclsRequest()).rules == []
        assert code_of(lambda: s.admin.DeleteUser(admin_pb2.DeleteUserRequest(name="alice")))[0] \
            is grpc.StatusCode.NOT_FOUND


def test_admin_client_applies_changes_to_every_broker(broker_factory):
    a, b = broker_factory("broker-a", args=AUTH), broker_factory("broker-b", args=AUTH)
    with Admin(brokers=f"{a.address},{b.address}", credentials=("op", OP_SECRET)) as admin:
        created = admin.create_user("svc", "svc-secret-01")
        assert (created.name, created.super_user, created.brokers) == ("svc", False, ("broker-a", "broker-b"))
        rule = admin.create_acl("svc", "Group:billing", ["Sub"], "Allow", source_ips=["192.168.0.0/16"])
        assert (rule.resource, rule.actions, rule.source_ips, rule.brokers) == \
            ("Group:billing", ("Sub",), ("192.168.0.0/16",), ("broker-a", "broker-b"))
        admin.create_user("only-a", "only-a-secret", brokers=["broker-a"])
        assert [(u.name, u.brokers) for u in admin.list_users()] == \
            [("only-a", ("broker-a",)), ("op", ("broker-a", "broker-b")), ("svc", ("broker-a", "broker-b"))]
        assert admin.update_user("only-a", super_user=True).brokers == ("broker-a",)
        assert [(u.name, u.super_user, u.brokers) for u in admin.list_users() if u.super_user] == \
            [("only-a", True, ("broker-a",)), ("op", True, ("broker-a", "broker-b"))]
        # `op` is a super user too, so only-a may be demoted again; then `op` is the last one everywhere.
        assert admin.update_user("only-a", super_user=False).super_user is False
        with pytest.raises(AlreadyExistsError):
            admin.create_user("svc", "svc-secret-02")
        with pytest.raises(InvalidArgumentError, match="Topic:a b: topic name 'a b' may only contain"):
            admin.create_acl("svc", "Topic:a b", ["Pub"], "Allow")
        with pytest.raises(FailedPreconditionError, match="'op' is the last super user"):
            admin.delete_user("op")
        with pytest.raises(FailedPreconditionError, match="'op' is the last super user"):
            admin.update_user("op", super_user=False)
        assert admin.delete_acl("svc", "Group:billing") == 2
        with pytest.raises(NotFoundError):
            admin.delete_acl("svc")
        assert admin.delete_user("svc") == 0
        with pytest.raises(NotFoundError, match="'svc' does not exist"):
            admin.delete_user("svc")
        assert admin.list_acls() == []
        assert [(u.name, u.super_user, u.brokers) for u in admin.list_users()] == \
            [("only-a", False, ("broker-a",)), ("op", True, ("broker-a", "broker-b"))]


def test_hand_edits_are_reloaded_and_a_malformed_file_keeps_the_rules_and_says_why_once(broker_factory):
    broker = broker_factory(args=AUTH)
    with Admin(brokers=broker.address, credentials=("op", OP_SECRET)) as admin:
        admin.create_user("alice", "alice-secret-1")
        admin.create_acl("alice", "Topic:orders", ["Pub"], "Deny")
        path = config(broker, "acls.json")
        doc = json.loads(path.read_text())
        doc["acls"]["User:alice"]["policies"][0]["entries"].append(
            {"resource": "Topic:*", "actions": ["Sub"], "decision": "Allow", "sourceIps": []})
        replace_file(path, json.dumps(doc))
        wait_until(lambda: len(admin.list_acls("alice")) == 2, 15, "the hand-edited rule")

        replace_file(path, '{"acls": {"User:alice": {"policies": [{"entries": [{"resource": "Topic:x",'
                           ' "actions": ["Pub"], "decision": "Allow", "sourceIps": ["10.0.0.5/8"]}]}]}}}')
        wait_until(lambda: "auth_reload_failed" in broker.log_text(), 15, "the reload warning")
        before = broker.log_text().count("event=auth_reload_failed")
        assert before == 1 and "host bits set" in broker.log_text()
        assert [r.resource for r in admin.list_acls("alice")] == ["Topic:orders", "Topic:*"]  # still in force
        time.sleep(4.5)  # two more reload ticks: no second warning for the same file
        assert broker.log_text().count("event=auth_reload_failed") == 1


def replace_file(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".edit")
    tmp.write_text(text)
    os.replace(tmp, path)


# -- the CLI -------------------------------------------------------------------

def tidemark(*args: str, broker: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")}
    return forkserver.run([sys.executable, "-m", "tidemark.client.cli.main", *args, "--broker", broker],
                          capture_output=True, text=True, timeout=60, cwd=REPO, env={**environ, **(env or {})})


def ok(*args: str, broker: str, env: dict[str, str] | None = None) -> str:
    proc = tidemark(*args, broker=broker, env=env)
    assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stderr}"
    assert not any(s in proc.stdout + proc.stderr for s in SECRETS)
    return proc.stdout


def fails(*args: str, broker: str, env: dict[str, str] | None = None) -> str:
    proc = tidemark(*args, broker=broker, env=env)
    assert proc.returncode == 1, f"{args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tidemark: "), proc.stderr
    assert proc.stdout == "" and not any(s in proc.stderr for s in SECRETS)
    return lines[0]


def test_cli_user_and_acl_commands(broker_factory, tmp_path):
    broker = broker_factory(args=AUTH)
    addr = broker.address
    out = ok("user", "create", "cli", "--secret-key", "cli-secret-01", "--super", broker=addr, env=OP_ENV)
    assert out.split() == ["USER", "SUPER_USER", "BROKERS", "cli", "true", "broker-a"]
    secret_file = tmp_path / "secret"
    secret_file.write_text("file-secret-01\n")
    assert json.loads(ok("user", "create", "from-file", "--secret-key-file", str(secret_file), "--json",
                         broker=addr, env=OP_ENV)) == \
        [{"user": "from-file", "super_user": False, "brokers": ["broker-a"]}]
    ok("user", "create", "from-env", broker=addr, env={**OP_ENV, "TIDEMARK_USER_SECRET_KEY": "env-secret-01"})
    users = json.loads(config(broker, "users.json").read_text())["users"]
    assert users["from-file"]["password"] == "file-secret-01" and users["from-env"]["password"] == "env-secret-01"

    assert json.loads(ok("user", "update", "from-env", "--execute", "--super", "--json", broker=addr,
                         env=OP_ENV))[0]["super_user"] is True
    ok("user", "update", "from-env", "--execute", "--no-super", "--secret-key-env", "ROTATED", broker=addr,
       env={**OP_ENV, "ROTATED": "rotated-secret-1"})
    assert json.loads(config(broker, "users.json").read_text())["users"]["from-env"] == \
        {"username": "from-env", "password": "rotated-secret-1", "userType": "Normal"}
    listed = json.loads(ok("user", "list", "--json", broker=addr, env=OP_ENV))
    assert [(u["user"], u["super_user"]) for u in listed] == \
        [("cli", True), ("from-env", False), ("from-file", False), ("op", True)]
    assert "4 user(s)" in ok("user", "list", broker=addr, env=OP_ENV)

    created = json.loads(ok("acl", "create", "from-file", "--resource", "Topic:orders-*", "--actions", "Pub, Sub",
                            "--decision", "Allow", "--source-ip", "10.0.0.0/8", "--source-ip", "::1", "--json",
                            broker=addr, env=OP_ENV))
    assert created == [{"user": "from-file", "resource": "Topic:orders-*", "actions": ["Pub", "Sub"],
                        "decision": "Allow", "source_ips": ["10.0.0.0/8", "::1/128"], "brokers": ["broker-a"]}]
    ok("acl", "create", "from-env", "--resource", "Cluster", "--actions", "All", "--decision", "Deny", broker=addr,
       env=OP_ENV)
    table = ok("acl", "list", broker=addr, env=OP_ENV).splitlines()
    assert table[0].split() == ["USER", "RESOURCE", "ACTIONS", "DECISION", "SOURCE_IPS", "BROKERS"]
    assert table[1].split() == ["from-env", "Cluster", "All", "Deny", "-", "broker-a"]
    assert table[2].split() == ["from-file", "Topic:orders-*", "Pub,Sub", "Allow", "10.0.0.0/8,::1/128", "broker-a"]
    assert [r["user"] for r in json.loads(ok("acl", "list", "--user", "from-env", "--json", broker=addr,
                                             env=OP_ENV))] == ["from-env"]

    assert "'Queue:x'" in fails("acl", "create", "cli", "--resource", "Queue:x", "--actions", "Pub",
                                "--decision", "Allow", broker=addr, env=OP_ENV)
    assert "'Publish'" in fails("acl", "create", "cli", "--resource", "Topic:x", "--actions", "Publish",
                                "--decision", "Allow", broker=addr, env=OP_ENV)
    assert "names no action" in fails("acl", "create", "cli", "--resource", "Topic:x", "--actions", ",",
                                      "--decision", "Allow", broker=addr, env=OP_ENV)
    assert "'10.0.0.0/33'" in fails("acl", "create", "cli", "--resource", "Topic:x", "--actions", "Pub",
                                    "--decision", "Allow", "--source-ip", "10.0.0.0/33", broker=addr, env=OP_ENV)
    assert "'ghost' does not exist" in fails("acl", "create", "ghost", "--resource", "Topic:x", "--actions", "Pub",
                                             "--decision", "Allow", broker=addr, env=OP_ENV)
    assert "already exists" in fails("user", "create", "cli", "--secret-key", "cli-secret-01", broker=addr,
                                     env=OP_ENV)
    assert "got 5 characters" in fails("user", "create", "shorty", "--secret-key", "short", broker=addr, env=OP_ENV)
    assert "TIDEMARK_USER_SECRET_KEY" in fails("user", "create", "nosecret", broker=addr, env=OP_ENV)
    assert "--secret-key-file" in fails("user", "create", "x1", "--secret-key-file", str(tmp_path / "nope"),
                                        broker=addr, env=OP_ENV)
    assert "nothing to update" in fails("user", "update", "cli", broker=addr, env=OP_ENV)
    # With cli a normal user again, `op` is the last super user: it may be neither deleted nor demoted.
    assert json.loads(ok("user", "update", "cli", "--execute", "--no-super", "--json", broker=addr,
                         env=OP_ENV))[0]["super_user"] is False
    assert "'op' is the last super user" in fails("user", "delete", "op", "--execute", broker=addr, env=OP_ENV)
    assert "'op' is the last super user" in fails("user", "update", "op", "--execute", "--no-super", broker=addr, env=OP_ENV)
    assert json.loads(ok("user", "update", "cli", "--execute", "--super", "--json", broker=addr,
                         env=OP_ENV))[0]["super_user"] is True

    assert ok("acl", "delete", "from-env", "--execute", "--resource", "Cluster", broker=addr, env=OP_ENV).strip() == \
        "1 ACL rule(s) of from-env deleted"
    assert "no ACL rule on Cluster" in fails("acl", "delete", "from-env", "--execute", "--resource", "Cluster", broker=addr,
                                             env=OP_ENV)
    assert json.loads(ok("user", "delete", "from-file", "--execute", "--json", broker=addr, env=OP_ENV)) == \
        [{"user": "from-file", "deleted": True, "deleted_acls": 1}]
    assert ok("user", "delete", "from-env", "--execute", broker=addr, env=OP_ENV).strip() == \
        "user from-env deleted with 0 ACL rule(s)"
    assert json.loads(ok("acl", "list", "--json", broker=addr, env=OP_ENV)) == []
    # Here --secret-key is the new user's; the caller's own secret comes from the environment. Signed as the
    # super user cli, not op.
    ok("user", "create", "signed", "--secret-key", "alice-secret-1", "--access-key", "cli", broker=addr,
       env={"TIDEMARK_SECRET_KEY": "cli-secret-01"})
    assert json.loads(config(broker, "users.json").read_text())["users"]["signed"]["password"] == "alice-secret-1"
    assert not any(s in broker.log_text() for s in SECRETS)


def test_user_and_acl_rpcs_are_refused_on_a_broker_without_auth(broker):
    with BrokerStubs(broker.address) as s:
        code, details = code_of(lambda: s.admin.CreateUser(admin_pb2.CreateUserRequest(
            name="op", secret_key=OP_SECRET, super_user=True)))
    assert code is grpc.StatusCode.FAILED_PRECONDITION and "only on a broker started with --auth" in details
    assert not config(broker, "users.json").exists() or \
        json.loads(config(broker, "users.json").read_text())["users"] == {}


@pytest.mark.parametrize("args", [
    ("user", "create"),
    ("user", "create", "x", "--secret-key", "a-secret-1", "--secret-key-file", "f"),
    ("user", "update", "x", "--super=yes"),
    ("acl", "create", "x", "--actions", "Pub", "--decision", "Allow"),
    ("acl", "frob"),
], ids=lambda a: " ".join(a))
def test_cli_bad_usage_exits_2_with_one_error_line(args):
    out = forkserver.run([sys.executable, "-m", "tidemark.client.cli.main", *args], capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert out.returncode == 2
    assert len([line for line in out.stderr.splitlines() if "error" in line]) == 1, out.stderr
