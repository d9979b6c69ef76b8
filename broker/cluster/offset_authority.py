"""Where a broker name's consumer offsets may be read and changed, so that a group's offset never reads
lower than one already read, and no commit is taken where the next master will not have it.

- Changes: at a master sure it still is one (BrokerPermission.check_current: not fenced, its etcd lease
  certain). In controller mode only there: etcd elects the next master within seconds and consumers keep
  their progress meanwhile. Without a controller a replica also takes its consumers' commits while its
  master is away, and hands them back to it (ReplicaSync).
- Queries: anywhere but a replica that has not copied its master's offsets since it started following it
  (a restart's file, or a replaced master's own table, may be older than what the master answered). In
  controller mode, also not at a replica whose stream from its master is down, or silent for a few
  heartbeats (ReplicaSync.offsets_current: a link that drops packets ends no stream): its copy stops where the
  stream broke, and the master (or the same broker back under a new epoch, which the replica follows at the
  same address) may have taken and answered commits since; the fault checker's controller scenario saw
  such a replica answer 484 for an offset its master had answered 489 a second before, the master killed
  meanwhile. Without a controller the replica stands in for its master while it is away (it takes its
  consumers' commits), so it keeps answering.
"""

from __future__ import annotations

from collections.abc import Callable

from tidemark.broker.cluster.permission import BrokerPermission
from tidemark.broker.cluster.replica_sync import ReplicaSync
from tidemark.broker.errors import NotCurrentError


class OffsetAuthority:
    def __init__(self, *, permission: BrokerPermission, replica: Callable[[], ReplicaSync | None],
                 controller_mode: bool, name: Callable[[], str]) -> None:
        self._permission = permission
        self._replica = replica  # asked at each call: a promotion ends the replica
        self._controller_mode = controller_mode
        self._name = name  # "broker-a/1", for the messages

    def check_change(self) -> None:
        """NotCurrentError unless offsets may change here now."""
        if self._replica() is not None and self._controller_mode:
            raise NotCurrentError(f"replica {self._name()} takes no commits in controller mode; they go to the "
                                  f"master etcd elects")
        self._permission.check_current()

    def check_query(self) -> None:
        """NotCurrentError while this replica's offsets may be older than its master's."""
        replica = self._replica()
        if replica is None:
            return
        if not replica.offsets_copied:
            raise NotCurrentError(f"replica {self._name()} has not copied the consumer offsets of its master "
                                  f"{replica.master} yet; ask the master")
        if self._controller_mode and not replica.offsets_current:
            raise NotCurrentError(f"replica {self._name()} is not copying the consumer offsets of its master "
                                  f"{replica.master} right now (its stream is down or silent), and the master may have "
                                  f"taken commits since; ask the master etcd elects")
