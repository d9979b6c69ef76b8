"""What each RPC needs to be allowed: resources and actions read off its request.

One table, `NEEDS`, from method name to a function of the (decoded) request
giving its `Requirement`s; for streams, of each message. A method missing from
the table is for super users only, so a new RPC is closed until someone says
what it needs (test_auth checks every method has an entry). The rules follow
RocketMQ 5's Access Control 2.0:

- sending is Pub on the topic; reading, committing, heartbeats and queue locks
  are Sub on the topic and on the group;
- topic and group administration is Create / Update / Delete / Get / List;
  resetting a group's offsets is Update on the group;
- a route is Pub, Sub or Get on its topic; broker info only needs a user;
- broker-wide operations are on Cluster; users and ACLs are super users' only.
"""

from __future__ import annotations

import contextvars
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tidemark.broker.auth.acl import Action, User
from tidemark.broker.auth.guard import AccessGuard, Requirement, on_cluster, on_group, on_topic
from tidemark.broker.errors import PermissionDeniedError
from tidemark.broker.services.rmq5.convert import stored_name

PUB, SUB, CREATE, UPDATE, DELETE, GET, LIST = (Action.PUB, Action.SUB, Action.CREATE, Action.UPDATE, Action.DELETE,
                                               Action.GET, Action.LIST)
Needs = Callable[[object], Iterable[Requirement]]

SUPER_ONLY = object()  # marker: the method is for super users


def _consuming(group: str, topics: Iterable[str]) -> list[Requirement]:
    # A read without a group (Admin.pull, `tidemark message consume` without --group, the Spark source)
    # commits nothing for anyone: it needs Sub on the topic only.
    on_topics = [on_topic(t, SUB) for t in dict.fromkeys(topics)]
    return [on_group(group, SUB), *on_topics] if group else on_topics


def _fetch(r) -> list[Requirement]:
    if r.WhichOneof("kind") != "open":
        return []  # credit and close act on a queue the stream already opened
    return _consuming(r.open.group, [r.open.topic])


def _commits(commits) -> list[Requirement]:
    needs: dict[Requirement, None] = {}
    for c in commits:
        needs.update(dict.fromkeys(_consuming(c.group, [c.topic])))
    return list(needs)


NEEDS: dict[str, Needs | object] = {
    # MessagingService
    "SendMessage": lambda r: [on_topic(r.topic, PUB)],
    "Produce": lambda r: [on_topic(r.topic, PUB)],
    "InitProducer": lambda r: [on_topic(r.topic, PUB)],
    "EndTransaction": lambda r: [on_topic(r.topic, PUB)],
    # Pub on each topic whose half messages it is asked about (a watch naming none is refused later).
    "WatchTransactionChecks": lambda r: [on_topic(t, PUB) for t in r.topics] or [on_group(r.group, PUB)],
    "PullMessage": lambda r: _consuming(r.group, [r.topic]),
    "Fetch": _fetch,
    "ConsumerSendMsgBack": lambda r: [on_group(r.group, SUB)],
    "ViewMessage": lambda r: [on_topic(r.topic, GET)],
    "QueryMessageByKey": lambda r: [on_topic(r.topic, GET)],
    # OffsetService
    "UpdateConsumerOffset": lambda r: _consuming(r.commit.group, [r.commit.topic]),
    "CommitOffsets": lambda r: _commits(r.commits),
    "QueryConsumerOffset": lambda r: _consuming(r.group, [r.topic]),
    "GetMinOffset": lambda r: [on_topic(r.topic, SUB, GET)],
    "GetMaxOffset": lambda r: [on_topic(r.topic, SUB, GET)],
    "SearchOffsetByTimestamp": lambda r: [on_topic(r.topic, SUB, GET)],
    "ResetOffset": lambda r: [on_group(r.group, UPDATE)],
    "GetConsumeStats": lambda r: [on_group(r.group, GET)],
    # MembershipService
    "Heartbeat": lambda r: _consuming(r.group, [s.topic for s in r.subscriptions]),
    "UnregisterClient": lambda r: [on_group(r.group, SUB)],
    "GetConsumerList": lambda r: [on_group(r.group, SUB, GET)],
    "WatchConsumerIds": lambda r: [on_group(r.group, SUB)],
    "LockQueues": lambda r: _consuming(r.group, [q.topic for q in r.queues]),
    "UnlockQueues": lambda r: _consuming(r.group, [q.topic for q in r.queues]
                                         + [f.queue.topic for f in r.final_offsets]),
    # AdminService
    "CreateTopic": lambda r: [on_topic(r.name, CREATE)],
    "UpdateTopic": lambda r: [on_topic(r.name, UPDATE)],
    "DeleteTopic": lambda r: [on_topic(r.name, DELETE)],
    "ListTopics": lambda r: [on_cluster(LIST)],
    "GetRoute": lambda r: [on_topic(r.topic, PUB, SUB, GET)],
    "GetTopicStats": lambda r: [on_topic(r.topic, GET)],
    "GetBrokerInfo": lambda r: [],
    "UpdateBrokerPermission": lambda r: [on_cluster(UPDATE)],
    "PromoteBroker": lambda r: [on_cluster(UPDATE)],
    "ListProducers": lambda r: [on_topic(r.topic, GET)] if r.topic else [on_cluster(LIST)],
    "ListTransactions": lambda r: [on_cluster(LIST)],
    # ReplicationService: a replica reads everything the master holds.
    "Replicate": lambda r: [on_cluster(UPDATE)],
    "GetMetadata": lambda r: [on_cluster(UPDATE)],
    "HandBackOffsets": lambda r: [on_cluster(UPDATE)],
    "ListGroups": lambda r: [on_cluster(LIST)],
    "DescribeGroup": lambda r: [on_group(r.group, GET)],
    "DeleteGroup": lambda r: [on_group(r.group, DELETE)],
    "GetGroupConfig": lambda r: [on_group(r.group, GET)],
    "UpdateGroupConfig": lambda r: [on_group(r.group, UPDATE)],
    "DeleteGroupOffsets": lambda r: [on_group(r.group, DELETE)],
    # Reads the source group's offsets of the topic, changes the destination's (an empty name is refused later).
    "CloneGroupOffsets": lambda r: [on_topic(r.topic, GET)] + [on_group(g, a) for g, a in
                                                               ((r.src_group, GET), (r.dest_group, UPDATE)) if g],
    # Without a topic every topic is searched: Get on the cluster.
    # Without a topic every topic is searched; the answer keeps only copies on topics the user may Get.
    "QueryMessageById": lambda r: [on_topic(r.topic, GET)] if r.topic else [on_cluster(GET)],
    # Get on the topic; the answer keeps only the groups whose readers the caller may see (`sees_readers_of`).
    "GetDeliveries": lambda r: [on_topic(r.topic, GET)],
    "GetBrokerStatus": lambda r: [on_cluster(GET)],
    "DeleteExpiredCommitLog": lambda r: [on_cluster(UPDATE)],
    "CreateUser": SUPER_ONLY,
    "UpdateUser": SUPER_ONLY,
    "DeleteUser": SUPER_ONLY,
    "ListUsers": SUPER_ONLY,
    "CreateAcl": SUPER_ONLY,
    "DeleteAcl": SUPER_ONLY,
    "ListAcls": SUPER_ONLY,
}


def _telemetry(r) -> list[Requirement]:
    """A client's settings: what it publishes, or the group and topics it consumes."""
    if r.WhichOneof("command") != "settings":
        return []  # answers to the broker's own commands
    s = r.settings
    if s.WhichOneof("pub_sub") == "publishing":
        return [on_topic(_topic(t), PUB) for t in s.publishing.topics]
    if s.WhichOneof("pub_sub") == "subscription":
        return _consuming(_group(s.subscription.group), [_topic(e.topic) for e in s.subscription.subscriptions])
    return []


# A RocketMQ 5 resource's stored name (`NAMESPACE%name` in a namespace), which the rules are about: a rule on
# `Topic:NS%*` grants namespace NS's topics. A bad namespace is refused here, with the adapter's BAD_REQUEST.
def _topic(resource) -> str:
    return stored_name(resource, "topic")


def _group(resource) -> str:
    return stored_name(resource, "group")


def _v2_group(r) -> list[Requirement]:
    return [on_group(_group(r.group), SUB)] if r.HasField("group") and r.group.name else []


def _v2_consuming(r) -> list[Requirement]:
    return _consuming(_group(r.group), [_topic(r.topic)])


def _v2_queue(r) -> list[Requirement]:
    return _consuming(_group(r.group), [_topic(r.message_queue.topic)])


# RocketMQ 5's apache.rocketmq.v2.MessagingService (broker/services/rmq5), as RocketMQ's gRPC
# authorization context builder reads its requests. Its method names overlap tidemark.v1's.
V2_SERVICE = "apache.rocketmq.v2.MessagingService"
NEEDS_V2: dict[str, Needs | object] = {
    "QueryRoute": lambda r: [on_topic(_topic(r.topic), PUB, SUB, GET)],
    "Telemetry": _telemetry,
    "Heartbeat": _v2_group,
    "NotifyClientTermination": _v2_group,
    "SendMessage": lambda r: [on_topic(t, PUB) for t in dict.fromkeys(_topic(m.topic) for m in r.messages)],
    "EndTransaction": lambda r: [on_topic(_topic(r.topic), PUB)],
    "RecallMessage": lambda r: [on_topic(_topic(r.topic), PUB)],
    "QueryAssignment": _v2_consuming,
    "ReceiveMessage": _v2_queue,
    "AckMessage": _v2_consuming,
    "ChangeInvisibleDuration": _v2_consuming,
    "ForwardMessageToDeadLetterQueue": _v2_consuming,
    "PullMessage": _v2_queue,
    "UpdateOffset": _v2_queue,
    "GetOffset": _v2_queue,
    "QueryOffset": lambda r: [on_topic(_topic(r.message_queue.topic), SUB, GET)],
}

# Served to anyone: orchestrators probe health, and reflection only describes the API. The name server
# keeps no users: whoever reaches its port may register a broker (run it where only brokers and clients can).
OPEN_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                 "tidemark.v1.NameServerService")


def needs_for(method_path: str) -> Needs | object | None:
    """The requirements function of `/package.Service/Method`; None for an open service; SUPER_ONLY
    for the user/ACL methods and any method the table does not know."""
    service, _, name = method_path.lstrip("/").partition("/")
    if service in OPEN_SERVICES:
        return None
    return (NEEDS_V2 if service == V2_SERVICE else NEEDS).get(name, SUPER_ONLY)


def peer_ip(peer: str) -> str:
    """The address part of a gRPC peer string ("ipv4:10.0.0.1:5000", "ipv6:%5B::1%5D:5000"); "" if none."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return ""
    host = urllib.parse.unquote(rest).rsplit(":", 1)[0]
    return host.strip("[]")


@dataclass(slots=True)
class Caller:
    """An authenticated call: its user and address, and (streams) every requirement met so far."""

    user: User
    source_ip: str
    granted: set[Requirement] = field(default_factory=set)
    checked_at: int = -1  # the users/rules version `granted` was last checked at


_current: contextvars.ContextVar[tuple[AccessGuard, Caller] | None] = contextvars.ContextVar(
    "tidemark_caller", default=None)


def require(*needs: Requirement) -> None:
    """Check requirements a handler learns only from stored data (the topic of a message sent back)
    for the current call's user; nothing when access control is off."""
    current = _current.get()
    if current is not None:
        guard, caller = current
        guard.authorize(caller.user, needs, caller.source_ip)


def allowed(*needs: Requirement) -> bool:
    """Whether the current call's user meets these requirements (always, with access control off): for
    handlers that show only what the caller may see of what they found."""
    try:
        require(*needs)
    except PermissionDeniedError:
        return False
    return True


def sees_readers_of(group: str) -> bool:
    """Whether the current call's user may see which clients read for `group` (their client ids: host and
    pid), as GetConsumerList shows them: Sub or Get on the group. A topic's delivery records name every
    group reading it, so Get on the topic alone shows none of them (always, with access control off)."""
    return allowed(on_group(group, SUB, GET))


class MethodAccess:
    """Authentication and authorization of one method's calls (open methods skip both)."""

    __slots__ = ("_guard", "_needs")

    def __init__(self, guard: AccessGuard, method_path: str) -> None:
        self._guard = guard
        self._needs = needs_for(method_path)

    @property
    def open(self) -> bool:
        return self._needs is None

    def caller(self, metadata: Iterable[tuple[str, str | bytes]], peer: str) -> Caller:
        """The authenticated caller (UnauthenticatedError otherwise); super-user-only methods check here.
        The caller is also the current one for `require` in the handler."""
        text = {k.lower(): v for k, v in metadata if isinstance(v, str)}
        user = self._guard.authenticate(text)
        if self._needs is SUPER_ONLY:
            self._guard.require_super(user)
        caller = Caller(user, peer_ip(peer))
        _current.set((self._guard, caller))
        return caller

    def check(self, caller: Caller, request: object) -> None:
        """PermissionDeniedError unless the caller may do what this request needs."""
        if self._needs is not SUPER_ONLY:
            self._guard.authorize(caller.user, self._needs(request), caller.source_ip)

    def check_stream_message(self, caller: Caller, request: object) -> None:
        """A stream message: once users or rules have changed, the user is looked up again (deleted or
        rotated: UnauthenticatedError) and everything the stream was granted is checked again with what
        this message needs, so a revoked rule stops a stream at its next message (a Fetch stream's next
        credit); while nothing changes, only a message needing something new is checked."""
        needs = () if self._needs is SUPER_ONLY else self._needs(request)
        version = self._guard.version
        if version == caller.checked_at and caller.granted.issuperset(needs):
            return  # nothing changed since the last check: a Fetch credit costs no rule evaluation
        caller.user = self._guard.current(caller.user)
        if self._needs is SUPER_ONLY:
            self._guard.require_super(caller.user)
        else:
            caller.granted.update(needs)
            self._guard.authorize(caller.user, caller.granted, caller.source_ip)
        caller.checked_at = version
