"""Shared fixtures: real broker processes (no mocks) on free loopback ports."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
# PySpark starts its JVM with a preexec_fn, so with a plain fork: in a test process that has used gRPC,
# gRPC's fork handler restarts its poller in the child, which dies on the descriptors Popen closes
# before exec ("epoll_wait error: Bad file descriptor", then JAVA_GATEWAY_EXITED; grpc/grpc#43055, open
# in grpcio 1.81-1.85). No test uses gRPC across a fork: the handlers stay off (read at gRPC's import).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
# Every JVM the tests start (Spark's driver and executors, a standalone cluster, the README's Spark
# example) compiles with C1 only and collects with one thread: they run small queries for seconds,
# where C2's compilations and the parallel collector's threads cost more CPU than they save (31 Spark
# tests on one session: the JVM's CPU 30 s -> 17 s, the same wall time). The suite is CPU bound on
# 2 cores, so that CPU is the other workers' time. JVMs print one line to stderr saying they took it.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

# Property tests check behaviour, not speed (bench/ measures that): hypothesis' 200 ms deadline per
# example fails them on a loaded machine (one example of a pure journal test took 320 ms once, 1.4 ms when
# run again), so the suite runs without it.
from hypothesis import settings as hypothesis_settings  # noqa: E402

hypothesis_settings.register_profile("suite", deadline=None)
hypothesis_settings.load_profile("suite")

from brokerproc import BrokerProcess, NamesrvProcess  # noqa: E402
from etcdproc import EtcdProcess  # noqa: E402
from layout import PACKAGE_FOLDERS  # noqa: E402


def _linked_path(package: str) -> str:
    """Where a package sits in the link tree, below `tidemark/`: tidemark.broker -> broker."""
    return package.removeprefix("tidemark").lstrip(".").replace(".", "/")


def pytest_sessionstart(session: pytest.Session) -> None:
    """The editable install is a tree of links (Makefile: setuptools' strict mode): a module added since
    the last `make setup` is missing from it, and the tests would fail on imports that look right."""
    import tidemark
    tree = Path(tidemark.__file__).parent  # the link, not the file it points to
    if "__editable__" not in str(tree):
        return  # installed otherwise (a wheel, the import hook): nothing to check
    repo = Path(__file__).resolve().parents[1]
    missing = sorted(str(src.relative_to(repo)) for folder, package in PACKAGE_FOLDERS.items()
                     for src in (repo / folder).rglob("*.py")
                     if "__pycache__" not in src.parts
                     and not (tree / _linked_path(package) / src.relative_to(repo / folder)).exists())
    if missing:
        pytest.exit(f"not in the editable install yet: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}; "
                    "run `make setup` (it links new files)", returncode=4)


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator:
    """Start brokers on demand; all are killed at the end of the test."""
    started: list[BrokerProcess] = []

    def start(name: str = "broker-a", *, args: tuple[str, ...] = (), data_dir: Path | None = None,
              env: dict[str, str] | None = None) -> BrokerProcess:
        b = BrokerProcess(data_dir or tmp_path / f"data-{name}-{len(started)}", broker_name=name, args=args, env=env)
        started.append(b)
        return b.start()

    yield start
    for b in started:
        b.kill()


@pytest.fixture
def namesrv_factory(tmp_path: Path) -> Iterator:
    """Start name servers on demand (`args` e.g. ("--expiry-ms", "2000")); all are killed at the end."""
    started: list[NamesrvProcess] = []

    def start(*, args: tuple[str, ...] = ()) -> NamesrvProcess:
        n = NamesrvProcess(tmp_path / "namesrv", args=args)
        started.append(n)
        return n.start()

    yield start
    for n in started:
        n.kill()


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    """A one-member etcd (Debian's etcd-server) on free ports, for controller mode."""
    server = EtcdProcess(tmp_path / "etcd").start()
    yield server
    server.stop()


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    """One fresh broker (async flush) for a test."""
    return broker_factory()


@pytest.fixture(scope="module")
def module_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    """One broker shared by the tests of a module (use distinct topic/group names per test)."""
    b = BrokerProcess(tmp_path_factory.mktemp("module-broker") / "data").start()
    yield b
    b.kill()


@pytest.fixture
def offset_dir(tmp_path: Path, monkeypatch) -> Path:
    """Broadcasting consumers write local offsets here, not in ~."""
    d = tmp_path / "local-offsets"
    monkeypatch.setenv("TIDEMARK_OFFSET_DIR", str(d))
    return d


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA and server/client certificates for TLS tests (tlslib.make_pki)."""
    from tlslib import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


# `make test` runs the suite on several pytest-xdist workers (-n N --dist loadscope), a file at a time:
# the tests of one file run on one worker in their order, so a module-scoped broker and what one test
# leaves for the next (a requeued dead letter, say) are as in a serial run. Files that share a heavy
# session resource run on one worker together: the container engine and its images (and the compose
# test that skips when they ran), one SparkSession, one browser, the benchmarks' smoke runs, which
# measure and must not compete with each other, and the fault scenarios (network namespaces, timings).
# The Spark standalone module is a unit of its own: it stops the local session and starts a cluster of
# its own JVMs anyway, so on another worker it costs nothing more and shortens the Spark unit, the
# longest, by a sixth.
# (xdist's own xdist_group marks do not reach its scheduler under pytest 9, whose node ids are
# read-only, hence a scheduler of our own that splits node ids into these units.)
_WORKER_GROUPS = (
    ("tests/containers/", "containers"),
    ("tests/integration/test_compose.py", "containers"),
    ("tests/spark/test_spark_standalone.py", "spark-standalone"),
    ("tests/spark/", "spark"),
    ("tests/browser/", "browser"),
    ("tests/bench/", "bench"),
    ("tests/integration/test_faults.py", "faults"),
)

# The longest units, with the seconds each took in a full run on a busy 2-core machine (only their
# order matters). Workers take these first, longest first (then the rest in xdist's order, most tests
# first): with xdist's order alone a long unit with few tests (the benchmarks, the container stack)
# could start late and run on alone at the end while the other workers stand idle. Add a unit here
# when it takes more than about a minute in the run's --durations.
_UNIT_SECONDS = {
    "spark": 800,
    "tests/integration/test_cli_golden.py": 460,
    "containers": 380,
    "bench": 320,
    "tests/integration/test_readme.py": 200,
    "tests/integration/test_cli_surface.py": 190,
    "tests/integration/test_cli.py": 160,
    "spark-standalone": 150,
    "tests/integration/test_auth_admin.py": 140,
    "tests/integration/test_fault_defects_client.py": 130,
    "faults": 130,
    "tests/integration/test_broker_offsets.py": 120,
    "tests/integration/test_consumer_groups.py": 80,
    "tests/integration/test_idempotence.py": 75,
    "tests/integration/test_controller_mode.py": 70,
    "tests/integration/test_rmq5_fuzz.py": 70,
    "tests/compat/test_python_consumers.py": 70,
    "tests/integration/test_switchover.py": 70,
    "tests/integration/test_sync_replication_refusal.py": 65,
    "tests/integration/test_admin_parity.py": 65,
    "tests/integration/test_replicated_reads.py": 60,
    "tests/integration/test_cli_operator.py": 60,
    "tests/integration/test_restart_loop.py": 55,
}


def worker_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its heavy resource's group, else its file."""
    path = nodeid.split("::", 1)[0]
    return next((group for prefix, group in _WORKER_GROUPS if path.startswith(prefix)), path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByFileAndResource(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_unit(nodeid)

        def _assign_work_unit(self, node) -> None:
            # The longest unit still waiting goes next (max keeps the first of equals: xdist's order).
            longest = max(self.workqueue, key=lambda unit: _UNIT_SECONDS.get(unit, 0))
            self.workqueue.move_to_end(longest, last=False)
            super()._assign_work_unit(node)

    return ByFileAndResource(config, log)
