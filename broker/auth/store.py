"""AuthStore: the broker's users (config/users.json) and ACL rules (config/acls.json).

Secrets are kept as RocketMQ keeps them: the secret itself, since the request
signature (HMAC-SHA1 of the date-time, common/auth.py) can only be checked
with it; a one-way hash would not do. So both files are written with mode
0600 (before their first byte, common/fsutil.py), a secret never appears in
a log line, an error message, a repr or an RPC answer, and this module logs
user names only.

The files use the field names of RocketMQ's User and Acl models:

    users.json  {"users": {"alice": {"username": "alice", "password": "...", "userType": "Normal"}}}
    acls.json   {"acls": {"User:alice": {"subject": "User:alice", "policies": [{"policyType": "Custom",
                  "entries": [{"resource": "Topic:orders-*", "actions": ["Pub", "Sub"],
                               "sourceIps": ["10.0.0.0/8"], "decision": "Allow"}]}]}}}

Changes go through MetadataFile (disk/metadata_file.py): written in a worker thread,
atomically with a `.bak`; the rpc layer answers once they are on disk; a
write that fails (a full disk) undoes the change in memory and the caller is
told so. A user deleted with its rules changes both files, users.json first
in the flush order; if only acls.json could not be written, the user is gone
and its restored rules apply to nobody.

Operators may also edit the files by hand: `reload_if_changed` (a broker
timer) picks a new version up without a restart. A file that cannot be used
is never half applied (dropping one Deny rule would widen access): the store
keeps what it had and logs one warning saying why, until the file changes
again. At start an unusable file stops the broker (ConfigFileError) instead.

Rules of a user missing from users.json (a hand edit) are kept and listed but
apply to nobody until a user of that name exists again.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidemark.broker.auth.acl import AclRule, Action, Decision, Resource, User, evaluate
from tidemark.broker.disk.metadata_file import MetadataFile
from tidemark.broker.errors import (
    AlreadyExistsError,
    ConfigFileError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)
from tidemark.common.fsutil import backup_path
from tidemark.common.logs import get_logger

log = get_logger("tidemark.broker.auth")

USERS_FILE = "users.json"
ACLS_FILE = "acls.json"
FILE_MODE = 0o600
USER_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
SECRET_RE = re.compile(r"[\x21-\x7e]{8,256}")  # visible ASCII: no spaces, nothing a shell or header mangles
SUPER, NORMAL = "Super", "Normal"
SUBJECT_PREFIX = "User:"

Signature = tuple[int, int, int] | None  # (inode, size, mtime ns) of a file, None when it is missing
_UNKNOWN: Signature = (-1, -1, -1)  # after a change of ours: the next look reads the file whatever its stat


def check_user_name(name: str) -> None:
    if not isinstance(name, str) or not USER_NAME_RE.fullmatch(name):
        raise InvalidArgumentError(f"user name {name!r} must be 1 to 64 letters, digits, '_', '.' or '-'")


def check_secret_key(secret_key: str) -> None:
    """The message never quotes the secret, only what is wrong with it."""
    if not isinstance(secret_key, str) or not SECRET_RE.fullmatch(secret_key):
        length = len(secret_key) if isinstance(secret_key, str) else 0
        raise InvalidArgumentError(f"secret key must be 8 to 256 visible ASCII characters without spaces "
                                   f"(got {length} characters)")


# -- file encoding -------------------------------------------------------------

def encode_users(users: dict[str, User]) -> dict[str, Any]:
    return {"users": {u.name: {"username": u.name, "password": u.secret_key,
                               "userType": SUPER if u.super_user else NORMAL}
                      for u in sorted(users.values(), key=lambda u: u.name)}}


def decode_users(doc: dict[str, Any]) -> dict[str, User]:
    """The users of a users.json document; ValueError saying which entry is wrong (never its secret)."""
    table = doc.get("users", {})
    if not isinstance(table, dict):
        raise ValueError("'users' is not an object")
    users: dict[str, User] = {}
    for key, raw in table.items():
        if not isinstance(raw, dict):
            raise ValueError(f"user {key!r} is not an object")
        name = raw.get("username", key)
        user_type = raw.get("userType", NORMAL)
        try:
            check_user_name(name)
            check_secret_key(raw.get("password"))
        except InvalidArgumentError as e:
            raise ValueError(f"user {key!r}: {e}") from None
        if name != key:
            raise ValueError(f"user {key!r} has username {name!r}")
        if user_type not in (SUPER, NORMAL):
            raise ValueError(f"user {key!r}: userType {user_type!r} is not {SUPER} or {NORMAL}")
        users[name] = User(name, raw["password"], super_user=user_type == SUPER)
    return users


def encode_rules(rules: dict[str, tuple[AclRule, ...]]) -> dict[str, Any]:
    return {"acls": {SUBJECT_PREFIX + user: {
        "subject": SUBJECT_PREFIX + user,
        "policies": [{"policyType": "Custom", "entries": [
            {"resource": str(r.resource), "actions": [a.value for a in r.sorted_actions()],
             "sourceIps": list(r.source_ips), "decision": r.decision.value} for r in user_rules]}],
    } for user, user_rules in sorted(rules.items()) if user_rules}}


def decode_rules(doc: dict[str, Any]) -> dict[str, tuple[AclRule, ...]]:
    """The rules of an acls.json document; ValueError saying which entry is wrong."""
    table = doc.get("acls", {})
    if not isinstance(table, dict):
        raise ValueError("'acls' is not an object")
    rules: dict[str, tuple[AclRule, ...]] = {}
    for subject, raw in table.items():
        try:
            if not isinstance(raw, dict) or not subject.startswith(SUBJECT_PREFIX):
                raise ValueError("expected an object under a 'User:NAME' key")
            user = subject[len(SUBJECT_PREFIX):]
            check_user_name(user)
            out: list[AclRule] = []
            for i, policy in enumerate(raw.get("policies", [])):
                for j, entry in enumerate(policy.get("entries", [])):
                    where = f"policies[{i}].entries[{j}]"
                    try:
                        out.append(AclRule(user, Resource.parse(entry["resource"]),
                                           frozenset(Action.parse(a) for a in entry["actions"]),
                                           Decision.parse(entry["decision"]),
                                           tuple(entry.get("sourceIps", ()))))
                    except (KeyError, TypeError, AttributeError) as e:
                        raise ValueError(f"{where} is malformed ({type(e).__name__}: {e})") from None
                    except InvalidArgumentError as e:
                        raise ValueError(f"{where}: {e}") from None
        except (ValueError, InvalidArgumentError, AttributeError) as e:
            raise ValueError(f"{subject!r}: {e}") from None
        rules[user] = tuple(dict.fromkeys(out))
    return rules


def _signature(path: Path) -> Signature:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _read_doc(path: Path) -> dict[str, Any]:
    """A hand-edited file's JSON object ({} when missing); ValueError saying why it cannot be used."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"unreadable ({getattr(e, 'strerror', None) or e})") from None
    if not text.strip():
        raise ValueError("empty")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc


class _AuthFile:
    """One of the two files: its MetadataFile, how to decode and apply it, and what reload last saw."""

    def __init__(self, path: Path, render: Callable[[], dict[str, Any]],
                 apply: Callable[[dict[str, Any]], str], empty: dict[str, Any]) -> None:
        self.path = path
        self.empty = empty  # what render() gives for no entries: a missing file says the same
        self.file = MetadataFile(path, render, mode=FILE_MODE)
        self.render = render
        self.apply = apply  # decode and install a document (ValueError when unusable); returns a summary
        self.seen: Signature = None

    def changed(self, undo: Callable[[], None]) -> None:
        self.seen = _UNKNOWN  # our write will change the file; reload compares its content with memory
        self.file.changed(undo)

    def load(self) -> None:
        """Install the file, or ConfigFileError. Unlike topics.json there is no silent fall-back to the
        backup: an older users.json could bring back a rotated secret, an older acls.json drop a Deny."""
        try:
            if not self.path.exists() and backup_path(self.path).exists():
                raise ValueError(f"missing while its backup {backup_path(self.path).name} exists")
            summary = self.apply(_read_doc(self.path) or self.empty)
        except ValueError as e:
            raise ConfigFileError(f"{self.path} cannot be used: {e}; fix the file (or restore "
                                  f"{self.path.name}.bak yourself), then start again") from None
        self.seen = _signature(self.path)
        self._tighten_mode()
        log.info("auth file loaded", event="auth_load", file=self.path, entries=summary)

    def _tighten_mode(self) -> None:
        try:
            mode = stat.S_IMODE(self.path.stat().st_mode)
            if mode & 0o077:
                os.chmod(self.path, FILE_MODE)
                log.warning("auth file was readable by other users; its mode is now 0600",
                            event="auth_file_mode", file=self.path, was=oct(mode))
        except FileNotFoundError:
            pass

    def reload_if_changed(self) -> bool:
        # While a write of ours is pending or failing, the file is behind memory, not ahead of it.
        if self.file.dirty or self.file.failing:
            return False
        signature = _signature(self.path)
        if signature == self.seen:
            return False
        self.seen = signature
        self._tighten_mode()  # a hand edit or copy may have left it readable by others
        try:
            doc = _read_doc(self.path) or self.empty
            if doc == self.render():
                return False  # our own write
            summary = self.apply(doc)
        except ValueError as e:
            # Logged once: the signature is recorded, so the next look waits for another change.
            log.warning("auth file not reloaded: %s; keeping the previous users and rules until it changes",
                        e, event="auth_reload_failed", file=self.path, reason=str(e))
            return False
        log.info("auth file reloaded", event="auth_reload", file=self.path, entries=summary)
        return True


class AuthStore:
    """Users and ACL rules of one broker; see the module doc for files, secrets and reloads.

    The last super user cannot be deleted or demoted: with authorization on,
    nobody could manage users and rules any more short of editing the files.
    """

    def __init__(self, config_dir: Path) -> None:
        self._users: dict[str, User] = {}
        self._rules: dict[str, tuple[AclRule, ...]] = {}  # user -> rules, in creation order
        # Bumped by every change of users or rules: a decision taken at one version holds until it moves.
        self.version = 0
        config_dir = Path(config_dir)
        self._users_file = _AuthFile(config_dir / USERS_FILE, lambda: encode_users(self._users),
                                     self._apply_users, encode_users({}))
        self._acls_file = _AuthFile(config_dir / ACLS_FILE, lambda: encode_rules(self._rules),
                                    self._apply_rules, encode_rules({}))
        self.files: tuple[MetadataFile, ...] = (self._users_file.file, self._acls_file.file)

    # -- loading -------------------------------------------------------------------

    def load(self) -> None:
        """Read both files (missing: empty). ConfigFileError when one is present but cannot be used."""
        self._users_file.load()
        self._acls_file.load()

    def reload_if_changed(self) -> bool:
        """Take up hand edits of either file; whether anything changed. Never raises for a bad file."""
        users = self._users_file.reload_if_changed()
        rules = self._acls_file.reload_if_changed()
        return users or rules

    def _apply_users(self, doc: dict[str, Any]) -> str:
        self._users = decode_users(doc)
        self.version += 1
        return f"{len(self._users)} users"

    def _apply_rules(self, doc: dict[str, Any]) -> str:
        self._rules = decode_rules(doc)
        self.version += 1
        return f"{sum(map(len, self._rules.values()))} rules"

    # -- users ---------------------------------------------------------------------

    def user(self, name: str) -> User | None:
        return self._users.get(name)

    def users(self) -> list[User]:
        return [self._users[name] for name in sorted(self._users)]

    def has_users(self) -> bool:
        return bool(self._users)

    def _require_user(self, name: str) -> User:
        check_user_name(name)
        user = self._users.get(name)
        if user is None:
            raise NotFoundError(f"user {name!r} does not exist")
        return user

    def _set_user(self, name: str, after: User | None) -> None:
        before = self._users.get(name)
        if after is None:
            del self._users[name]
        else:
            self._users[name] = after
        self.version += 1

        def undo() -> None:
            if self._users.get(name) is after:  # nobody changed it since
                if before is None:
                    self._users.pop(name, None)
                else:
                    self._users[name] = before
                self.version += 1

        self._users_file.changed(undo)

    def create_user(self, name: str, secret_key: str, super_user: bool = False) -> User:
        self.reload_if_changed()  # a hand edit made since the last tick is not written over
        check_user_name(name)
        check_secret_key(secret_key)
        if name in self._users:
            raise AlreadyExistsError(f"user {name!r} already exists")
        user = User(name, secret_key, super_user=bool(super_user))
        self._set_user(name, user)
        leftover = len(self._rules.get(name, ()))
        log.info("user created", event="user_create", user=name, super_user=user.super_user,
                 **({"existing_rules": leftover} if leftover else {}))
        return user

    def update_user(self, name: str, secret_key: str | None = None, super_user: bool | None = None) -> User:
        """Change the secret and/or the super-user flag (None: keep)."""
        self.reload_if_changed()  # a hand edit made since the last tick is not written over
        user = self._require_user(name)
        if secret_key is None and super_user is None:
            raise InvalidArgumentError("nothing to update: give a secret key or the super-user flag")
        if secret_key is not None:
            check_secret_key(secret_key)
        if user.super_user and super_user is False:
            self._check_not_last_super(user)
        updated = User(name, user.secret_key if secret_key is None else secret_key,
                       user.super_user if super_user is None else bool(super_user))
        self._set_user(name, updated)
        log.info("user updated", event="user_update", user=name, super_user=updated.super_user,
                 secret_changed=secret_key is not None)
        return updated

    def delete_user(self, name: str) -> int:
        """Delete a user and its rules; the number of rules deleted with it."""
        self.reload_if_changed()  # a hand edit made since the last tick is not written over
        user = self._require_user(name)
        if user.super_user:
            self._check_not_last_super(user)
        self._set_user(name, None)
        removed = len(self._rules.get(name, ()))
        if removed:
            self._set_rules(name, ())
        log.info("user deleted", event="user_delete", user=name, rules=removed)
        return removed

    def _check_not_last_super(self, user: User) -> None:
        if not any(u.super_user and u.name != user.name for u in self._users.values()):
            raise FailedPreconditionError(f"user {user.name!r} is the last super user; make another user a "
                                          "super user first")

    def ensure_initial_user(self, name: str, secret_key: str) -> bool:
        """Create `name` as a super user when there are no users at all (RocketMQ's initAuthenticationUser);
        whether it was created."""
        if self._users:
            return False
        self.create_user(name, secret_key, super_user=True)
        return True

    # -- rules ---------------------------------------------------------------------

    def rules(self, user: str | None = None) -> list[AclRule]:
        """Every rule (by user name, then creation order), or one user's."""
        if user is not None:
            check_user_name(user)
            return list(self._rules.get(user, ()))
        return [r for name in sorted(self._rules) for r in self._rules[name]]

    def _set_rules(self, user: str, after: tuple[AclRule, ...]) -> None:
        before = self._rules.get(user, ())
        if after:
            self._rules[user] = after
        else:
            self._rules.pop(user, None)
        self.version += 1

        def undo() -> None:
            if self._rules.get(user, ()) == after:  # nobody changed them since
                if before:
                    self._rules[user] = before
                else:
                    self._rules.pop(user, None)
                self.version += 1

        self._acls_file.changed(undo)

    def create_rule(self, rule: AclRule) -> AclRule:
        """Add a rule for an existing user; AlreadyExistsError for an identical one."""
        self.reload_if_changed()  # a hand edit made since the last tick is not written over
        self._require_user(rule.user)
        current = self._rules.get(rule.user, ())
        if rule in current:
            raise AlreadyExistsError(f"user {rule.user!r} already has this rule on {rule.resource}")
        self._set_rules(rule.user, (*current, rule))
        log.info("acl rule created", event="acl_create", user=rule.user, resource=str(rule.resource),
                 actions=",".join(a.value for a in rule.sorted_actions()), decision=rule.decision.value,
                 source_ips=",".join(rule.source_ips) or "any")
        return rule

    def delete_rules(self, user: str, resource: Resource | None = None) -> int:
        """Delete a user's rules, all or those whose resource pattern is `resource`; how many.

        NotFoundError when nothing matched. Works for the rules of a user no longer in users.json."""
        self.reload_if_changed()  # a hand edit made since the last tick is not written over
        check_user_name(user)
        current = self._rules.get(user, ())
        kept = tuple(r for r in current if resource is not None and r.resource != resource)
        removed = len(current) - len(kept)
        if not removed:
            where = f" on {resource}" if resource is not None else ""
            raise NotFoundError(f"user {user!r} has no ACL rule{where}")
        self._set_rules(user, kept)
        log.info("acl rules deleted", event="acl_delete", user=user, resource=str(resource or "*"),
                 rules=removed)
        return removed

    def authorize(self, user: User, resource: Resource, action: Action, source_ip: str) -> Decision:
        """The decision for `user` (as authenticated) over its current rules."""
        return evaluate(user, self._rules.get(user.name, ()), resource, action, source_ip)
