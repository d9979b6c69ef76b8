"""The compose stack's users: each created on every broker with only the rules it needs (the `users` service).

    python users.py --brokers HOST:PORT[,...] --user NAME SECRET_FILE [--allow NAME RESOURCE ACTIONS ...] ...

Signs as the super user the environment names (TIDEMARK_ACCESS_KEY, TIDEMARK_SECRET_KEY[_FILE],
TIDEMARK_TLS_CA_FILE). Each broker keeps its own users and rules, and in controller mode any broker may become
a master, so every one gets them, the replicas too. SECRET_FILE holds the secret, or NAME:SECRET (a broker's
peer_user file). A user that exists gets that secret and loses any super-user flag; a rule that exists is
kept, as are rules given by hand. Running it again changes nothing, so `docker-compose start` may.

Then it waits until every master that replicates synchronously counts a replica in sync (streaming from
it and holding all it has): the replicas sign as `broker`, which exists only from now on, and such a master
refuses every send until one is in sync, so what starts after this service (the job) finds the stack
writable. A replica that is connected but still catching up is not enough.

Exits 0 once every broker has every user and rule and the replicas are there; otherwise 1 with one line
saying which broker and why.
"""

from __future__ import annotations

import argparse
import sys
import time

from tidemark.client import Admin, AlreadyExistsError, TidemarkError, UnavailableError
from tidemark.client.security import credentials_from_env, tls_from_env
from tidemark.common.env_secrets import read_secret_file

WAIT_S = 120.0  # a broker just started (or restarted) answers within this


def secret_of(name: str, path: str) -> str:
    text = read_secret_file(path)
    prefix = f"{name}:"
    return text[len(prefix):] if text.startswith(prefix) else text


def grant(address: str, users: dict[str, str], rules: list[tuple[str, str, list[str]]]) -> str:
    """Every user and rule on the broker at `address`; what changed, for the log line."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            with Admin(brokers=address, tls=tls_from_env(), credentials=credentials_from_env()) as admin:
                return _apply(admin, users, rules)
        except UnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def _apply(admin: Admin, users: dict[str, str], rules: list[tuple[str, str, list[str]]]) -> str:
    changes = []
    for name, secret in users.items():
        try:
            admin.create_user(name, secret)
            changes.append(f"user {name} created")
        except AlreadyExistsError:
            admin.update_user(name, secret_key=secret, super_user=False)
    for user, resource, actions in rules:
        have = {(r.resource, frozenset(r.actions)) for r in admin.list_acls(user)
                if r.decision == "Allow" and not r.source_ips}
        if (resource, frozenset(actions)) not in have:
            admin.create_acl(user, resource, actions, "Allow")
            changes.append(f"{user} may {','.join(actions)} on {resource}")
    return "; ".join(changes) or "nothing to change"


def wait_for_replicas(addresses: list[str]) -> None:
    """Until every synchronous master among `addresses` counts a replica in sync (UnavailableError after
    WAIT_S). A broker that does not answer is not waited for: it is no master anyone writes to."""
    deadline = time.monotonic() + WAIT_S
    with Admin(brokers=addresses[0], tls=tls_from_env(), credentials=credentials_from_env()) as admin:
        while True:
            waiting = []
            for address in addresses:
                try:
                    status = admin.broker_status_at(address)
                except UnavailableError:
                    continue
                if status.role == "MASTER" and status.replication_mode == "sync" and not status.in_sync_replicas:
                    waiting.append(f"{address} ({status.broker_name})")
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise UnavailableError(f"no replica in sync with {', '.join(waiting)} after {WAIT_S:.0f} s")
            time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--brokers", required=True, help="every broker, HOST:PORT[,HOST:PORT...]")
    p.add_argument("--user", nargs=2, action="append", default=[], metavar=("NAME", "SECRET_FILE"))
    p.add_argument("--allow", nargs=3, action="append", default=[], metavar=("NAME", "RESOURCE", "ACTIONS"),
                   help="RESOURCE as `tidemark acl create` takes it (Topic:NAME, Group:NAME, Cluster); ACTIONS A,B")
    args = p.parse_args(argv)
    try:
        users = {name: secret_of(name, path) for name, path in args.user}
    except ValueError as e:
        print(f"users: {e}", file=sys.stderr)
        return 1
    rules = [(user, resource, actions.split(",")) for user, resource, actions in args.allow]
    unknown = sorted({user for user, _, _ in rules} - set(users))
    if unknown:
        print(f"users: --allow for {', '.join(unknown)}, who has no --user", file=sys.stderr)
        return 1
    addresses = [a.strip() for a in args.brokers.split(",") if a.strip()]
    for address in addresses:
        try:
            print(f"{address}: {grant(address, users, rules)}", flush=True)
        except TidemarkError as e:
            print(f"users: {address}: {e}", file=sys.stderr)
            return 1
    try:
        wait_for_replicas(addresses)
    except TidemarkError as e:
        print(f"users: {e}", file=sys.stderr)
        return 1
    print("every synchronous master has a replica", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
