"""`tidemark`: the broker daemon and the client/admin commands.

Errors print one line on stderr and exit 1; bad usage is one line too, exit 2 (args.Parser).
Every client command takes --broker HOST:PORT[,HOST:PORT...] (env TIDEMARK_BROKER).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from collections.abc import Callable

from tidemark.client.cli import (
    auth_cmds,
    broker_cmds,
    cluster_cmds,
    connect,
    console_cmds,
    dlq_cmds,
    group_cmds,
    health_cmds,
    message_cmds,
    producer_cmds,
    topic_cmds,
    transaction_cmds,
)
from tidemark.client.cli.args import Parser, seconds
from tidemark.client.errors import TidemarkError
from tidemark.client.settings import (
    BROKER_ENV,
    NAMESRV_ENV,
    default_brokers,
    default_namesrv,
    parse_addresses,
    parse_brokers,
)
from tidemark.common.logs import setup_logging


def client_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--broker", default=None, metavar="HOST:PORT",
                        help=f"broker address(es), comma separated (default ${BROKER_ENV} or 127.0.0.1:10911)")
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    common.add_argument("--timeout", type=seconds, default=5.0, metavar="SECONDS", help="per-request timeout")
    common.add_argument("--namesrv", default=None, metavar="HOST:PORT",
                        help=f"name server address(es), comma separated (default ${NAMESRV_ENV}); brokers are then "
                             f"found through them and --broker is not used")
    connect.add_arguments(common)
    return common


def build_parser(*, daemons: bool = True) -> argparse.ArgumentParser:
    """The whole command line; without `daemons`, `broker` and `namesrv` are listed but take no options
    (their parsers import the broker, which would double the start-up of every client command)."""
    parser = Parser(prog="tidemark", description="Tidemark message broker and tools.")
    parser.add_argument("--version", action="version", version=f"tidemark {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    broker = sub.add_parser("broker", help="run a broker in the foreground (`tidemark broker promote --broker "
                                           "HOST:PORT`: make a replica the master)")
    namesrv = sub.add_parser("namesrv", help="run a name server in the foreground")
    found = _daemon_parsers()[0] if daemons else None
    if found:  # else `pip install tidemark` without the broker extra: main() says what to install
        broker_parser, namesrv_parser = found
        broker_parser(broker)
        broker.set_defaults(run=_run_broker)
        namesrv_parser(namesrv)
        namesrv.set_defaults(run=_run_namesrv)
    common = client_options()
    named = argparse.ArgumentParser(add_help=False, parents=[common])  # commands that name topics or groups
    connect.add_namespace(named)
    topic_cmds.register(sub, named)
    message_cmds.register(sub, named)
    group_cmds.register(sub, named)
    dlq_cmds.register(sub, named)
    health_cmds.register(sub, common)
    auth_cmds.register(sub, common)
    cluster_cmds.register(sub, common)
    producer_cmds.register(sub, named)
    transaction_cmds.register(sub, named)
    console_cmds.register(sub, common)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("tidemark")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree without installing
        return "unknown"


def _daemon_parsers() -> tuple[tuple[Callable, Callable] | None, str | None]:
    """The broker's and the name server's argument builders; or None and the missing module when the
    broker's dependencies (the extra tidemark[broker]) are not installed."""
    try:
        from tidemark.broker.app import build_parser as broker_parser
        from tidemark.broker.namesrv.server import build_parser as namesrv_parser
    except ModuleNotFoundError as e:
        if (e.name or "tidemark").partition(".")[0] == "tidemark":
            raise
        return None, e.name
    return (broker_parser, namesrv_parser), None


def _run_broker(args: argparse.Namespace) -> int:
    from tidemark.broker.app import run

    return run(args)


def _run_namesrv(args: argparse.Namespace) -> int:
    from tidemark.broker.namesrv.server import run

    return run(args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["broker"] and argv[1:2] in (["promote"], ["status"]):
        # `tidemark broker` runs the daemon; these two are client commands
        parser = broker_cmds.build_parser(client_options(), argv[1])
        args = parser.parse_args(argv[2:])
        args.command = f"broker {argv[1]}"
    elif argv[:1] in (["broker"], ["namesrv"]) and (missing := _daemon_parsers()[1]):
        print(f"tidemark: `tidemark {argv[0]}` needs the broker's dependencies ({missing} is not installed): "
              f"pip install 'tidemark[broker]'", file=sys.stderr)
        return 1
    else:
        parser = build_parser(daemons=argv[:1] in (["broker"], ["namesrv"]))
        args = parser.parse_args(argv)
    if args.command not in ("broker", "namesrv"):
        setup_logging("ERROR", "plain")
        try:
            # --broker without --namesrv: those brokers, whatever $TIDEMARK_NAMESRV says.
            # An empty --broker/--namesrv is an error, not the default (parse_addresses says so).
            args.namesrv = (parse_addresses(args.namesrv, "name server") if args.namesrv is not None
                            else () if args.broker else default_namesrv())
            args.brokers = (parse_brokers(args.broker) if args.broker is not None
                            else () if args.namesrv else default_brokers())
            connect.resolve(args)
        except TidemarkError as e:
            parser.error(str(e))
    try:
        return args.run(args) or 0
    except TidemarkError as e:
        print(f"tidemark: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
