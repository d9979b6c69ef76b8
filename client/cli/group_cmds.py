"""tidemark group list | describe | progress | reset-offset | delete."""

from __future__ import annotations

import argparse
import re
import time

from client.admin import Admin
from client.cli.args import OFFSET, QUEUE_ID, SHIFT
from client.cli.connect import client_kwargs
from client.cli.message_cmds import parse_time_ms
from client.cli.output import emit, iso_ms
from client.errors import InvalidArgumentError, NotFoundError
from client.types import ResetTarget, group_state

_MAX_DURATION_MS = 100 * 365 * 86400 * 1000
_DURATION = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$")


def parse_iso_duration_ms(text: str) -> int:
    """ISO 8601 durations as kafka-consumer-groups takes them: PT10M, PT1H30M, P1D, PT45S."""
    m = _DURATION.fullmatch(text)
    if not m or text in ("P", "PT") or not any(m.groups()):
        raise InvalidArgumentError(f"--by-duration: {text!r} is not an ISO 8601 duration like PT10M or P1DT2H")
    days, hours, minutes, seconds = m.groups()
    total = (int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes or 0) * 60) * 1000
    total += int(float(seconds or 0) * 1000)
    if total > _MAX_DURATION_MS:
        raise InvalidArgumentError(f"--by-duration: {text!r} reaches back more than 100 years")
    return total


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    group = sub.add_parser("group", help="consumer groups")
    gsub = group.add_subparsers(dest="group_command", required=True, metavar="ACTION")

    p = gsub.add_parser("list", parents=[common], help="groups known to the brokers")
    p.add_argument("--topic", default="", help="only groups with offsets on this topic")
    p.set_defaults(run=list_groups)

    p = gsub.add_parser("describe", parents=[common], help="members, owned queues and lag")
    p.add_argument("group")
    p.set_defaults(run=describe)

    p = gsub.add_parser("progress", parents=[common], help="per-queue broker offset, consumer offset and lag")
    p.add_argument("group")
    p.add_argument("--topic", default="")
    p.set_defaults(run=progress)

    p = gsub.add_parser("reset-offset", parents=[common], help="move a group's offsets (dry run unless --execute)")
    p.add_argument("group")
    p.add_argument("--topic", required=True)
    p.add_argument("--queue", type=QUEUE_ID, help="only this queue id")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true")
    target.add_argument("--to-latest", action="store_true")
    target.add_argument("--to-datetime", metavar="ISO")
    target.add_argument("--by-duration", metavar="PT10M", help="to this long ago")
    target.add_argument("--shift-by", type=SHIFT, metavar="N")
    target.add_argument("--to-offset", type=OFFSET, metavar="N")
    p.add_argument("--execute", action="store_true", help="apply the change (default: only show it)")
    p.set_defaults(run=reset_offset)

    p = gsub.add_parser("delete", parents=[common], help="delete a group's offsets and config")
    p.add_argument("group")
    p.set_defaults(run=delete)


def _admin(args: argparse.Namespace) -> Admin:
    return Admin(**client_kwargs(args)).start()


def list_groups(args: argparse.Namespace) -> int:
    with _admin(args) as a:
        groups = a.list_groups(args.topic)
    rows = [{"group": g.group, "topics": list(g.topics), "members": g.member_count,
             "model": g.message_model.replace("MESSAGE_MODEL_UNSPECIFIED", "-")} for g in groups]
    emit(rows, ["group", "topics", "members", "model"], as_json=args.json)
    return 0


def _progress_rows(stats) -> list[dict]:
    return [{"topic": s.queue.topic, "broker": s.queue.broker_name, "queue": s.queue.queue_id,
             "broker_offset": s.max_offset, "consumer_offset": s.consumer_offset, "lag": s.lag,
             "last_consumed": iso_ms(s.last_timestamp)} for s in stats]


def progress(args: argparse.Namespace) -> int:
    with _admin(args) as a:
        stats = a.consume_stats(args.group, args.topic)
    rows = _progress_rows(stats)
    emit(rows, ["topic", "broker", "queue", "broker_offset", "consumer_offset", "lag", "last_consumed"],
         as_json=args.json, footer=f"total lag {sum(r['lag'] for r in rows)}")
    return 0


def describe(args: argparse.Namespace) -> int:
    with _admin(args) as a:
        d = a.describe_group(args.group)
        try:
            stats = a.consume_stats(args.group)
        except NotFoundError:
            stats = []
    state = group_state(d.members, [s.queue for s in stats]).value
    owner = {q: m.client_id for m in d.members for q in m.owned_queues}
    members = [{"client_id": m.client_id, "host": m.host, "model": m.message_model, "type": m.consume_type,
                "strategy": m.allocate_strategy or "-", "subscriptions": [f"{t}:{e}" for t, e in m.subscriptions],
                "owned_queues": len(m.owned_queues), "last_heartbeat": iso_ms(m.last_heartbeat_timestamp)}
               for m in d.members]
    queues = [{**row, "owner": owner.get(s.queue, "-")} for s, row in zip(stats, _progress_rows(stats), strict=True)]
    if args.json:
        emit([{"group": d.group, "state": state, "members": members, "queues": queues,
               "locks": [{"queue": str(lk.queue), "client_id": lk.client_id, "owner_epoch": lk.owner_epoch}
                         for lk in d.locks]}], [], as_json=True)
        return 0
    print(f"group {d.group}: {state}, {len(members)} member(s)")
    emit(members, ["client_id", "host", "model", "type", "strategy", "subscriptions", "owned_queues",
                   "last_heartbeat"], as_json=False)
    print()
    emit(queues, ["topic", "broker", "queue", "owner", "broker_offset", "consumer_offset", "lag"], as_json=False,
         footer=f"total lag {sum(q['lag'] for q in queues)}")
    return 0


def reset_offset(args: argparse.Namespace) -> int:
    if args.to_earliest:
        target, value = ResetTarget.EARLIEST, 0
    elif args.to_latest:
        target, value = ResetTarget.LATEST, 0
    elif args.to_datetime is not None:  # "" too: parse_time_ms refuses it by name
        target, value = ResetTarget.TIMESTAMP, parse_time_ms(args.to_datetime, "--to-datetime")
    elif args.by_duration is not None:
        target, value = ResetTarget.TIMESTAMP, int(time.time() * 1000) - parse_iso_duration_ms(args.by_duration)
    elif args.shift_by is not None:
        target, value = ResetTarget.SHIFT_BY, args.shift_by
    else:
        target, value = ResetTarget.OFFSET, args.to_offset
    with _admin(args) as a:
        queue = None
        if args.queue is not None:
            queue = next((q for q in a.fetch_message_queues(args.topic) if q.queue_id == args.queue), None)
            if queue is None:
                raise InvalidArgumentError(f"topic {args.topic!r} has no queue {args.queue}")
        changes = a.reset_offset(args.group, args.topic, target, value, queue=queue, dry_run=not args.execute)
    rows = [{"topic": c.queue.topic, "broker": c.queue.broker_name, "queue": c.queue.queue_id,
             "current_offset": c.old_offset, "new_offset": c.new_offset} for c in changes]
    note = "offsets reset" if args.execute else "dry run: nothing changed; add --execute to apply"
    emit(rows, ["topic", "broker", "queue", "current_offset", "new_offset"], as_json=args.json,
         footer=note)
    return 0


def delete(args: argparse.Namespace) -> int:
    with _admin(args) as a:
        a.delete_group(args.group)
    if args.json:
        emit([{"group": args.group, "deleted": True}], [], as_json=True)
    else:
        print(f"group {args.group} deleted")
    return 0
