"""tidemark user create | update | list | delete, tidemark acl create | list | delete.

Users and ACL rules live on each broker (config/users.json, config/acls.json);
changes go to every broker. A new secret key comes from --secret-key, a file
(--secret-key-file, trailing newline dropped) or an environment variable
(--secret-key-env VAR; `user create` also reads TIDEMARK_USER_SECRET_KEY when
given none), so it need not appear in a process list or shell history. No
command prints a secret.

`user update`, `user delete` and `acl delete` are dry runs unless --execute, as every command that changes
or deletes what exists (tidemark.client.change_plans); `user create` and `acl create` add something new and
act at once.

In `user create` and `user update`, --secret-key is the user's new secret, as
in the issue's syntax; it takes the place of the common --secret-key there,
so the caller's own secret comes from $TIDEMARK_SECRET_KEY for these two.
"""

from __future__ import annotations

import argparse
import copy
import os

from tidemark.client import change_plans
from tidemark.client.cli.output import DRY_RUN, emit
from tidemark.client.cli.topic_cmds import admin
from tidemark.client.errors import InvalidArgumentError
from tidemark.client.types import AclRuleInfo, UserInfo
from tidemark.common.env_secrets import read_secret_file

USER_SECRET_ENV = "TIDEMARK_USER_SECRET_KEY"
_USER_COLUMNS = ["user", "super_user", "brokers"]
_ACL_COLUMNS = ["user", "resource", "actions", "decision", "source_ips", "brokers"]


def _own_copy(common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The common options as objects of their own: resolving the --secret-key conflict edits the parent's
    action, which every other command shares."""
    return copy.deepcopy(common)


def _secret_options(p: argparse.ArgumentParser) -> None:
    p.set_defaults(secret_key=None)  # the caller's credentials: from the environment here (module doc)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--secret-key", dest="user_secret_key", metavar="SECRET",
                       help="the user's new secret key (8 to 256 visible characters); here the caller's own "
                            "secret comes from $TIDEMARK_SECRET_KEY")
    which.add_argument("--secret-key-file", metavar="FILE", help="read the secret key from FILE")
    which.add_argument("--secret-key-env", metavar="VAR", help="read the secret key from environment variable VAR")


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    user = sub.add_parser("user", help="users (access keys) of the brokers")
    usub = user.add_subparsers(dest="user_command", required=True, metavar="ACTION")

    p = usub.add_parser("create", parents=[_own_copy(common)], conflict_handler="resolve",
                        help="create a user on every broker")
    p.add_argument("name", help="the user's name, its access key")
    _secret_options(p)
    p.add_argument("--super", dest="super_user", action="store_true", help="a super user: may do anything")
    p.set_defaults(run=create_user)

    p = usub.add_parser("update", parents=[_own_copy(common)], conflict_handler="resolve",
                        help="change a user's secret key or super-user flag")
    p.add_argument("name", help="user to change")
    _secret_options(p)
    p.add_argument("--super", dest="super_user", action=argparse.BooleanOptionalAction, default=None,
                   help="make the user a super user (--no-super: a normal user)")
    _execute_option(p)
    p.set_defaults(run=update_user)

    p = usub.add_parser("list", parents=[common], help="list users (never their secrets)")
    p.set_defaults(run=list_users)

    p = usub.add_parser("delete", parents=[common], help="delete a user and its ACL rules (dry run unless --execute)")
    p.add_argument("name", help="user to delete")
    _execute_option(p)
    p.set_defaults(run=delete_user)

    acl = sub.add_parser("acl", help="ACL rules of the brokers' users")
    asub = acl.add_subparsers(dest="acl_command", required=True, metavar="ACTION")

    p = asub.add_parser("create", parents=[common], help="add a rule for a user on every broker")
    p.add_argument("user", help="user the rule is for")
    p.add_argument("--resource", required=True, metavar="RESOURCE",
                   help="Topic:NAME, Topic:PREFIX*, Topic:*, Group:NAME, Group:PREFIX*, Group:* or Cluster")
    p.add_argument("--actions", required=True, metavar="A,B",
                   help="comma separated: Pub, Sub, Create, Update, Delete, Get, List, All")
    p.add_argument("--decision", required=True, metavar="Allow|Deny", help="Deny wins over any Allow")
    p.add_argument("--source-ip", action="append", default=[], metavar="CIDR",
                   help="only requests from this address range (repeatable; default: any)")
    p.set_defaults(run=create_acl)

    p = asub.add_parser("list", parents=[common], help="list rules")
    p.add_argument("--user", default=None, help="only this user's rules")
    p.set_defaults(run=list_acls)

    p = asub.add_parser("delete", parents=[common],
                        help="delete a user's rules (all, or those on --resource; dry run unless --execute)")
    p.add_argument("user", help="user whose rules go")
    p.add_argument("--resource", default=None, metavar="RESOURCE", help="only the rules on this resource pattern")
    _execute_option(p)
    p.set_defaults(run=delete_acl)


def _execute_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--execute", action="store_true", help="apply the change (default: only show it)")


def read_secret(args: argparse.Namespace, *, env_default: str | None = None) -> str | None:
    """The secret key the options give (None: none given and no default variable set)."""
    if args.user_secret_key is not None:
        return args.user_secret_key
    if args.secret_key_file is not None:
        try:
            return read_secret_file(args.secret_key_file)
        except ValueError as e:
            raise InvalidArgumentError(f"--secret-key-file {args.secret_key_file}: {e}") from None
    variable = args.secret_key_env or env_default
    if variable is None:
        return None
    value = os.environ.get(variable)
    if value is None and args.secret_key_env is not None:
        raise InvalidArgumentError(f"--secret-key-env: environment variable {variable} is not set")
    return value


def _user_row(u: UserInfo) -> dict:
    return {"user": u.name, "super_user": u.super_user, "brokers": list(u.brokers)}


def _acl_row(r: AclRuleInfo) -> dict:
    return {"user": r.user, "resource": r.resource, "actions": list(r.actions), "decision": r.decision,
            "source_ips": list(r.source_ips), "brokers": list(r.brokers)}


def create_user(args: argparse.Namespace) -> int:
    secret = read_secret(args, env_default=USER_SECRET_ENV)
    if secret is None:
        raise InvalidArgumentError(f"give --secret-key, --secret-key-file or --secret-key-env, "
                                   f"or set {USER_SECRET_ENV}")
    with admin(args) as a:
        created = a.create_user(args.name, secret, super_user=args.super_user)
    emit([_user_row(created)], _USER_COLUMNS, as_json=args.json)
    return 0


def update_user(args: argparse.Namespace) -> int:
    secret = read_secret(args)
    if secret is None and args.super_user is None:
        raise InvalidArgumentError("nothing to update: give a secret key option, --super or --no-super")
    with admin(args) as a:
        if args.execute:
            updated = a.update_user(args.name, secret_key=secret, super_user=args.super_user)
        else:
            updated = change_plans.plan_user_update(a, args.name, super_user=args.super_user)
    note = "" if args.execute else ("a new secret key; " if secret is not None else "") + DRY_RUN
    emit([_user_row(updated)], _USER_COLUMNS, as_json=args.json, footer=note)
    return 0


def list_users(args: argparse.Namespace) -> int:
    with admin(args) as a:
        users = a.list_users()
    emit([_user_row(u) for u in users], _USER_COLUMNS, as_json=args.json, footer=f"{len(users)} user(s)")
    return 0


def delete_user(args: argparse.Namespace) -> int:
    with admin(args) as a:
        if args.execute:
            rules = a.delete_user(args.name)
        else:
            rules = len(change_plans.plan_user_deletion(a, args.name)[1])
    if args.json:
        emit([{"user": args.name, "deleted": args.execute, "deleted_acls": rules}], [], as_json=True)
    elif args.execute:
        print(f"user {args.name} deleted with {rules} ACL rule(s)")
    else:
        print(f"user {args.name} would be deleted with {rules} ACL rule(s)\n{DRY_RUN}")
    return 0


def create_acl(args: argparse.Namespace) -> int:
    actions = [a.strip() for a in args.actions.split(",") if a.strip()]
    if not actions:
        raise InvalidArgumentError(f"--actions {args.actions!r} names no action")
    with admin(args) as a:
        rule = a.create_acl(args.user, args.resource, actions, args.decision, source_ips=args.source_ip)
    emit([_acl_row(rule)], _ACL_COLUMNS, as_json=args.json)
    return 0


def list_acls(args: argparse.Namespace) -> int:
    with admin(args) as a:
        rules = a.list_acls(args.user)
    emit([_acl_row(r) for r in rules], _ACL_COLUMNS, as_json=args.json, footer=f"{len(rules)} rule(s)")
    return 0


def delete_acl(args: argparse.Namespace) -> int:
    with admin(args) as a:
        if not args.execute:
            rules = change_plans.plan_acl_deletion(a, args.user, args.resource)
            emit([_acl_row(r) for r in rules], _ACL_COLUMNS, as_json=args.json,
                 footer=f"{len(rules)} ACL rule(s) to delete; {DRY_RUN}")
            return 0
        deleted = a.delete_acl(args.user, args.resource)
    if args.json:
        emit([{"user": args.user, "resource": args.resource, "deleted": deleted}], [], as_json=True)
    else:
        print(f"{deleted} ACL rule(s) of {args.user} deleted")
    return 0
