"""AccessGuard: who is calling (authentication) and may they (authorization).

Authentication checks the RocketMQ 5 signature a request carries
(tidemark/auth.py) against the user's secret, in constant time and within a
bounded clock skew. Authorization asks the ACL rules (acl.py) whether the user
may perform each action the request needs; a request needs several
(`Requirement`s: a commit needs Sub on its topic and on its group), and each
requirement is met when any of its actions is allowed (a route lookup: Pub,
Sub or Get on the topic). Retry and dead-letter topics belong to their group,
as in RocketMQ: `%RETRY%g` needs Sub on Group:g, `%DLQ%g` needs Get (to look)
or Update (anything else, such as a requeue) on Group:g.

Refusals are domain errors saying who, what and why; neither the secret nor
the signature is ever part of a message or a log line. Pure: no grpc; the
services layer extracts the metadata, the peer address and the requirements.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from broker.auth.acl import Action, Decision, Resource, ResourceType, User
from broker.auth.store import AuthStore
from broker.errors import PermissionDeniedError, UnauthenticatedError
from tidemark import auth as signatures
from tidemark.protocol import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX


@dataclass(frozen=True, slots=True)
class Requirement:
    """One thing a request needs: any of `actions` on `resource`."""

    resource: Resource
    actions: frozenset[Action]

    def __str__(self) -> str:
        return f"{'|'.join(sorted(a.value for a in self.actions))} on {self.resource}"


def on_topic(topic: str, *actions: Action) -> Requirement:
    """A requirement on a topic; a retry or dead-letter topic's is on its group instead."""
    if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return Requirement(Resource(ResourceType.GROUP, topic[len(RETRY_GROUP_TOPIC_PREFIX):]), frozenset({Action.SUB}))
    if topic.startswith(DLQ_GROUP_TOPIC_PREFIX):
        group = Resource(ResourceType.GROUP, topic[len(DLQ_GROUP_TOPIC_PREFIX):])
        looking = set(actions) <= {Action.GET, Action.LIST}
        return Requirement(group, frozenset({Action.GET} if looking else {Action.UPDATE}))
    return Requirement(Resource(ResourceType.TOPIC, topic), frozenset(actions))


def on_group(group: str, *actions: Action) -> Requirement:
    return Requirement(Resource(ResourceType.GROUP, group), frozenset(actions))


def on_cluster(*actions: Action) -> Requirement:
    return Requirement(Resource(ResourceType.CLUSTER), frozenset(actions))


class AccessGuard:
    def __init__(self, store: AuthStore, *, max_skew_s: float = signatures.DEFAULT_MAX_SKEW_S,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._max_skew_s = max_skew_s
        self._clock = clock

    def authenticate(self, metadata: Mapping[str, str]) -> User:
        """The calling user, or UnauthenticatedError saying what is missing or wrong."""
        try:
            claim = signatures.parse(dict(metadata))
        except signatures.SignatureError as e:
            raise UnauthenticatedError(str(e)) from None
        user = self._store.user(claim.access_key)
        if user is None:
            # Same work as a known user, so a probe cannot tell unknown keys from wrong secrets by timing.
            signatures.sign("x" * 16, claim.date_time)
            raise UnauthenticatedError(f"unknown access key {claim.access_key!r} or wrong signature")
        try:
            signatures.verify(claim, user.secret_key, now=self._clock(), max_skew_s=self._max_skew_s)
        except signatures.SignatureError as e:
            raise UnauthenticatedError(str(e)) from None
        return user

    def authorize(self, user: User, requirements: Iterable[Requirement], source_ip: str) -> None:
        """PermissionDeniedError naming the first requirement the user's rules do not meet."""
        if user.super_user:
            return
        for need in requirements:
            if not any(self._store.authorize(user, need.resource, action, source_ip) is Decision.ALLOW
                       for action in need.actions):
                raise PermissionDeniedError(f"user {user.name!r} may not {need} (from {source_ip or 'unknown'})")

    def require_super(self, user: User) -> None:
        if not user.super_user:
            raise PermissionDeniedError(f"user {user.name!r} is not a super user: users and ACLs are managed "
                                        f"by super users only")
