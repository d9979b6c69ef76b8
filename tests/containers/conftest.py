"""A Docker engine for the container tests: the running one, or dockerd started (and stopped) here; and
the images, built once per session as `make images` builds them.

Where none can run (no root, no docker.io), every test in this directory is skipped with one line
saying why.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from container_engine import Engine  # noqa: E402


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory):
    engine = Engine(tmp_path_factory.mktemp("dockerd") / "dockerd.log")
    reason = engine.start()
    if reason is not None:
        engine.stop()
        pytest.skip(reason)
    try:
        yield engine
    finally:
        engine.stop()


@pytest.fixture(scope="session")
def images(docker_engine, tmp_path_factory) -> dict:
    """tools/images.py, as `make images` runs it: tags, sizes, packages and build times. Once per session:
    Docker's layer cache then makes a rebuild of unchanged inputs take seconds."""
    out = tmp_path_factory.mktemp("images") / "images.json"
    started = time.monotonic()
    before = dangling_images()
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "images.py"), "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, f"make images failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    summary = json.loads(out.read_text())
    summary["total_s"] = round(time.monotonic() - started, 1)
    # What the build left untagged: new ones, and any with the label every image it makes carries.
    after = dangling_images()
    summary["dangling_new"] = sorted(set(after) - set(before))
    summary["dangling_ours"] = sorted(i for i, labels in after.items() if "io.tidemark.stage" in labels)
    print(f"\nimages: {json.dumps({k: v for k, v in summary.items()})}")
    return summary


def dangling_images() -> dict[str, dict]:
    """Untagged images nothing builds on (`docker images -f dangling=true`): id -> labels."""
    ids = subprocess.run(["docker", "images", "--quiet", "--no-trunc", "--filter", "dangling=true"],
                         capture_output=True, text=True, check=True).stdout.split()
    if not ids:
        return {}
    labels = subprocess.run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", *ids],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    return {i: json.loads(line) or {} for i, line in zip(ids, labels, strict=True)}
