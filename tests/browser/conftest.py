"""Browser tests: the console in a real headless Chromium (Debian's, driven by Playwright).

`make test` installs Chromium when run as root (CI); elsewhere, without /usr/bin/chromium these tests
skip saying so. Screenshots land in build/test-artifacts/console/ (or $TIDEMARK_ARTIFACTS_DIR).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from brokerproc import BrokerProcess

from tidemark.client.console.server import Console, ConsoleSettings
from tidemark.client.settings import ClientSettings
from tidemark.common.auth import Credentials

OP = Credentials("op", "op-secret-001")

CHROMIUM = os.environ.get("TIDEMARK_CHROMIUM", "/usr/bin/chromium")
# The machine's network is closed: background networking would only fill the log with refused lookups.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


@pytest.fixture(scope="session")
def artifacts() -> Path:
    root = Path(os.environ.get("TIDEMARK_ARTIFACTS_DIR", Path(__file__).parents[2] / "build" / "test-artifacts"))
    out = root / "console"
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def chromium() -> Iterator:
    """One browser per module, closed before the next module: Playwright's sync API runs an event loop on
    the main thread while it is open, and asyncio.run() in later tests would refuse to start beside it."""
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.skip(f"no Chromium at {CHROMIUM}: `make test` installs Debian's chromium when run as root")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    """One broker with --auth for the module (its super user is OP; delay levels of 100 ms steps, so a
    retry copy is stored at once): tests use distinct names."""
    b = BrokerProcess(tmp_path_factory.mktemp("auth-broker") / "data",
                      args=("--auth", "--init-user", f"{OP.access_key}:{OP.secret_key}",
                            "--delay-levels", " ".join(f"{n * 100}ms" for n in range(1, 19)))).start()
    yield b
    b.kill()


@pytest.fixture
def page(chromium) -> Iterator:
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(20_000)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    context.close()
    assert not errors, f"the page raised JavaScript errors: {errors}"


@pytest.fixture
def console_factory() -> Iterator:
    """Start consoles (in this process, like any client) on free ports; all shut down at the end."""
    started: list[Console] = []

    def start(address: str, *, credentials=None, read_only: bool = False, sample_interval_s: float = 0.3) -> Console:
        c = Console(ClientSettings(brokers=address, credentials=credentials),
                    ConsoleSettings(port=0, read_only=read_only, sample_interval_s=sample_interval_s)).start()
        started.append(c)
        return c

    yield start
    for c in started:
        c.shutdown()


def url(console: Console, path: str = "/") -> str:
    host, port = console.address
    return f"http://{host}:{port}{path}"
