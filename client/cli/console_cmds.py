"""tidemark console: the web console in the foreground, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from tidemark.client.cli.args import int_in, seconds
from tidemark.client.cli.connect import add_namespace, client_kwargs
from tidemark.client.console.server import Console, ConsoleSettings
from tidemark.client.settings import ClientSettings
from tidemark.common.logs import setup_logging


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("console", parents=[common], conflict_handler="resolve",
                       help="serve the web console (brokers, topics, groups and their lag, messages, DLQ) "
                            "until Ctrl-C")
    p.add_argument("--listen", default="127.0.0.1", metavar="HOST",
                   help="address to serve the console on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int_in(0, 65535), default=8080,
                   help="port to serve the console on (default 8080; 0: any free port, printed at start)")
    p.add_argument("--read-only", action="store_true",
                   help="refuse every action (topic and user changes, offset resets, DLQ requeues) whoever is "
                        "signed in")
    p.add_argument("--sample-interval", type=seconds, default=5.0, metavar="SECONDS",
                   help="how often every group's lag is recorded for the charts (default 5)")
    add_namespace(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    setup_logging("INFO", "plain")
    settings = ConsoleSettings(host=args.listen, port=args.port, read_only=args.read_only,
                               sample_interval_s=args.sample_interval)
    console = Console(ClientSettings(**client_kwargs(args)), settings).start()
    host, port = console.address
    hint = "; the brokers ask for credentials: sign in on the page" if console.sign_in_required else ""
    print(f"tidemark console on http://{host}:{port}/ (Ctrl-C to stop){hint}", flush=True)
    stopped = threading.Event()

    def stop(*_: object) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while not stopped.wait(1.0):
            pass
    finally:
        console.shutdown()
    print("tidemark console stopped", file=sys.stderr)
    return 0
