"""tidemark topic create | update | delete | list | describe.

`topic update` and `topic delete` are dry runs unless --execute (the rule of every changing command,
tidemark.client.change_plans); `topic delete --execute` is refused while live consumers use the topic,
naming them, unless --force. `topic create` acts at once: it makes something new (an existing name is
refused), so there is nothing to lose."""

from __future__ import annotations

import argparse

from tidemark.client import change_plans
from tidemark.client.admin import Admin
from tidemark.client.cli.args import QUEUE_COUNT
from tidemark.client.cli.connect import client_kwargs
from tidemark.client.cli.output import DRY_RUN, emit, iso_ms
from tidemark.client.errors import InvalidArgumentError
from tidemark.common.namespaces import in_namespace


def admin(args: argparse.Namespace) -> Admin:
    return Admin(**client_kwargs(args)).start()


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    topic = sub.add_parser("topic", help="manage topics")
    tsub = topic.add_subparsers(dest="topic_command", required=True, metavar="ACTION")

    p = tsub.add_parser("create", parents=[common], help="create a topic on every broker (or --broker-name)")
    p.add_argument("name", help="topic name (letters, digits, '%%', '|', '_' and '-')")
    p.add_argument("--queues", type=QUEUE_COUNT, default=4, help="read and write queues per broker (default 4)")
    p.add_argument("--broker-name", action="append", default=None, help="only on this broker (repeatable)")
    p.set_defaults(run=create)

    p = tsub.add_parser("update", parents=[common],
                        help="change queue numbers or permission (dry run unless --execute)")
    p.add_argument("name", help="topic to change")
    p.add_argument("--queues", type=QUEUE_COUNT, help="read and write queues per broker (as `topic create`)")
    p.add_argument("--read-queues", type=QUEUE_COUNT, help="queues consumers read, per broker")
    p.add_argument("--write-queues", type=QUEUE_COUNT, help="queues producers write, per broker")
    p.add_argument("--perm", choices=["RW", "R", "W", "-"], help="RW (default), R (read only), W or - (closed)")
    p.add_argument("--execute", action="store_true", help="apply the change (default: only show it)")
    p.set_defaults(run=update)

    p = tsub.add_parser("delete", parents=[common],
                        help="delete a topic, its messages and its group offsets (dry run unless --execute)")
    p.add_argument("name", help="topic to delete")
    p.add_argument("--execute", action="store_true", help="delete it (default: only show what would go)")
    p.add_argument("--force", action="store_true",
                   help="with --execute: delete it even while live consumers use it (they are named otherwise)")
    p.set_defaults(run=delete)

    p = tsub.add_parser("list", parents=[common], help="list topics")
    p.add_argument("--system", action="store_true", help="include %%RETRY%%, %%DLQ%% and schedule topics")
    p.set_defaults(run=list_topics)

    p = tsub.add_parser("route", parents=[common], help="which brokers serve the topic, at which address, "
                                                        "with how many queues")
    p.add_argument("name", help="topic to look up")
    p.set_defaults(run=route)

    p = tsub.add_parser("describe", parents=[common], help="queues per broker with min/max offsets")
    p.add_argument("name", help="topic to describe")
    p.set_defaults(run=describe)


def _config_row(broker: str, t) -> dict:
    return {"topic": t.name, "broker": broker, "read_queues": t.read_queue_nums, "write_queues": t.write_queue_nums,
            "perm": t.perm}


def create(args: argparse.Namespace) -> int:
    with admin(args) as a:
        created = a.create_topic(args.name, args.queues, brokers=args.broker_name)
        names = args.broker_name or sorted(b.broker_name for b in a.brokers())
    emit([_config_row(b, t) for b, t in zip(names, created, strict=True)],
         ["topic", "broker", "read_queues", "write_queues", "perm"], as_json=args.json)
    return 0


def update(args: argparse.Namespace) -> int:
    if args.queues is not None and (args.read_queues is not None or args.write_queues is not None):
        raise InvalidArgumentError("--queues sets both read and write queues; drop --read-queues/--write-queues")
    changes = {}
    if args.queues is not None:
        changes["read_queue_nums"] = changes["write_queue_nums"] = args.queues
    if args.read_queues is not None:
        changes["read_queue_nums"] = args.read_queues
    if args.write_queues is not None:
        changes["write_queue_nums"] = args.write_queues
    if args.perm is not None:
        changes["readable"] = "R" in args.perm
        changes["writable"] = "W" in args.perm
    if not changes:
        raise InvalidArgumentError("nothing to update: give --queues, --read-queues, --write-queues or --perm")
    with admin(args) as a:
        planned = change_plans.plan_topic_update(a, args.name, changes)
        if args.execute:
            updated = a.update_topic(args.name, **changes)
            planned = list(zip([d.broker_name for d in a.route(args.name).queue_datas], updated, strict=True))
    emit([_config_row(b, t) for b, t in planned], ["topic", "broker", "read_queues", "write_queues", "perm"],
         as_json=args.json, footer="" if args.execute else DRY_RUN)
    return 0


def route(args: argparse.Namespace) -> int:
    with admin(args) as a:
        r = a.route(args.name)
    emit([{"topic": r.topic, "broker": d.broker_name, "address": d.broker_addr, "read_queues": d.read_queue_nums,
           "write_queues": d.write_queue_nums, "perm": ("R" if d.readable else "-") + ("W" if d.writable else "-")}
          for d in r.queue_datas], ["topic", "broker", "address", "read_queues", "write_queues", "perm"],
         as_json=args.json)
    return 0


def delete(args: argparse.Namespace) -> int:
    if args.force and not args.execute:
        raise InvalidArgumentError("--force goes with --execute (without it nothing is deleted)")
    with admin(args) as a:
        plan = change_plans.plan_topic_deletion(a, args.name)
        if args.execute:
            change_plans.delete_topic(a, plan, force=args.force)
    live = [str(c) for c in plan.live_consumers]
    if args.json:
        emit([{"topic": plan.topic, "deleted": args.execute, "brokers": list(plan.brokers), "queues": plan.queues,
               "messages": plan.messages, "groups": list(plan.groups), "live_consumers": live}], [], as_json=True)
    elif args.execute:
        print(f"topic {args.name} deleted")
    else:
        emit([{"topic": plan.topic, "brokers": list(plan.brokers), "queues": plan.queues, "messages": plan.messages,
               "groups": list(plan.groups)}], ["topic", "brokers", "queues", "messages", "groups"], as_json=False,
             footer="".join(f"live consumer: {c}\n" for c in live) + DRY_RUN
             + (" (refused while live consumers use it, unless --force)" if live else ""))
    return 0


def list_topics(args: argparse.Namespace) -> int:
    with admin(args) as a:
        topics = a.list_topics(include_system=args.system)
    rows = [_config_row(b, t) for name, entries in topics.items() if in_namespace(args.namespace, name)
            for b, t in entries]
    emit(rows, ["topic", "broker", "read_queues", "write_queues", "perm"], as_json=args.json)
    return 0


def describe(args: argparse.Namespace) -> int:
    with admin(args) as a:
        stats = a.topic_stats(args.name)
    rows = [{"topic": s.queue.topic, "broker": s.queue.broker_name, "queue": s.queue.queue_id,
             "min_offset": s.min_offset, "max_offset": s.max_offset, "messages": s.max_offset - s.min_offset,
             "last_update": iso_ms(s.last_update_timestamp)} for s in stats]
    total = sum(r["messages"] for r in rows)
    emit(rows, ["topic", "broker", "queue", "min_offset", "max_offset", "messages", "last_update"],
         as_json=args.json, footer=f"{len(rows)} queues, {total} messages")
    return 0
