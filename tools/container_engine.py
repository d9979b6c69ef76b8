"""A container engine for tests/containers/: Debian's docker.io, docker-compose and debootstrap.

    python3 tools/container_engine.py install    # `make test` runs this beside the venv's setup

It runs on the system's Python (the venv may not exist yet): the standard library only.

`install` installs the three packages with apt-get when they are missing and this runs as root (a CI
machine); otherwise it says in one line why not and exits 0, and the container tests skip with that
line. Starting and stopping `dockerd` is left to the tests (`Engine`), which own the process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PACKAGES = ("docker.io", "docker-compose", "debootstrap")
COMMANDS = ("docker", "dockerd", "docker-compose", "debootstrap")


def missing_commands() -> list[str]:
    return [c for c in COMMANDS if shutil.which(c) is None]


def why_not_installable() -> str | None:
    """None when install() can proceed; else the reason, in one line."""
    if not missing_commands():
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return (f"no container engine: {', '.join(missing_commands())} not installed "
                f"(as root: apt-get install {' '.join(PACKAGES)})")
    return None


def install() -> str | None:
    """Install what is missing; None on success, else why not (one line)."""
    reason = why_not_installable()
    if reason is not None or not missing_commands():
        return reason
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    argv = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    for attempt in range(2):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode == 0 and not missing_commands():
            return None
        if attempt == 0:  # stale package lists on a fresh machine
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=600)
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
    return f"apt-get install {' '.join(PACKAGES)} failed: {tail[0]}"


def engine_answers() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class Engine:
    """A Docker engine for a test session: the running one, or a `dockerd` started (and stopped) here."""

    def __init__(self, log_path: Path) -> None:
        self._log_path = log_path
        self._proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> str | None:
        """None once an engine answers; else why there is none (one line)."""
        reason = install()
        if reason is not None:
            return reason
        if engine_answers():
            return None
        if os.geteuid() != 0:
            return "no Docker engine running, and starting dockerd needs root"
        log = open(self._log_path, "ab")
        self._proc = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return f"dockerd exited with {self._proc.returncode} (see {self._log_path})"
            if engine_answers():
                return None
            time.sleep(0.5)
        return f"dockerd did not answer within {timeout:.0f} s (see {self._log_path})"

    def stop(self) -> None:
        """Stop the dockerd started here (graceful: it stops its containers first)."""
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def main(argv: list[str]) -> int:
    if argv[1:] != ["install"]:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    reason = install()
    print("container engine: " + (reason or "docker.io, docker-compose and debootstrap are installed"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
