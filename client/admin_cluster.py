"""Admin's broker calls: who the brokers are, their status, roles and permissions (RocketMQ's
clusterList, brokerStatus, updateBrokerConfig brokerPermission, deleteExpiredCommitLog).

A mixin of Admin (tidemark.client.admin); use it through Admin.
"""

from __future__ import annotations

from tidemark.client.admin_base import AdminBase
from tidemark.client.types import BrokerInfo, BrokerStatus, ClusterBroker

__all__ = ["ClusterAdmin"]


class ClusterAdmin(AdminBase):
    """Brokers: identity, status, promotion, permission, commit-log cleanup."""

    def brokers(self) -> list[BrokerInfo]:
        """Name, address, id, epoch, permission, version, flush mode and delay levels of every broker
        name this client reaches (its master, or its replica while the master is away).

        Raises UnavailableError when no broker answers."""
        async def go() -> list[BrokerInfo]:
            return [await c.broker_info() for c in (await self._brokers()).values()]
        return self._run(go())

    def broker_status(self) -> list[BrokerStatus]:
        """Version, uptime, store size, flush mode, role, clients and counts of every broker (brokerStatus):
        replicas too, those the name servers know and those given in the broker list."""
        async def go() -> list[BrokerStatus]:
            addresses = [b.address for b in await self.cluster.cluster()]
            addresses += [a for a in self.settings.brokers or () if a not in addresses]
            found = [await self.cluster.connection_at(a).broker_status() for a in addresses]
            unique = {(s.broker_name, s.broker_id, s.broker_addr): s for s in found}
            return sorted(unique.values(), key=lambda s: (s.broker_name, s.broker_id))
        return self._run(go())

    def broker_status_at(self, address: str) -> BrokerStatus:
        """brokerStatus of the one broker at `address` (UnavailableError when it does not answer)."""
        async def go() -> BrokerStatus:
            return await self.cluster.connection_at(address).broker_status()
        return self._run(go())

    def cluster_list(self) -> list[ClusterBroker]:
        """Every broker with its cluster, role and last registration (see BrokerCluster.cluster)."""
        return self._run(self.cluster.cluster())

    def promote(self, address: str) -> BrokerInfo:
        """Make the replica at `address` the master of its broker name (`tidemark broker promote`)."""
        async def go() -> BrokerInfo:
            return await self.cluster.connection_at(address).promote()
        return self._run(go())

    def update_broker_permission(self, broker_name: str, *, readable: bool, writable: bool) -> BrokerInfo:
        """Let a broker serve reads and/or writes, or stop it (RocketMQ's brokerPermission): a broker that
        is not writable refuses sends, one that is not readable is left out of routes for reading.

        Returns the broker's info with its new permission. NotFoundError when no known broker has
        that name."""
        async def go() -> BrokerInfo:
            return await (await self.cluster.connection(broker_name)).update_broker_permission(
                readable=readable, writable=writable)
        return self._run(go())

    def delete_expired_commitlog(self) -> int:
        """Make every broker delete its expired commit-log segments now instead of at its next cleanup
        (RocketMQ's deleteExpiredCommitLog); the number of segments deleted, over all brokers."""
        async def go() -> int:
            return sum([await c.delete_expired_commitlog() for c in (await self._brokers()).values()])
        return self._run(go())
