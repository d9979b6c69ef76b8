"""AccessGuard: who is calling (authentication) and may they (authorization).

Authentication checks the RocketMQ 5 signature a request carries
(common/auth.py) against the user's secret, in constant time and within a
bounded clock skew. Authorization asks the ACL rules (acl.py) whether the user
may perform each action the request needs; a request needs several
(`Requirement`s: a commit needs Sub on its topic and on its group), and each
requirement is met when any of its actions is allowed (a route lookup: Pub,
Sub or Get on the topic). Retry and dead-letter topics belong to their group,
as in RocketMQ (`%RETRY%g` and `%DLQ%g` need rights on Group:g, see `on_topic`; a pop group's
retry topic `%RETRY%g_T` is g's, see `retry_topic_owner`), and the schedule topic, which holds
every topic's delayed messages, is super users'.

Refusals are domain errors saying who, what and why; neither the secret nor
the signature is ever part of a message or a log line. Pure: no grpc; the
services layer extracts the metadata, the peer address and the requirements.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from tidemark.broker.auth.acl import Action, Decision, Resource, ResourceType, User
from tidemark.broker.auth.store import AuthStore
from tidemark.broker.errors import PermissionDeniedError, UnauthenticatedError
from tidemark.common import auth as signatures
from tidemark.common.protocol import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
)

INVALID_CREDENTIALS = "invalid access key or signature"


@dataclass(frozen=True, slots=True)
class Requirement:
    """One thing a request needs: any of `actions` on `resource` (no actions: super users only)."""

    resource: Resource
    actions: frozenset[Action]
    # Set when `resource` is the group a %RETRY% topic's name reads as: the guard asks which group owns it.
    retry_topic: str = ""

    def __str__(self) -> str:
        if not self.actions:
            return f"use {self.resource} (super users only)"
        return f"{'|'.join(sorted(a.value for a in self.actions))} on {self.resource}"


# What an action on a retry or dead-letter topic needs on its group. Consumers read and send back to
# %RETRY%g with Sub; looking at a DLQ is Get, anything that moves its messages (a requeue) Update.
_RETRY_ACTIONS = {Action.PUB: Action.SUB, Action.SUB: Action.SUB, Action.GET: Action.GET, Action.LIST: Action.GET}
_DLQ_ACTIONS = {Action.GET: Action.GET, Action.LIST: Action.GET, Action.SUB: Action.GET, Action.PUB: Action.UPDATE}


def on_topic(topic: str, *actions: Action) -> Requirement:
    """A requirement on a topic. A retry or dead-letter topic's is on its group instead (Create, Update
    and Delete stay what they are), and the broker's schedule topic, which holds the delayed messages
    of every topic, is for super users only."""
    for prefix, mapping in ((RETRY_GROUP_TOPIC_PREFIX, _RETRY_ACTIONS), (DLQ_GROUP_TOPIC_PREFIX, _DLQ_ACTIONS)):
        if topic.startswith(prefix):
            group = Resource(ResourceType.GROUP, topic[len(prefix):])
            retry = topic if prefix == RETRY_GROUP_TOPIC_PREFIX else ""
            return Requirement(group, frozenset(mapping.get(a, a) for a in actions), retry)
    if topic == SCHEDULE_TOPIC:
        return Requirement(Resource(ResourceType.CLUSTER), frozenset())
    return Requirement(Resource(ResourceType.TOPIC, topic), frozenset(actions))


def retry_topic_owner(topic: str, is_group: Callable[[str], bool], is_topic: Callable[[str], bool]) -> str:
    """The group a %RETRY% topic belongs to. A consumer group X sends its failed messages back to %RETRY%X,
    while a pop group G keeps its expired deliveries of topic T in %RETRY%G_T (RocketMQ 5's first naming,
    broker/pop/): the name alone cannot tell the two apart, as group and topic names may hold "_" too.
    What the broker has can: X is read as G_T when no group X exists but group G and topic T do (the first
    such split, shortest G first). A group X that exists keeps its own retry topic, as in RocketMQ, so
    rights on G never reach another group's retries."""
    name = topic[len(RETRY_GROUP_TOPIC_PREFIX):]
    if is_group(name):
        return name
    for i, c in enumerate(name):
        if c == "_" and i and is_group(name[:i]) and is_topic(name[i + 1:]):
            return name[:i]
    return name


def on_group(group: str, *actions: Action) -> Requirement:
    return Requirement(Resource(ResourceType.GROUP, group), frozenset(actions))


def on_cluster(*actions: Action) -> Requirement:
    return Requirement(Resource(ResourceType.CLUSTER), frozenset(actions))


class AccessGuard:
    """`retry_owner`: the group owning a %RETRY% topic (`retry_topic_owner` over the broker's groups and
    topics); without it, %RETRY%X is group X's."""

    def __init__(self, store: AuthStore, *, max_skew_s: float = signatures.DEFAULT_MAX_SKEW_S,
                 clock: Callable[[], float] = time.time,
                 retry_owner: Callable[[str], str] | None = None) -> None:
        self._store = store
        self._max_skew_s = max_skew_s
        self._clock = clock
        self._retry_owner = retry_owner

    def authenticate(self, metadata: Mapping[str, str]) -> User:
        """The calling user, or UnauthenticatedError. An unknown access key and a wrong signature get the
        same answer, so the broker does not tell which access keys exist."""
        try:
            claim = signatures.parse(dict(metadata))
            signatures.check_time(claim, now=self._clock(), max_skew_s=self._max_skew_s)
        except signatures.SignatureError as e:
            raise UnauthenticatedError(str(e)) from None
        user = self._store.user(claim.access_key)
        # A made-up secret for an unknown key: the same work, so timing does not tell either.
        if not signatures.matches(claim, user.secret_key if user is not None else "\0" * 16) or user is None:
            raise UnauthenticatedError(INVALID_CREDENTIALS)
        return user

    @property
    def version(self) -> int:
        """The users' and rules' version: decisions taken at it hold until it changes."""
        return self._store.version

    def current(self, user: User) -> User:
        """The user as the store has it now: a long stream re-checks that its user still exists with the
        same secret (deleted or rotated: UnauthenticatedError) and picks up a changed super-user flag."""
        now = self._store.user(user.name)
        if now is None or now.secret_key != user.secret_key:
            raise UnauthenticatedError(f"user {user.name!r} was deleted or its secret changed; sign in again")
        return now

    def authorize(self, user: User, requirements: Iterable[Requirement], source_ip: str) -> None:
        """PermissionDeniedError naming the first requirement the user's rules do not meet."""
        if user.super_user:
            return
        for need in requirements:
            if need.retry_topic and self._retry_owner is not None:
                owner = self._retry_owner(need.retry_topic)
                if owner != need.resource.name:
                    need = Requirement(Resource(ResourceType.GROUP, owner), need.actions)
            if not any(self._store.authorize(user, need.resource, action, source_ip) is Decision.ALLOW
                       for action in need.actions):
                raise PermissionDeniedError(f"user {user.name!r} may not {need} (from {source_ip or 'unknown'})")

    def require_super(self, user: User) -> None:
        if not user.super_user:
            raise PermissionDeniedError(f"user {user.name!r} is not a super user: users and ACLs are managed "
                                        f"by super users only")
