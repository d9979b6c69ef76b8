"""What a changing admin command would do, said before it is done (the CLI's rule: a plan unless --execute),
and who would be hurt by it.

Each `plan_*` reads the brokers and changes nothing; the CLI prints the plan and, with --execute, makes the
change the plan describes. A delete is refused while live clients use what it deletes (`refuse_if_used`):
a topic while consumers of any group subscribe to it or own its queues (they would keep owning queues that
no longer exist), a group while it has members (the broker refuses that too). The clients are named, so the
operator knows whom to stop; deleting a topic anyway takes --force.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tidemark.client.admin import Admin
from tidemark.client.errors import FailedPreconditionError, NotFoundError
from tidemark.client.types import AclRuleInfo, GroupMember, TopicConfig, UserInfo


@dataclass(frozen=True, slots=True)
class LiveClient:
    """A consumer with a live heartbeat: its group, client id and where it connects from."""

    group: str
    client_id: str
    host: str

    def __str__(self) -> str:
        return f"{self.client_id} of group {self.group} ({self.host})"


def _clients(group: str, members: Sequence[GroupMember]) -> list[LiveClient]:
    return [LiveClient(group, m.client_id, m.host) for m in members]


def group_members(admin: Admin, group: str) -> list[LiveClient]:
    """The live members of a group (none when no broker knows it)."""
    try:
        return _clients(group, admin.describe_group(group).members)
    except NotFoundError:
        return []


def topic_consumers(admin: Admin, topic: str) -> list[LiveClient]:
    """Live consumers, of any group, that subscribe to `topic` or own one of its queues."""
    found: list[LiveClient] = []
    for g in admin.list_groups():
        if not g.member_count:
            continue
        try:
            members = admin.describe_group(g.group).members
        except NotFoundError:  # its members left since the list
            continue
        found += _clients(g.group, [m for m in members if any(t == topic for t, _ in m.subscriptions)
                                    or any(q.topic == topic for q in m.owned_queues)])
    return found


def refuse_if_used(what: str, clients: Sequence[LiveClient], remedy: str) -> None:
    """FailedPreconditionError naming the live clients, if any."""
    if clients:
        raise FailedPreconditionError(f"{what} is used by {len(clients)} live client(s): "
                                      f"{'; '.join(str(c) for c in clients)}; {remedy}")


@dataclass(frozen=True, slots=True)
class TopicDeletion:
    """What `topic delete` removes: the topic's queues and messages on each broker, the offsets groups hold on
    it, and whom it would leave reading nothing."""

    topic: str
    brokers: tuple[str, ...]
    queues: int
    messages: int
    groups: tuple[str, ...]  # groups with offsets on the topic: they lose them
    live_consumers: tuple[LiveClient, ...]


def plan_topic_deletion(admin: Admin, topic: str) -> TopicDeletion:
    stats = admin.topic_stats(topic)
    return TopicDeletion(topic, tuple(sorted({s.queue.broker_name for s in stats})), len(stats),
                         sum(s.max_offset - s.min_offset for s in stats),
                         tuple(g.group for g in admin.list_groups(topic)), tuple(topic_consumers(admin, topic)))


def delete_topic(admin: Admin, plan: TopicDeletion, *, force: bool) -> None:
    """Delete the planned topic; refused while live consumers use it, unless force."""
    if not force:
        refuse_if_used(f"topic {plan.topic!r}", plan.live_consumers, "stop them, or add --force to delete it anyway")
    admin.delete_topic(plan.topic)


@dataclass(frozen=True, slots=True)
class GroupDeletion:
    """What `group delete` removes: the group's offsets (on these topics) and its config, on every broker."""

    group: str
    topics: tuple[str, ...]
    live_members: tuple[LiveClient, ...]


def plan_group_deletion(admin: Admin, group: str) -> GroupDeletion:
    known = [g for g in admin.list_groups() if g.group == group]
    if not known:
        raise NotFoundError(f"group {group!r} is unknown on every broker")
    return GroupDeletion(group, known[0].topics, tuple(group_members(admin, group)))


def delete_group(admin: Admin, plan: GroupDeletion) -> None:
    """Delete the planned group; refused while it has live members (the brokers refuse it as well)."""
    refuse_if_used(f"group {plan.group!r}", plan.live_members, "stop them first")
    admin.delete_group(plan.group)


def plan_topic_update(admin: Admin, topic: str, changes: Mapping[str, Any]) -> list[tuple[str, TopicConfig]]:
    """(broker, the config the change gives) for each broker holding the topic; the brokers check the values
    when the change is made."""
    current = admin.list_topics(include_system=True).get(topic)
    if not current:
        raise NotFoundError(f"topic {topic!r} does not exist")
    return [(broker, replace(config, **changes)) for broker, config in current]


def plan_user_update(admin: Admin, name: str, *, super_user: bool | None) -> UserInfo:
    """The user as `user update` leaves it (a new secret is never shown)."""
    user = _user(admin, name)
    return user if super_user is None else replace(user, super_user=super_user)


def plan_user_deletion(admin: Admin, name: str) -> tuple[UserInfo, list[AclRuleInfo]]:
    """The user `user delete` removes and the ACL rules that go with it."""
    return _user(admin, name), admin.list_acls(name)


def _user(admin: Admin, name: str) -> UserInfo:
    found = [u for u in admin.list_users() if u.name == name]
    if not found:
        raise NotFoundError(f"user {name!r} does not exist")
    return found[0]


_RESOURCE_TYPES = ("Topic", "Group", "Cluster")


def canonical_resource(text: str) -> str:
    """A rule's resource as the brokers store it: surrounding blanks gone, the type in its own case
    (`topic:Orders` is `Topic:Orders`), `Cluster` without a name (`Cluster:*` too). Anything else is left
    as written, for the brokers to refuse."""
    kind, colon, name = text.strip().partition(":")
    for t in _RESOURCE_TYPES:
        if t.lower() == kind.lower():
            return t if t == "Cluster" and name in ("", "*") else f"{t}{colon}{name}"
    return text.strip()


def plan_acl_deletion(admin: Admin, user: str, resource: str | None) -> list[AclRuleInfo]:
    """The rules `acl delete` removes: the user's rules, all or those on `resource` (read as the brokers
    read it: `topic:Orders` is `Topic:Orders`)."""
    wanted = None if resource is None else canonical_resource(resource)
    rules = [r for r in admin.list_acls(user) if wanted is None or r.resource == wanted]
    if not rules:
        raise NotFoundError(f"user {user!r} has no ACL rule" + (f" on {resource}" if resource is not None else ""))
    return rules
