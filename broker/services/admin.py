"""AdminService: topics, routes, broker info and permission, groups, retention, users and ACL rules."""

from __future__ import annotations

import grpc

from tidemark.broker.auth import AclRule, Action, Decision, Resource, User
from tidemark.broker.auth.guard import on_topic
from tidemark.broker.controller import BrokerController
from tidemark.broker.errors import InvalidArgumentError, NotFoundError
from tidemark.broker.membership.groups import GroupConfig, check_group
from tidemark.broker.observe.status import broker_status
from tidemark.broker.operations import OffsetChange
from tidemark.broker.services import access
from tidemark.broker.services.convert import expression_type_pb, message_ext, queue, topic_config
from tidemark.broker.services.errors import rpc
from tidemark.broker.version import VERSION
from tidemark.common.protocol import ExpressionType, format_duration_ms
from tidemark.v1 import admin_pb2, admin_pb2_grpc, common_pb2, offsets_pb2


def _group_config(g: GroupConfig) -> admin_pb2.GroupConfig:
    return admin_pb2.GroupConfig(group=g.group, consume_enable=g.consume_enable,
                                 consume_broadcast_enable=g.consume_broadcast_enable,
                                 retry_queue_nums=g.retry_queue_nums, retry_max_times=g.retry_max_times,
                                 consume_orderly=g.consume_orderly)


def _optional(request, name: str):
    return getattr(request, name) if request.HasField(name) else None


def _changes(changes: list[OffsetChange], broker_name: str) -> list[offsets_pb2.QueueOffsetChange]:
    return [offsets_pb2.QueueOffsetChange(queue=queue(c.topic, broker_name, c.queue_id), old_offset=c.old_offset,
                                          new_offset=c.new_offset) for c in changes]


def _user_info(u: User) -> admin_pb2.UserInfo:
    return admin_pb2.UserInfo(name=u.name, super_user=u.super_user)  # never the secret


def _acl_rule(r: AclRule) -> admin_pb2.AclRule:
    return admin_pb2.AclRule(user=r.user, resource=str(r.resource), actions=[a.value for a in r.sorted_actions()],
                             decision=r.decision.value, source_ips=list(r.source_ips))


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, broker: BrokerController) -> None:
        self._b = broker

    @rpc
    async def CreateTopic(self, request, context: grpc.aio.ServicerContext):
        return topic_config(self._b.topics.create(request.name, request.queue_nums))

    @rpc
    async def UpdateTopic(self, request, context: grpc.aio.ServicerContext):
        return topic_config(self._b.topics.update(
            request.name,
            read_queue_nums=_optional(request, "read_queue_nums"),
            write_queue_nums=_optional(request, "write_queue_nums"),
            readable=_optional(request, "readable"),
            writable=_optional(request, "writable")))

    @rpc
    async def DeleteTopic(self, request, context: grpc.aio.ServicerContext):
        await self._b.delete_topic(request.name)
        return admin_pb2.DeleteTopicResponse()

    @rpc
    async def ListTopics(self, request, context: grpc.aio.ServicerContext):
        topics = self._b.topics.list(include_system=request.include_system)
        return admin_pb2.ListTopicsResponse(topics=[topic_config(t) for t in topics])

    @rpc
    async def GetRoute(self, request, context: grpc.aio.ServicerContext):
        route, config = self._b.operations.route(request.topic), self._b.config
        t = route.topic
        return admin_pb2.TopicRoute(topic=t.name, queue_datas=[admin_pb2.QueueData(
            broker_name=config.broker_name, broker_addr=config.address,
            read_queue_nums=t.read_queue_nums, write_queue_nums=t.write_queue_nums,
            readable=route.readable, writable=route.writable)])

    @rpc
    async def GetTopicStats(self, request, context: grpc.aio.ServicerContext):
        name = self._b.config.broker_name
        return admin_pb2.GetTopicStatsResponse(queues=[
            admin_pb2.TopicQueueStats(queue=queue(request.topic, name, s.queue_id), min_offset=s.min_offset,
                                      max_offset=s.max_offset, last_update_timestamp=s.last_store_timestamp)
            for s in self._b.operations.topic_stats(request.topic)])

    def _broker_info(self) -> admin_pb2.BrokerInfo:
        c = self._b.config
        return admin_pb2.BrokerInfo(broker_name=c.broker_name, broker_addr=c.address,
                                    readable=self._b.permission.readable, writable=self._b.permission.writable,
                                    version=VERSION, flush_mode=c.flush.value, broker_id=c.broker_id,
                                    epoch=self._b.epoch, fenced=self._b.permission.fenced,
                                    delay_levels=[format_duration_ms(ms) for ms in c.delay_levels_ms])

    @rpc
    async def GetBrokerInfo(self, request, context: grpc.aio.ServicerContext):
        return self._broker_info()

    @rpc
    async def UpdateBrokerPermission(self, request, context: grpc.aio.ServicerContext):
        self._b.permission.update(readable=request.readable, writable=request.writable)
        return self._broker_info()

    @rpc
    async def PromoteBroker(self, request, context: grpc.aio.ServicerContext):
        await self._b.promote()
        return self._broker_info()

    @rpc
    async def ListGroups(self, request, context: grpc.aio.ServicerContext):
        b = self._b
        if request.topic:
            names = b.operations.groups_of_topic(request.topic)
        else:
            names = b.known_groups()
        out = []
        for g in names:
            members = b.consumers.members(g)
            model = members[0].message_model if members else "MESSAGE_MODEL_UNSPECIFIED"
            out.append(admin_pb2.GroupSummary(group=g, topics=b.operations.topics_of_group(g),
                                              member_count=len(members),
                                              message_model=common_pb2.MessageModel.Value(model)))
        return admin_pb2.ListGroupsResponse(groups=out)

    @rpc
    async def DescribeGroup(self, request, context: grpc.aio.ServicerContext):
        b = self._b
        check_group(request.group)
        pop_queues = b.operations.pop_inflight(request.group)
        if request.group not in b.known_groups() and not pop_queues:
            raise NotFoundError(f"group {request.group!r} is unknown on this broker")
        members = [admin_pb2.GroupMember(
            client_id=m.client_id, host=m.host,
            subscriptions=[common_pb2.Subscription(topic=t, expression=e, expression_type=expression_type_pb(
                ExpressionType.SQL92 if t in m.sql92_topics else ExpressionType.TAG)) for t, e in m.subscriptions],
            owned_queues=[common_pb2.MessageQueue(topic=t, broker_name=bn, queue_id=q) for t, bn, q in m.owned_queues],
            message_model=common_pb2.MessageModel.Value(m.message_model),
            consume_type=common_pb2.ConsumeType.Value(m.consume_type),
            orderly=m.orderly, last_heartbeat_timestamp=m.last_heartbeat_ms,
            allocate_strategy=m.allocate_strategy) for m in b.consumers.members(request.group)]
        locks = [admin_pb2.QueueLockInfo(queue=queue(lk.topic, b.config.broker_name, lk.queue_id),
                                         client_id=lk.client_id, owner_epoch=lk.owner_epoch,
                                         expire_timestamp=lk.expire_timestamp)
                 for lk in b.operations.queue_locks(request.group)]
        return admin_pb2.DescribeGroupResponse(group=request.group, members=members, locks=locks, pop_queues=[
            admin_pb2.PopQueueInflight(
                queue=queue(p.topic, b.config.broker_name, p.queue_id), inflight=p.inflight,
                oldest_received_ms=p.oldest_received_ms, earliest_invisible_until_ms=p.earliest_invisible_until_ms,
                latest_invisible_until_ms=p.latest_invisible_until_ms, redelivered=p.redelivered,
                max_attempt=p.max_attempt, overdue=p.overdue, pending_redelivery=p.pending_redelivery,
                waiting=p.waiting)
            for p in pop_queues])

    @rpc
    async def DeleteGroup(self, request, context: grpc.aio.ServicerContext):
        self._b.delete_group(request.group)
        return admin_pb2.DeleteGroupResponse()

    @rpc
    async def GetGroupConfig(self, request, context: grpc.aio.ServicerContext):
        check_group(request.group)
        found = self._b.groups.get(request.group)
        if found is None:
            raise NotFoundError(f"group {request.group!r} has no config on this broker")
        return _group_config(found)

    @rpc
    async def UpdateGroupConfig(self, request, context: grpc.aio.ServicerContext):
        check_group(request.group)
        changes = {name: _optional(request, name) for name in
                   ("consume_enable", "consume_broadcast_enable", "retry_queue_nums", "retry_max_times",
                    "consume_orderly")}
        if all(v is None for v in changes.values()):
            raise InvalidArgumentError("nothing to update: give at least one setting")
        if request.dry_run:
            return _group_config(self._b.groups.preview(request.group, **changes))
        return _group_config(self._b.groups.update(request.group, **changes))

    @rpc
    async def DeleteGroupOffsets(self, request, context: grpc.aio.ServicerContext):
        changes = self._b.operations.delete_offsets(request.group, request.topic, dry_run=request.dry_run)
        return admin_pb2.DeleteGroupOffsetsResponse(changes=_changes(changes, self._b.config.broker_name),
                                                    applied=not request.dry_run)

    @rpc
    async def CloneGroupOffsets(self, request, context: grpc.aio.ServicerContext):
        changes = await self._b.operations.clone_offsets(request.src_group, request.dest_group, request.topic,
                                                         dry_run=request.dry_run)
        return admin_pb2.CloneGroupOffsetsResponse(changes=_changes(changes, self._b.config.broker_name),
                                                   applied=not request.dry_run)

    @rpc
    async def QueryMessageById(self, request, context: grpc.aio.ServicerContext):
        b = self._b
        found = await b.operations.messages_by_id(request.msg_id, request.topic)
        visible = [m for m in found if access.allowed(on_topic(m.topic, Action.GET))]
        return admin_pb2.QueryMessageByIdResponse(messages=[message_ext(m, b.config.broker_name) for m in visible])

    @rpc
    async def GetDeliveries(self, request, context: grpc.aio.ServicerContext):
        found = self._b.operations.deliveries_of(request.topic, request.queue_id, request.offset)
        visible = {g: access.sees_readers_of(g) for g in {d.group for d in found}}
        return admin_pb2.GetDeliveriesResponse(deliveries=[
            admin_pb2.Delivery(group=d.group, client_id=d.client_id, delivered_ms=d.delivered_ms,
                               first_offset=d.first_offset, next_offset=d.next_offset)
            for d in found if visible[d.group]])

    @rpc
    async def GetBrokerStatus(self, request, context: grpc.aio.ServicerContext):
        s = broker_status(self._b, VERSION)
        return admin_pb2.BrokerStatus(**{name: getattr(s, name) for name in s.__slots__})

    @rpc
    async def DeleteExpiredCommitLog(self, request, context: grpc.aio.ServicerContext):
        deleted = self._b.operations.delete_expired_segments()
        return admin_pb2.DeleteExpiredCommitLogResponse(deleted_segments=deleted)

    @rpc
    async def ListTransactions(self, request, context: grpc.aio.ServicerContext):
        config = self._b.config
        response = admin_pb2.ListTransactionsResponse(timeout_ms=config.transaction_timeout_ms,
                                                      check_interval_ms=config.transaction_check_interval_ms,
                                                      max_checks=config.transaction_check_max)
        for h in self._b.operations.open_transactions(request.group):
            response.halves.add(msg_id=h.msg_id, half_offset=h.offset, group=h.group, topic=h.topic,
                                stored_ms=h.stored_ms, checks=h.checks, next_check_ms=h.next_check_ms)
        return response

    @rpc
    async def ListProducers(self, request, context: grpc.aio.ServicerContext):
        config = self._b.config
        response = admin_pb2.ListProducersResponse(expiry_ms=config.producer_id_expiry_ms,
                                                   max_producers=config.max_idempotent_producers)
        for p, sequences in self._b.operations.idempotent_producers(request.topic):
            queues = [admin_pb2.ProducerQueueState(
                topic=topic, queue_id=queue_id, epoch=q.epoch, last_sequence=q.last_seq,
                last_offset=q.recent[-1].first_offset + q.recent[-1].count - 1 if q.recent else -1)
                for (topic, queue_id), q in sequences]
            response.producers.add(producer_id=p.producer_id, key=p.key, created_ms=p.created_ms,
                                   last_active_ms=p.last_ms, queues=queues)
        return response

    # -- users and ACL rules (authorized for super users by the auth interceptor) ---------

    @rpc
    async def CreateUser(self, request, context: grpc.aio.ServicerContext):
        return _user_info(self._b.auth.create_user(request.name, request.secret_key, request.super_user))

    @rpc
    async def UpdateUser(self, request, context: grpc.aio.ServicerContext):
        return _user_info(self._b.auth.update_user(request.name, secret_key=_optional(request, "secret_key"),
                                                   super_user=_optional(request, "super_user")))

    @rpc
    async def DeleteUser(self, request, context: grpc.aio.ServicerContext):
        return admin_pb2.DeleteUserResponse(deleted_acls=self._b.auth.delete_user(request.name))

    @rpc
    async def ListUsers(self, request, context: grpc.aio.ServicerContext):
        return admin_pb2.ListUsersResponse(users=[_user_info(u) for u in self._b.auth.users()])

    @rpc
    async def CreateAcl(self, request, context: grpc.aio.ServicerContext):
        rule = AclRule(request.user, Resource.parse(request.resource),
                       frozenset(Action.parse(a) for a in request.actions), Decision.parse(request.decision),
                       tuple(request.source_ips))
        return _acl_rule(self._b.auth.create_rule(rule))

    @rpc
    async def DeleteAcl(self, request, context: grpc.aio.ServicerContext):
        resource = _optional(request, "resource")
        deleted = self._b.auth.delete_rules(request.user, None if resource is None else Resource.parse(resource))
        return admin_pb2.DeleteAclResponse(deleted=deleted)

    @rpc
    async def ListAcls(self, request, context: grpc.aio.ServicerContext):
        return admin_pb2.ListAclsResponse(rules=[_acl_rule(r) for r in self._b.auth.rules(_optional(request, "user"))])
