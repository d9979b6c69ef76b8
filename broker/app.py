"""`tidemark broker`: run the daemon in the foreground until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import sys
import threading
from pathlib import Path

from tidemark.broker import config as broker_config
from tidemark.broker import memory
from tidemark.broker.disk import data_format
from tidemark.broker.errors import BrokerError
from tidemark.broker.observe import traces
from tidemark.common.logs import get_logger, setup_logging
from tidemark.common.scheduler import cancel_and_wait

log = get_logger("tidemark.broker")


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="tidemark broker", description="Run a Tidemark broker.")
    parser.add_argument("--config", type=Path, default=None, metavar="FILE", help="TOML config file ([broker] table)")
    parser.add_argument("--print-config", action="store_true", help="print the effective config and exit")
    broker_config.add_arguments(parser)
    return parser


# How long a replaced master, stopping to rejoin as a replica, lets calls in flight finish: they are refused
# or moved anyway, and with two brokers the new master refuses sync sends until this one is its replica.
REJOIN_GRACE_S = 0.5


class ControllerModeError(BrokerError):
    """The broker could no longer follow etcd's decisions: it stopped (exit 1, a supervisor restarts it)."""


class StopFailedError(BrokerError):
    """The broker served, but could not persist everything while stopping (e.g. a full disk)."""


async def _serve(config: broker_config.BrokerConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    fenced = False
    while not stop.is_set() and (fenced := await _serve_once(config, stop, after_fence=fenced)):
        # Controller mode, and etcd said this master's lease expired (it was paused, or cut off from etcd,
        # past its lease): another broker may be master now. The broker stops as on SIGTERM and starts
        # again in this process, so that it rejoins as the new master's replica as a restart would (the
        # replication hello cuts what its log holds that the new master's does not).
        log.warning("replaced as master: restarting to rejoin as a replica", event="controller_rejoin")


async def _serve_once(config: broker_config.BrokerConfig, stop: asyncio.Event, *, after_fence: bool = False) -> bool:
    """One life of the broker until `stop`; True when controller mode ended it instead (fenced for good:
    it must rejoin). `after_fence`: the life before ended so (the role's decision lets the others go
    first, ControllerMode)."""
    from tidemark.broker.server import BrokerServer

    mode = controlled = None
    if config.controller:  # etcd decides the role (broker/cluster/controller_mode.py)
        from tidemark.broker.cluster.controller_mode import ControllerMode
        mode = ControllerMode(config, after_fence=after_fence)
        deciding = asyncio.ensure_future(mode.decide())
        stopping = asyncio.ensure_future(stop.wait())
        try:  # deciding may wait long (for an in-sync broker, for its own old key): a SIGTERM ends it
            await asyncio.wait({deciding, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not deciding.done() or deciding.exception() is not None:
            await cancel_and_wait(deciding)
            await mode.close()  # its lease keeper and etcd client, if it got that far
            if stop.is_set() and (deciding.cancelled() or deciding.exception() is None):
                return False
            raise deciding.exception()
        config = deciding.result()
    server = BrokerServer(config)
    started = rejoin = False
    try:
        await server.start()
        started = True
        _freeze_heap()
        _batch_helper_threads()
        stopping = asyncio.ensure_future(stop.wait())
        waits = {stopping}
        if mode is not None:
            controlled = asyncio.get_running_loop().create_task(mode.run(server.controller), name="controller-mode")
            waits.add(controlled)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if controlled is not None and controlled.done() and not stop.is_set():
            failure = asyncio.CancelledError() if controlled.cancelled() else controlled.exception()
            if failure is not None:  # a bug: it cannot be sure of its role any more
                log.error("controller mode failed; stopping", event="controller_mode_failed", exc_info=failure)
                raise ControllerModeError(f"controller mode failed: {failure!r}")
            rejoin = True  # fenced: etcd said its lease expired
        else:
            log.info("shutdown requested", event="broker_stopping")
    finally:
        if mode is not None:
            if started:  # no write after this broker lets another become master
                server.controller.permission.fence("stopping: the master resigns in etcd")
            await cancel_and_wait(controlled)
            await mode.close()
        try:
            await (server.stop(REJOIN_GRACE_S) if rejoin else server.stop())
        except BrokerError as e:
            if not started:
                raise
            raise StopFailedError(f"stopped with an error: {e}") from e
        finally:
            gc.unfreeze()  # this life's objects go back to the collector (a rejoin starts another)
    return rejoin


def _freeze_heap() -> None:
    """When the broker starts serving: keep what it holds now (modules of grpc, protobuf and the broker,
    the store's recovered indexes, its config) out of the garbage collector's full passes.

    A full (generation 2) pass walks every object of the process: at 20,000 msg/s the broker ran one every
    few seconds, each holding the loop 13-17 ms while every message in flight waited; with the ~50,000
    objects of its start frozen, 0.6-0.7 ms. What the broker creates afterwards is collected as before.
    A life that ends to rejoin unfreezes (_serve_once), so the next life's start does not keep the
    previous life's objects for good."""
    gc.collect()  # garbage frozen now would never be collected
    gc.freeze()
    log.info("heap frozen", event="heap_frozen", objects=gc.get_freeze_count())


def _batch_helper_threads() -> None:
    """When the broker starts serving: every thread of the process but the event loop's (gRPC's
    completion-queue poller and EventEngine threads, the metrics server) runs under SCHED_BATCH from now
    on (Linux; elsewhere, or where the policy may not be set, nothing changes).

    Why: those threads are woken thousands of times a second (by each write the loop makes, by each read
    from the network) and only ever hand work to the loop thread, which holds the GIL. Woken under the
    normal policy, a thread may preempt whatever broker thread runs on its core (CFS's wakeup
    preemption), most often only to find the GIL taken. SCHED_BATCH threads do not preempt on wakeup.
    At 5,000 msg/s the broker's involuntary context switches fell by about half and its CPU a message
    by 4 to 6 % (docs/benchmarks.md, issue 30). The loop thread keeps the normal policy, so a request
    still wakes the broker ahead of other processes; threads it starts later (the executors that write
    snapshots and flush the store, woken a few times a second) keep the normal policy too."""
    setscheduler = getattr(os, "sched_setscheduler", None)
    batch = getattr(os, "SCHED_BATCH", None)
    if setscheduler is None or batch is None:
        return
    loop_thread = threading.get_native_id()
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return
    changed = 0
    for tid in threads:
        if tid == loop_thread:
            continue
        try:
            setscheduler(tid, batch, os.sched_param(0))
            changed += 1
        except OSError:  # gone meanwhile, or not allowed here
            continue
    log.info("helper threads batch-scheduled", event="helper_threads_batch", threads=changed)


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
    traces.configure(config.broker_name)  # store spans, when OTEL_TRACES_EXPORTER asks for them
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
    finally:
        traces.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
