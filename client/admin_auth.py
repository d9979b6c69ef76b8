"""Admin's user and ACL calls (RocketMQ 5's createUser, updateUser, deleteUser, listUser, createAcl,
deleteAcl, listAcl).

Each broker keeps its own users and rules (RocketMQ's mqadmin applies them per broker or cluster):
changes go to every broker, or the named ones; lists say which brokers hold each entry. A mixin of
Admin (tidemark.client.admin); use it through Admin.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from tidemark.client.admin_base import AdminBase
from tidemark.client.errors import NotFoundError
from tidemark.client.remoting.connection import BrokerConnection
from tidemark.client.types import AclRuleInfo, UserInfo

__all__ = ["AuthAdmin"]

T = TypeVar("T")


class AuthAdmin(AdminBase):
    """Users and ACL rules, broker by broker."""

    async def _targets(self, brokers: Sequence[str] | None) -> list[tuple[str, BrokerConnection]]:
        if brokers:
            return [(b, await self.cluster.connection(b)) for b in brokers]
        return sorted((await self._brokers()).items())

    async def _where_found(self, call: Callable[[BrokerConnection], Awaitable[T]]) -> list[tuple[str, T]]:
        """call() on every broker; the answers of those that did not answer NOT_FOUND (NotFoundError if none)."""
        found: list[tuple[str, T]] = []
        missing: NotFoundError | None = None
        for name, c in await self._targets(None):
            try:
                found.append((name, await call(c)))
            except NotFoundError as e:
                missing = e
        if not found and missing is not None:
            raise missing
        return found

    @staticmethod
    def _merge(entries: list[tuple[str, Any]]) -> list[Any]:
        """Equal entries from several brokers as one, with the brokers' names."""
        where: dict[Any, list[str]] = {}
        for broker, entry in entries:
            where.setdefault(entry, []).append(broker)
        return [replace(entry, brokers=tuple(brokers)) for entry, brokers in where.items()]

    def create_user(self, name: str, secret_key: str, *, super_user: bool = False,
                    brokers: Sequence[str] | None = None) -> UserInfo:
        """Create a user (access key `name`) on every broker, or the named ones."""
        async def go() -> UserInfo:
            done = [(b, await c.create_user(name, secret_key, super_user=super_user))
                    for b, c in await self._targets(brokers)]
            return self._merge(done)[0]
        return self._run(go())

    def update_user(self, name: str, *, secret_key: str | None = None,
                    super_user: bool | None = None) -> UserInfo:
        """Change a user's secret key and/or super-user flag on every broker that has the user."""
        async def go() -> UserInfo:
            return self._merge(await self._where_found(
                lambda c: c.update_user(name, secret_key=secret_key, super_user=super_user)))[0]
        return self._run(go())

    def delete_user(self, name: str) -> int:
        """Delete a user and its ACL rules on every broker that has it; the number of rules deleted."""
        async def go() -> int:
            return sum(n for _b, n in await self._where_found(lambda c: c.delete_user(name)))
        return self._run(go())

    def list_users(self) -> list[UserInfo]:
        """Every user on any broker (never its secret key), sorted by name; a user held alike by several
        brokers is one entry naming them in `brokers`."""
        async def go() -> list[UserInfo]:
            entries = [(b, u) for b, c in await self._targets(None) for u in await c.list_users()]
            return sorted(self._merge(entries), key=lambda u: (u.name, u.brokers))
        return self._run(go())

    def create_acl(self, user: str, resource: str, actions: Sequence[str], decision: str, *,
                   source_ips: Sequence[str] = (), brokers: Sequence[str] | None = None) -> AclRuleInfo:
        """Add a rule for `user` on every broker (or the named ones): resource `Topic:NAME`, `Topic:PREFIX*`,
        `Group:NAME`, `Cluster`...; actions Pub, Sub, Create, Update, Delete, Get, List, All; Allow or Deny."""
        async def go() -> AclRuleInfo:
            done = [(b, await c.create_acl(user, resource, actions, decision, source_ips))
                    for b, c in await self._targets(brokers)]
            return self._merge(done)[0]
        return self._run(go())

    def delete_acl(self, user: str, resource: str | None = None) -> int:
        """Delete a user's rules (all, or those on `resource`) on every broker; how many were deleted."""
        async def go() -> int:
            return sum(n for _b, n in await self._where_found(lambda c: c.delete_acl(user, resource)))
        return self._run(go())

    def list_acls(self, user: str | None = None) -> list[AclRuleInfo]:
        """ACL rules on any broker (of one user, if given), broker by broker in name order; a rule held
        alike by several brokers is one entry naming them in `brokers`."""
        async def go() -> list[AclRuleInfo]:
            entries = [(b, r) for b, c in await self._targets(None) for r in await c.list_acls(user)]
            return self._merge(entries)
        return self._run(go())
