"""Admin: topics, offsets, groups and messages across every broker (RocketMQ's MQAdmin).

Synchronous; used by the `tidemark` CLI and the Spark connector's driver side.
Calls that concern a topic go to the brokers holding it and merge the answers.

Admin's calls are split by subject into mixins, one module each: admin_cluster (brokers),
admin_topics (topics, routes, queue offsets), admin_groups (group offsets, lag, resets, members,
config), admin_messages (lookups, group-less reads, dead letters, producers' state) and admin_auth
(users, ACL rules), over admin_base (the state and helpers they share). This module holds the class
users import and its lifecycle.
"""

from __future__ import annotations

from typing import Any

from tidemark.client.admin_auth import AuthAdmin
from tidemark.client.admin_cluster import ClusterAdmin
from tidemark.client.admin_groups import GroupAdmin
from tidemark.client.admin_messages import MessageAdmin
from tidemark.client.admin_topics import TopicAdmin
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.client.runtime import LoopThread
from tidemark.client.settings import ClientSettings, build


# MessageAdmin builds on TopicAdmin and GroupAdmin, so it comes before them.
class Admin(ClusterAdmin, MessageAdmin, TopicAdmin, GroupAdmin, AuthAdmin):
    """Administration of a Tidemark cluster: brokers, topics, consumer groups and their offsets,
    messages and dead letters, users and ACL rules (RocketMQ's MQAdmin / DefaultMQAdminExt).

    Takes ClientSettings, or its fields as keywords (brokers=, namesrv=, credentials=, tls=,
    request_timeout_s=...); InvalidArgumentError for an unknown or bad one. Every call blocks until
    the brokers have answered. Use it as a context manager, or call start() and shutdown():

        with Admin(brokers="127.0.0.1:10911") as admin:
            admin.create_topic("Orders", 4)
            lag = sum(q.lag for q in admin.consume_stats("refunds", "Orders"))

    Errors are TidemarkError subclasses: ClientStateError for a call before start() or after
    shutdown(), UnavailableError when no broker that should answer does, RequestTimeoutError when a
    call takes too long, UnauthenticatedError or PermissionDeniedError when the brokers check
    credentials and these are missing or not allowed the call, and the errors each method names.
    """

    def __init__(self, settings: ClientSettings | None = None, /, **overrides: Any) -> None:
        self.settings: ClientSettings = build(ClientSettings, settings, overrides)  # type: ignore[assignment]
        self._loop = LoopThread("admin")
        self._cluster: BrokerCluster | None = None

    def start(self) -> Admin:
        """Start the client's loop thread and learn the brokers (from the broker list or the name
        servers); returns self. Calling it again while started does nothing.

        UnavailableError when no broker answers."""
        if self._cluster is not None:
            return self
        self._loop.start()
        s = self.settings
        try:
            self._cluster = self._loop.run(BrokerCluster.connect(s), timeout=s.request_timeout_s * 2)
        except BaseException:
            self._loop.stop()
            raise
        return self

    def shutdown(self) -> None:
        """Close the connections to the brokers and stop the loop thread. Safe to call twice, or
        without start()."""
        if self._cluster is not None:
            cluster, self._cluster = self._cluster, None
            self._loop.run(cluster.close(), timeout=self.settings.request_timeout_s)
        self._loop.stop()

    def __enter__(self) -> Admin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
