"""tidemark group list | describe | progress | reset-offset | update | delete-offsets | clone-offset | delete.

Every command that changes offsets or a group's config, or deletes the group, is a dry run unless
--execute: it prints what it would do (the rule of every changing command, tidemark.client.change_plans).
`group delete --execute` is refused while the group has live members, naming them."""

from __future__ import annotations

import argparse
import csv
import sys
import time
from collections.abc import Callable

from tidemark.client import change_plans, group_status, offset_plan
from tidemark.client.admin import Admin
from tidemark.client.cli.args import OFFSET, QUEUE_ID, SHIFT, int_in
from tidemark.client.cli.connect import client_kwargs
from tidemark.client.cli.message_cmds import parse_time_ms
from tidemark.client.cli.output import DRY_RUN, emit, iso_ms
from tidemark.client.errors import InvalidArgumentError, NotFoundError
from tidemark.client.message import MessageQueue
from tidemark.client.types import (
    GroupState,
    OffsetChange,
    PopQueueInflight,
    QueueStats,
    ResetTarget,
    group_state,
)
from tidemark.common.namespaces import in_namespace


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    group = sub.add_parser("group", help="consumer groups")
    gsub = group.add_subparsers(dest="group_command", required=True, metavar="ACTION")

    p = gsub.add_parser("list", parents=[common], help="groups known to the brokers, with their state")
    p.add_argument("--topic", default="", help="only groups with offsets on this topic")
    p.add_argument("--state", type=_states, metavar="STATE[,STATE]",
                   help=f"only groups in these states ({', '.join(s.value for s in GroupState)}; "
                        f"kafka-consumer-groups --list --state)")
    p.set_defaults(run=list_groups)

    p = gsub.add_parser("describe", parents=[common], help="members, owned queues and lag")
    p.add_argument("group", help="the consumer group")
    p.set_defaults(run=describe)

    p = gsub.add_parser("progress", parents=[common], help="per-queue broker offset, consumer offset and lag")
    p.add_argument("group", help="the consumer group")
    p.add_argument("--topic", default="", help="only this topic's queues (default: every topic of the group)")
    p.set_defaults(run=progress)

    p = gsub.add_parser("reset-offset", parents=[common], help="move a group's offsets (dry run unless --execute)")
    p.add_argument("group", help="the consumer group whose offsets move")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--topic", help="the topic whose offsets move")
    scope.add_argument("--all-topics", action="store_true",
                       help="every topic the group has offsets for (its %%RETRY%% topic excluded)")
    p.add_argument("--queue", type=QUEUE_ID, help="only this queue id (with --topic)")
    p.add_argument("--broker-name", metavar="NAME",
                   help="with --queue: the broker holding that queue (needed when the topic is on several)")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="to each queue's first stored message")
    target.add_argument("--to-latest", action="store_true", help="past each queue's last message")
    target.add_argument("--to-current", action="store_true",
                        help="to the committed offsets: changes nothing (use with --export to save them)")
    target.add_argument("--to-datetime", metavar="TIME",
                        help="to the first message stored at or after this time: ISO (2026-11-22T10:00:00) or "
                             "epoch milliseconds")
    target.add_argument("--by-duration", metavar="PT10M", help="to this long ago")
    target.add_argument("--shift-by", type=SHIFT, metavar="N", help="forward (or back, negative) by N messages")
    target.add_argument("--to-offset", type=OFFSET, metavar="N", help="to this offset")
    target.add_argument("--from-file", metavar="FILE",
                        help="to the offsets of a CSV plan, `topic,broker,queue,offset` per line (what --export "
                             "prints; `topic,queue,offset` for a topic on one broker)")
    p.add_argument("--export", action="store_true",
                   help="print the plan as CSV lines `topic,broker,queue,offset` (kafka-consumer-groups --export, "
                        "with the broker that names the queue)")
    p.add_argument("--execute", action="store_true", help="apply the change (default: only show it)")
    p.set_defaults(run=reset_offset, usage_error=p.error)

    p = gsub.add_parser("update", parents=[common],
                        help="change a group's subscription settings (RocketMQ's updateSubGroup; dry run unless "
                             "--execute); creates the group's config when it has none")
    p.add_argument("group", help="consumer group to change")
    p.add_argument("--retry-max-times", type=int_in(0, 10_000), metavar="N",
                   help="deliveries a failed message is retried before it goes to %%DLQ%%GROUP (default 16)")
    p.add_argument("--consume-enable", type=_bool, metavar="BOOL",
                   help="false: the broker refuses the group's reads, its consumers get nothing")
    p.add_argument("--broadcast-enable", type=_bool, metavar="BOOL",
                   help="false: BROADCASTING consumers of the group are refused")
    p.add_argument("--retry-queue-nums", type=int_in(1, 64), metavar="N",
                   help="queues of the group's %%RETRY%% topic when it is created")
    p.add_argument("--consume-orderly", type=_bool, metavar="BOOL",
                   help="orderly (FIFO) delivery for RocketMQ 5 clients of the group")
    p.add_argument("--execute", action="store_true", help="apply the change (default: only show it)")
    p.set_defaults(run=update)

    p = gsub.add_parser("delete-offsets", parents=[common],
                        help="remove a group's committed offsets of one topic (Kafka's --delete-offsets; dry run "
                             "unless --execute); refused while members of the group subscribe to the topic")
    p.add_argument("group", help="consumer group whose offsets are removed")
    p.add_argument("--topic", required=True, help="the topic whose offsets are removed")
    p.add_argument("--execute", action="store_true", help="apply the change (default: only show it)")
    p.set_defaults(run=delete_offsets)

    p = gsub.add_parser("clone-offset", parents=[common],
                        help="give a group another group's offsets of a topic (RocketMQ's cloneGroupOffset; dry "
                             "run unless --execute)")
    p.add_argument("--src-group", required=True, help="the group whose offsets are copied")
    p.add_argument("--dest-group", required=True, help="the group whose offsets become the source's")
    p.add_argument("--topic", required=True, help="the topic whose offsets are copied")
    p.add_argument("--execute", action="store_true", help="apply the change (default: only show it)")
    p.set_defaults(run=clone_offset)

    p = gsub.add_parser("delete", parents=[common], help="delete a group's offsets and config (dry run unless "
                                                         "--execute); refused while the group has live members")
    p.add_argument("group", help="the consumer group to delete")
    p.add_argument("--execute", action="store_true", help="apply the change (default: only show it)")
    p.set_defaults(run=delete)


def _bool(text: str) -> bool:
    """An argparse type: true/false (also yes/no, 1/0, on/off)."""
    value = {"true": True, "yes": True, "1": True, "on": True,
             "false": False, "no": False, "0": False, "off": False}.get(text.strip().lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not true or false")
    return value


def _states(text: str) -> frozenset[GroupState]:
    """An argparse type: group states, comma separated, in any case."""
    names = {s.value.lower(): s for s in GroupState}
    wanted = [w.strip().lower() for w in text.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in names]
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(f"{text!r}: a state is one of {', '.join(s.value for s in GroupState)}")
    return frozenset(names[w] for w in wanted)


def _admin(args: argparse.Namespace) -> Admin:
    return Admin(**client_kwargs(args)).start()


def list_groups(args: argparse.Namespace) -> int:
    with _admin(args) as a:
        groups = [(g, group_status.state_of(a, g.group)) for g in a.list_groups(args.topic)
                  if in_namespace(args.namespace, g.group)]
    rows = [{"group": g.group, "state": state.value, "topics": list(g.topics), "members": g.member_count,
             "model": g.message_model.replace("MESSAGE_MODEL_UNSPECIFIED", "-")}
            for g, state in groups if args.state is None or state in args.state]
    emit(rows, ["group", "state", "topics", "members", "model"], as_json=args.json)
    return 0


# The columns a pop group's queues add; shown only for a group that pops.
POP_COLUMNS = list(group_status.POP_COLUMNS)


def _progress_rows(a: Admin, stats: list[QueueStats], pop: dict[MessageQueue, PopQueueInflight] | None = None,
                   group: str = "", topic: str = "") -> list[dict]:
    """Per queue: offsets, lag in messages and in seconds (None: a lagging queue whose age is unknown); for a
    pop group also what it has in flight, with rows for queues it popped from without committing yet."""
    lag_s = group_status.lag_seconds(a, stats)
    rows = [{"topic": s.queue.topic, "broker": s.queue.broker_name, "queue": s.queue.queue_id,
             "broker_offset": s.max_offset, "consumer_offset": s.consumer_offset, "lag": s.lag,
             "lag_s": lag_s.get(s.queue), "last_consumed": iso_ms(s.last_timestamp)} for s in stats]
    if not pop:
        return rows
    now = group_status.now_ms()
    for s, row in zip(stats, rows, strict=True):
        row.update(group_status.pop_columns(pop.get(s.queue), now))
    known = {s.queue for s in stats}
    for q, p in sorted(pop.items()):
        if q not in known and (not topic or q.topic in (topic, group_status.pop_retry_topic(group, topic))):
            # Popped, nothing acked yet: no committed offset, so no lag to tell.
            rows.append({"topic": q.topic, "broker": q.broker_name, "queue": q.queue_id, "broker_offset": None,
                         "consumer_offset": None, "lag": None, "lag_s": None, "last_consumed": "-",
                         **group_status.pop_columns(p, now)})
    return sorted(rows, key=lambda r: (r["topic"], r["broker"], r["queue"]))


def _pop_queues(a: Admin, group: str) -> dict[MessageQueue, PopQueueInflight]:
    try:
        return {p.queue: p for p in a.describe_group(group).pop_queues}
    except NotFoundError:
        return {}


def _pop_footer(rows: list[dict]) -> str:
    """The lag footer, and for a pop group its in-flight totals and condition (its worst queue's)."""
    text = f"total lag {sum(r['lag'] or 0 for r in rows)}"
    condition = group_status.worst_pop_condition(r.get("pop") for r in rows)
    if condition is None:
        return text
    total = {c: sum(r[c] or 0 for r in rows) for c in ("inflight", "redelivered", "overdue")}
    return (f"{text}; in flight {total['inflight']} ({total['redelivered']} redelivered, {total['overdue']} past "
            f"their invisible time): {condition.value}")


def progress(args: argparse.Namespace) -> int:
    with _admin(args) as a:
        pop = _pop_queues(a, args.group)
        try:
            stats = a.consume_stats(args.group, args.topic)
        except NotFoundError:
            if not pop:
                raise
            stats = []  # a pop group that has acked nothing yet
        rows = _progress_rows(a, stats, pop, args.group, args.topic)
    columns = ["topic", "broker", "queue", "broker_offset", "consumer_offset", "lag", "lag_s", "last_consumed"]
    emit(rows, columns + (POP_COLUMNS if pop else []), as_json=args.json, footer=_pop_footer(rows))
    return 0


def describe(args: argparse.Namespace) -> int:
    with _admin(args) as a:
        d = a.describe_group(args.group)
        try:
            stats = a.consume_stats(args.group)
        except NotFoundError:
            stats = []
        pop = {p.queue: p for p in d.pop_queues}
        rows = _progress_rows(a, stats, pop)
    state = group_state(d.members, [s.queue for s in stats]).value
    owner = {q: m.client_id for m in d.members for q in m.owned_queues}
    members = [{"client_id": m.client_id, "host": m.host, "model": m.message_model, "type": m.consume_type,
                "strategy": m.allocate_strategy or "-", "subscriptions": [f"{t}:{e}" for t, e in m.subscriptions],
                "owned_queues": len(m.owned_queues), "last_heartbeat": iso_ms(m.last_heartbeat_timestamp)}
               for m in d.members]
    queues = [{**row, "owner": owner.get(MessageQueue(row["topic"], row["broker"], row["queue"]), "-")}
              for row in rows]
    condition = group_status.worst_pop_condition(q.get("pop") for q in queues)
    if args.json:
        lag_s = max((q["lag_s"] for q in queues if q["lag_s"] is not None), default=0.0)
        pop_state = {} if condition is None else {"pop": condition.value}
        emit([{"group": d.group, "state": state, "lag_s": lag_s, **pop_state, "members": members, "queues": queues,
               "locks": [{"queue": str(lk.queue), "client_id": lk.client_id, "owner_epoch": lk.owner_epoch}
                         for lk in d.locks]}], [], as_json=True)
        return 0
    print(f"group {d.group}: {state}, {len(members)} member(s)")
    emit(members, ["client_id", "host", "model", "type", "strategy", "subscriptions", "owned_queues",
                   "last_heartbeat"], as_json=False)
    print()
    emit(queues, ["topic", "broker", "queue", "owner", "broker_offset", "consumer_offset", "lag", "lag_s"]
         + (POP_COLUMNS if pop else []), as_json=False, footer=_pop_footer(queues))
    return 0


def _target(args: argparse.Namespace) -> tuple[ResetTarget, int]:
    if args.to_earliest:
        return ResetTarget.EARLIEST, 0
    if args.to_latest:
        return ResetTarget.LATEST, 0
    if args.to_datetime is not None:  # "" too: parse_time_ms refuses it by name
        return ResetTarget.TIMESTAMP, parse_time_ms(args.to_datetime, "--to-datetime")
    if args.by_duration is not None:
        return ResetTarget.TIMESTAMP, int(time.time() * 1000) - offset_plan.parse_iso_duration_ms(args.by_duration)
    if args.shift_by is not None:
        return ResetTarget.SHIFT_BY, args.shift_by
    return ResetTarget.OFFSET, args.to_offset


def _export(changes: list[OffsetChange]) -> None:
    out = csv.writer(sys.stdout, lineterminator="\n")
    for c in sorted(changes, key=lambda c: c.queue):
        out.writerow([c.queue.topic, c.queue.broker_name, c.queue.queue_id, c.new_offset])


def reset_offset(args: argparse.Namespace) -> int:
    usage_error: Callable[[str], None] = args.usage_error
    if args.from_file is not None:
        if args.topic is not None or args.all_topics or args.queue is not None or args.broker_name:
            usage_error("--from-file: the plan names the topics and queues; drop --topic, --all-topics, --queue, "
                        "--broker-name")
    elif args.topic is None and not args.all_topics:
        usage_error("give --topic TOPIC or --all-topics")
    elif args.queue is not None and args.all_topics:
        usage_error("--queue needs --topic")
    elif args.broker_name and args.queue is None:
        usage_error("--broker-name names the broker of --queue; give --queue too")
    with _admin(args) as a:
        if args.from_file is not None:
            steps = offset_plan.file_steps(a, args.from_file)
        else:
            topics = offset_plan.group_topics(a, args.group) if args.all_topics else [args.topic]
            queue = offset_plan.queue_of(a, args.topic, args.queue, args.broker_name or "")
            if args.to_current:
                changes = offset_plan.current_plan(a, args.group, topics, queue)
                steps = []
            else:
                target, value = _target(args)
                steps = [("", (queue, t, target, value)) for t in topics]
        if steps:
            # The whole plan is checked first: a refused step changes nothing anywhere.
            changes = offset_plan.run_steps(a, args.group, steps, dry_run=True)
            if args.execute:
                changes = offset_plan.run_steps(a, args.group, steps, dry_run=False)
    if args.export:
        _export(changes)
        return 0
    rows = [{"topic": c.queue.topic, "broker": c.queue.broker_name, "queue": c.queue.queue_id,
             "current_offset": c.old_offset, "new_offset": c.new_offset} for c in changes]
    if args.to_current:
        note = "offsets unchanged (--to-current)"
    else:
        note = "offsets reset" if args.execute else DRY_RUN
    emit(rows, ["topic", "broker", "queue", "current_offset", "new_offset"], as_json=args.json,
         footer=note)
    return 0


def _changes_table(args: argparse.Namespace, changes: list[OffsetChange], done: str) -> None:
    rows = [{"topic": c.queue.topic, "broker": c.queue.broker_name, "queue": c.queue.queue_id,
             "current_offset": c.old_offset,
             "new_offset": c.new_offset if c.new_offset >= 0 else None if args.json else "-"}  # none: removed
            for c in changes]
    emit(rows, ["topic", "broker", "queue", "current_offset", "new_offset"], as_json=args.json,
         footer=done if args.execute else DRY_RUN)


def update(args: argparse.Namespace) -> int:
    changes = {"retry_max_times": args.retry_max_times, "consume_enable": args.consume_enable,
               "consume_broadcast_enable": args.broadcast_enable, "retry_queue_nums": args.retry_queue_nums,
               "consume_orderly": args.consume_orderly}
    if all(v is None for v in changes.values()):
        raise InvalidArgumentError("nothing to update: give at least one of --retry-max-times, --consume-enable, "
                                   "--broadcast-enable, --retry-queue-nums, --consume-orderly")
    with _admin(args) as a:
        configs = a.update_group_config(args.group, dry_run=not args.execute, **changes)
    rows = [{"group": g.group, "consume_enable": g.consume_enable, "broadcast_enable": g.consume_broadcast_enable,
             "retry_queue_nums": g.retry_queue_nums, "retry_max_times": g.retry_max_times,
             "consume_orderly": g.consume_orderly} for g in configs]
    emit(rows, ["group", "consume_enable", "broadcast_enable", "retry_queue_nums", "retry_max_times",
                "consume_orderly"], as_json=args.json,
         footer="group updated" if args.execute else DRY_RUN)
    return 0


def delete_offsets(args: argparse.Namespace) -> int:
    with _admin(args) as a:
        changes = a.delete_group_offsets(args.group, args.topic, dry_run=not args.execute)
    _changes_table(args, changes, "offsets deleted")
    return 0


def clone_offset(args: argparse.Namespace) -> int:
    with _admin(args) as a:
        changes = a.clone_group_offsets(args.src_group, args.dest_group, args.topic, dry_run=not args.execute)
    _changes_table(args, changes, "offsets cloned")
    return 0


def delete(args: argparse.Namespace) -> int:
    with _admin(args) as a:
        plan = change_plans.plan_group_deletion(a, args.group)
        if args.execute:
            change_plans.delete_group(a, plan)
    if args.json:
        emit([{"group": plan.group, "deleted": args.execute, "topics": list(plan.topics),
               "live_members": [m.client_id for m in plan.live_members]}], [], as_json=True)
    elif args.execute:
        print(f"group {args.group} deleted")
    else:
        emit([{"group": plan.group, "topics": list(plan.topics),
               "live_members": [m.client_id for m in plan.live_members]}], ["group", "topics", "live_members"],
             as_json=False, footer=DRY_RUN)
    return 0
