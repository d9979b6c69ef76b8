"""What the images hold, as `make images` builds them: each exactly the distributions pip resolves for
its extra of Tidemark (tools/images.py) and nothing else: no pip or setuptools, no test, build or
benchmark tools, and no Spark in the broker's. Both run as the non-root tidemark user; the Spark image's
work and scratch dirs belong to that user, so Spark runs with the root file system read-only.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The interpreter every process of both images runs (on PATH before the base's).
INSTALLED = ("import importlib.metadata as m; "
             "print('\\n'.join(sorted({d.metadata['Name'] + '==' + d.version for d in m.distributions()})))")
NEVER = {"pip", "setuptools", "wheel", "grpcio-tools"}  # nothing installs or generates code at run time


def docker(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"docker {' '.join(args)}: {done.stderr[-2000:]}"
    return done.stdout.strip()


def canonical(requirement: str) -> str:
    """A distribution's name as pip compares names (PEP 503), without version or extras."""
    return re.sub(r"[-_.]+", "-", re.split(r"[\s\[=<>!~;]", requirement, maxsplit=1)[0]).lower()


def installed(image: str) -> set[str]:
    return set(docker("run", "--rm", "--entrypoint", "python", image, "-c", INSTALLED).splitlines())


def other_extras(own: str) -> set[str]:
    """Every package Tidemark's other extras (tests, benchmarks, code generation...) name."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = {canonical(r) for name, requirements in extras.items() if name != own for r in requirements}
    return named - {"tidemark"}  # `dev` names tidemark's own extras


@pytest.mark.parametrize("name, own, required", [
    ("broker", "broker", {"tidemark", "grpcio"}),
    ("spark", "spark", {"tidemark", "pyspark", "pyarrow", "py4j"}),
])
def test_each_image_holds_exactly_what_its_extra_needs(images, name, own, required):
    image, resolved = images[name]["tag"], images[name]["packages"]
    present = installed(image)
    assert present == {f"tidemark=={_version()}", *resolved}, f"{image} differs from pip's resolution"
    names = {canonical(p) for p in present}
    assert required <= names, f"{image} lacks {required - names}"
    unneeded = (NEVER | other_extras(own)) - {canonical(p) for p in resolved}
    assert not names & unneeded, f"{image} carries {names & unneeded}"


def test_the_broker_image_is_small_runs_as_non_root_and_starts_its_command(images):
    image = images["broker"]["tag"]
    assert images["broker"]["bytes"] < 250e6, images["broker"]
    assert docker("image", "inspect", "--format", "{{.Config.User}}", image) == "tidemark"
    # The entrypoint's command (Tidemark's own layer, on the dependencies' venv) imports the broker.
    assert "--data-dir" in docker("run", "--rm", "--read-only", image, "--help")


def test_the_spark_image_gives_spark_its_dirs_on_a_read_only_root(images):
    image = images["spark"]["tag"]
    assert docker("image", "inspect", "--format", "{{.Config.User}}", image) == "tidemark"
    env = dict(e.split("=", 1) for e in docker("image", "inspect", "--format", "{{join .Config.Env \"\\n\"}}",
                                               image).splitlines())
    dirs = [env["SPARK_WORKER_DIR"], env["SPARK_LOCAL_DIRS"]]
    owners = docker("run", "--rm", "--read-only", image, "stat", "--format", "%U %a", *dirs)
    assert owners.splitlines() == ["tidemark 755"] * 2, owners
    # The install is not the user's to change, whatever the root file system's mode.
    assert docker("run", "--rm", image, "sh", "-c", "test ! -w /opt/tidemark/bin && test ! -w \"$SPARK_HOME\" "
                  "&& echo read-only") == "read-only"
    assert docker("run", "--rm", "--read-only", image, "python", "-c", "import pyspark; from tidemark import "
                  "spark_connector; print(spark_connector.__name__)") == "tidemark.spark_connector"


def test_make_images_leaves_no_dangling_image_and_keeps_its_layer_cache_tagged(images):
    """The stages the images copy from are the next build's cache: tagged, not left dangling (1.9 GB of
    <none> images per build before); no untagged image of ours remains, from this build or an earlier one."""
    assert images["dangling_new"] == [] and images["dangling_ours"] == [], images
    for tag, image in images["cache"].items():
        assert docker("image", "inspect", "--format", "{{.Id}}", tag) == image
    assert sorted(images["cache"]) == [f"tidemark/build-cache:{s}" for s in ("app", "broker-deps", "spark-deps")]


def _version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
