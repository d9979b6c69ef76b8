"""The console's management pages as data: creating and deleting topics, users and ACL rules.

Every change is planned first, as the CLI plans it (tidemark.client.change_plans): a request with
`execute` false (the default) reads the brokers, changes nothing and answers what would change; the same
request with `execute` true makes the change and answers what changed. A topic's deletion is refused
while live consumers use it unless `force` (which goes with `execute`), as `topic delete --force`.
Whether the signed-in user may do any of it is the brokers' call (their ACLs), as for the CLI.
"""

from __future__ import annotations

from typing import Any

from tidemark.client import change_plans
from tidemark.client.admin import Admin
from tidemark.client.console.views import flag, text
from tidemark.client.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError
from tidemark.client.namespacing import Names
from tidemark.client.types import AclRuleInfo, UserInfo
from tidemark.common.protocol import InvalidNameError, check_topic_name

MAX_QUEUES = 1024  # the brokers' bound (broker/topics.py); checked here so that a plan never promises more


def _user_doc(u: UserInfo) -> dict[str, Any]:
    return {"user": u.name, "super_user": u.super_user, "brokers": list(u.brokers)}


def _rule_doc(r: AclRuleInfo) -> dict[str, Any]:
    return {"user": r.user, "resource": r.resource, "actions": list(r.actions), "decision": r.decision,
            "source_ips": list(r.source_ips), "brokers": list(r.brokers)}


def _broker_names(admin: Admin) -> list[str]:
    return sorted({b.broker_name for b in admin.brokers()})


# -- topics ----------------------------------------------------------------------------------------


def create_topic(admin: Admin, doc: dict[str, Any]) -> dict[str, Any]:
    """Plan or create a topic with `queues` queues on the named `brokers` (default: every broker)."""
    topic, execute = text(doc, "topic", "topic create"), flag(doc, "execute", "topic create")
    try:
        check_topic_name(topic, allow_system=False)
    except InvalidNameError as e:
        raise InvalidArgumentError(f"topic create: {e}") from None
    queues = doc.get("queues")
    if isinstance(queues, bool) or not isinstance(queues, int) or not 1 <= queues <= MAX_QUEUES:
        raise InvalidArgumentError(f"topic create: queues must be a whole number from 1 to {MAX_QUEUES}")
    wanted = doc.get("brokers") or []
    if not isinstance(wanted, list) or not all(isinstance(b, str) and b for b in wanted):
        raise InvalidArgumentError("topic create: brokers must be a list of broker names")
    known = _broker_names(admin)
    unknown = [b for b in wanted if b not in known]
    if unknown:
        raise NotFoundError(f"topic create: no broker named {', '.join(unknown)} (the brokers: {', '.join(known)})")
    held = admin.list_topics(include_system=True).get(Names(admin.settings.namespace).topic(topic))
    if held:
        raise AlreadyExistsError(f"topic {topic!r} exists already on {', '.join(b for b, _ in held)}")
    brokers = sorted(set(wanted)) or known
    if execute:
        admin.create_topic(topic, queues, brokers=brokers)
    return {"executed": execute, "topic": topic, "queues": queues, "brokers": brokers}


def delete_topic(admin: Admin, name: str, doc: dict[str, Any]) -> dict[str, Any]:
    """Plan or delete a topic: its queues, messages and the groups' offsets on it, on every broker."""
    execute, force = flag(doc, "execute", "topic delete"), flag(doc, "force", "topic delete")
    if force and not execute:
        raise InvalidArgumentError("topic delete: force goes with execute (without it nothing is deleted)")
    plan = change_plans.plan_topic_deletion(admin, name)
    if execute:
        change_plans.delete_topic(admin, plan, force=force)
    return {"executed": execute, "topic": plan.topic, "brokers": list(plan.brokers), "queues": plan.queues,
            "messages": plan.messages, "groups": list(plan.groups),
            "live_consumers": [str(c) for c in plan.live_consumers]}


# -- users and ACL rules ---------------------------------------------------------------------------


def users(admin: Admin) -> dict[str, Any]:
    return {"users": [_user_doc(u) for u in admin.list_users()]}


def acls(admin: Admin, user: str | None) -> dict[str, Any]:
    return {"rules": [_rule_doc(r) for r in admin.list_acls(user)]}


def create_user(admin: Admin, doc: dict[str, Any]) -> dict[str, Any]:
    """Plan or create a user (on every broker); the secret key is never echoed."""
    name, execute = text(doc, "name", "user create"), flag(doc, "execute", "user create")
    secret = doc.get("secret_key")
    if not isinstance(secret, str) or not secret:
        raise InvalidArgumentError("user create: secret_key must be a non-empty string")
    super_user = flag(doc, "super_user", "user create")
    if any(u.name == name for u in admin.list_users()):
        raise AlreadyExistsError(f"user {name!r} exists already")
    if execute:
        return {"executed": True, **_user_doc(admin.create_user(name, secret, super_user=super_user))}
    return {"executed": False, "user": name, "super_user": super_user, "brokers": _broker_names(admin)}


def delete_user(admin: Admin, name: str, doc: dict[str, Any]) -> dict[str, Any]:
    """Plan or delete a user with its ACL rules."""
    execute = flag(doc, "execute", "user delete")
    user, rules = change_plans.plan_user_deletion(admin, name)
    if execute:
        admin.delete_user(name)
    return {"executed": execute, **_user_doc(user), "rules": [_rule_doc(r) for r in rules]}


def create_acl(admin: Admin, doc: dict[str, Any]) -> dict[str, Any]:
    """Plan or add a rule: `actions` a list (or a comma-separated string) of Pub, Sub, Create, Update,
    Delete, Get, List, All; `decision` Allow or Deny; the brokers check the names when the rule is added."""
    user, execute = text(doc, "user", "acl create"), flag(doc, "execute", "acl create")
    resource = change_plans.canonical_resource(text(doc, "resource", "acl create"))
    actions = doc.get("actions")
    if isinstance(actions, str):
        actions = [a.strip() for a in actions.split(",") if a.strip()]
    if not isinstance(actions, list) or not actions or not all(isinstance(a, str) and a for a in actions):
        raise InvalidArgumentError("acl create: actions must name at least one action (Pub, Sub, Get, List, ...)")
    decision = text(doc, "decision", "acl create").capitalize()
    if decision not in ("Allow", "Deny"):
        raise InvalidArgumentError(f"acl create: decision must be Allow or Deny, not {doc['decision']!r}")
    if not any(u.name == user for u in admin.list_users()):
        raise NotFoundError(f"acl create: user {user!r} does not exist")
    if execute:
        return {"executed": True, **_rule_doc(admin.create_acl(user, resource, actions, decision))}
    return {"executed": False, **_rule_doc(AclRuleInfo(user, resource, tuple(actions), decision,
                                                       brokers=tuple(_broker_names(admin))))}


def delete_acl(admin: Admin, doc: dict[str, Any]) -> dict[str, Any]:
    """Plan or delete a user's rules: all, or those on `resource`."""
    user, execute = text(doc, "user", "acl delete"), flag(doc, "execute", "acl delete")
    resource = text(doc, "resource", "acl delete", required=False) or None
    rules = change_plans.plan_acl_deletion(admin, user, resource)
    if execute:
        admin.delete_acl(user, None if resource is None else change_plans.canonical_resource(resource))
    return {"executed": execute, "user": user, "rules": [_rule_doc(r) for r in rules]}
