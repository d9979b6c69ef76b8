"""`tidemark broker`: run the daemon in the foreground until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from tidemark.broker import config as broker_config
from tidemark.broker import memory
from tidemark.broker.disk import data_format
from tidemark.broker.errors import BrokerError
from tidemark.common.logs import get_logger, setup_logging
from tidemark.common.scheduler import cancel_and_wait

log = get_logger("tidemark.broker")


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="tidemark broker", description="Run a Tidemark broker.")
    parser.add_argument("--config", type=Path, default=None, metavar="FILE", help="TOML config file ([broker] table)")
    parser.add_argument("--print-config", action="store_true", help="print the effective config and exit")
    broker_config.add_arguments(parser)
    return parser


class ControllerModeError(BrokerError):
    """The broker could no longer follow etcd's decisions: it stopped (exit 1, a supervisor restarts it)."""


class StopFailedError(BrokerError):
    """The broker served, but could not persist everything while stopping (e.g. a full disk)."""


async def _serve(config: broker_config.BrokerConfig) -> None:
    from tidemark.broker.server import BrokerServer

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    mode = controlled = None
    if config.controller:  # etcd decides the role (broker/cluster/controller_mode.py)
        from tidemark.broker.cluster.controller_mode import ControllerMode
        mode = ControllerMode(config)
        config = await mode.decide()
    server = BrokerServer(config)
    started = False
    try:
        await server.start()
        started = True
        if mode is not None:
            controlled = loop.create_task(mode.run(server.controller), name="controller-mode")
            controlled.add_done_callback(lambda t: _controller_mode_ended(t, stop))
        await stop.wait()
        log.info("shutdown requested", event="broker_stopping")
        if controlled is not None and controlled.done() and not controlled.cancelled() \
                and controlled.exception() is not None:
            raise ControllerModeError(f"controller mode failed: {controlled.exception()!r}")
    finally:
        if mode is not None:
            if started:  # no write after this broker lets another become master
                server.controller.permission.fence("stopping: the master resigns in etcd")
            await cancel_and_wait(controlled)
            await mode.close()
        try:
            await server.stop()
        except BrokerError as e:
            if not started:
                raise
            raise StopFailedError(f"stopped with an error: {e}") from e


def _controller_mode_ended(task: asyncio.Task, stop: asyncio.Event) -> None:
    """The controller-mode task ends only by cancellation, or when the broker was fenced (it stays up,
    refusing writes, until restarted); a failure is logged and stops the broker: it cannot be sure of its
    role any more."""
    if task.cancelled():
        return
    if task.exception() is not None:
        log.error("controller mode failed; stopping", event="controller_mode_failed", exc_info=task.exception())
        stop.set()


def run(args: argparse.Namespace) -> int:
    try:
        config = broker_config.load_config(file=args.config, overrides=broker_config.overrides_from_args(args))
    except ValueError as e:
        print(f"tidemark broker: {e}", file=sys.stderr)
        return 2
    conflict = broker_config.role_conflict(config)
    if conflict:
        print(f"tidemark broker: {conflict}", file=sys.stderr)
        return 2
    if args.print_config:
        sys.stdout.write(broker_config.render(config))
        return 0
    # A data dir in a format this build does not read is refused as a bad config is: one line, exit 2, before
    # anything logs or touches the dir (broker/disk/data_format.py). The server checks again before its lock.
    from tidemark.broker.version import VERSION
    try:
        data_format.check(config.data_dir, version=VERSION)
    except data_format.DataFormatError as e:
        print(f"tidemark broker: {e}", file=sys.stderr)
        return 2
    setup_logging(config.log_level, config.log_format)
    memory.configure()
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; keep running without it
        uvloop = None
    try:
        if uvloop is not None:
            uvloop.run(_serve(config))
        else:
            asyncio.run(_serve(config))
    except data_format.DataFormatError as e:  # stamped by another broker since the check above
        print(f"tidemark broker: {e}", file=sys.stderr)
        return 2
    except StopFailedError as e:
        log.error("broker stop failed", event="broker_stop_failed", error=e.__cause__)
        print(f"tidemark broker: {e}", file=sys.stderr)
        return 1
    except BrokerError as e:
        log.error("broker cannot start", event="broker_start_failed", error=e)
        print(f"tidemark broker: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"tidemark broker: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
