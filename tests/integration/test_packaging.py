"""The wheel users get from `pip install tidemark`: one import package, the client library only.

Builds the wheel from a copy of this tree as a fresh clone has it, without the generated gRPC code (the
build generates it; no build isolation when this interpreter's setuptools can build it, so no index is
needed for that), installs it with its base dependencies only (pinned by
requirements.lock; from PyPI or pip's cache) into a clean venv outside the tree, and runs it there.
"""

from __future__ import annotations

import ast
import email.parser
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest
from layout import PACKAGE_FOLDERS

ROOT = Path(__file__).resolve().parents[2]
# Source folder -> the package it is installed as (pyproject.toml [tool.setuptools.package-dir]).
FOLDERS = PACKAGE_FOLDERS
OLD_NAMES = {"broker", "client", "spark_connector", "common"}
NOT_IN_BASE = ("pyspark", "pyarrow", "grpc_tools", "numpy", "uvloop", "prometheus_client", "opentelemetry")
# What is not copied to build the wheel: caches, venvs, data, earlier builds, and the generated gRPC code
# (not in git: the build must generate it, as it does from a fresh clone).
IGNORED = shutil.ignore_patterns(".git", ".venv", "venv", "build", "dist", "data", "__pycache__", "*.egg-info",
                                 ".pytest_cache", ".ruff_cache", ".hypothesis", "spark-warehouse", "metastore_db",
                                 "node_modules", "*.log", "*_pb2.py", "*_pb2.pyi", "*_pb2_grpc.py", ".generated")


def _run(argv: list, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    out = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env, **kw)
    assert out.returncode == 0, f"{' '.join(map(str, argv))} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    return out


def _can_build_here() -> bool:
    """This interpreter's setuptools builds wheels itself (>= 70.1) and knows the editable finder."""
    try:
        major, minor = (int(p) for p in version("setuptools").split(".")[:2])
    except Exception:
        return False
    return (major, minor) >= (70, 1)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = _fresh_copy(tmp)
    offline = ["--no-build-isolation"] if _can_build_here() else []  # else pip fetches setuptools to build
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps", *offline,
          "--wheel-dir", tmp / "dist", src], cwd=tmp, timeout=120)
    [built] = (tmp / "dist").glob("tidemark-*.whl")
    return built


def _fresh_copy(tmp: Path) -> Path:
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=IGNORED, symlinks=True)  # as a fresh clone: no build/, no generated code
    assert not list((src / "proto").rglob("*_pb2*.py")), "the copy must start without generated code"
    return src


def test_wheel_holds_one_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    dist_info = {t for t in tops if t.endswith(".dist-info")}
    assert tops - dist_info == {"tidemark"}, f"top-level names in the wheel: {sorted(tops)}"
    assert len(dist_info) == 1
    # Every source package made it in, under its tidemark name, with the marker and generated code.
    for folder, package in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.relative_to(ROOT / folder).parent
            if "__pycache__" in rel.parts:
                continue
            path = "/".join([*package.split("."), *rel.parts, "__init__.py"])
            assert path in names, f"{init.relative_to(ROOT)} is not in the wheel as {path}"
        # ... and every file they need that is not Python (e.g. static files), by package-data.
        for path in (ROOT / folder).rglob("*"):
            rel = path.relative_to(ROOT / folder)
            if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in rel.parts \
                    and not any(part.startswith(".") or part.endswith(".egg-info") for part in rel.parts):
                wanted = "/".join([*package.split("."), *rel.parts])
                assert wanted in names, f"{path.relative_to(ROOT)} is not in the wheel ([tool.setuptools.package-data])"
    for needed in ("tidemark/py.typed", "tidemark/v1/messaging_pb2.py", "tidemark/v1/messaging_pb2.pyi",
                   "tidemark/v1/messaging_pb2_grpc.py", "tidemark/v1/messaging.proto",
                   "tidemark/rmq5/v2/messaging_pb2.py", "tidemark/client/cli/main.py"):
        assert needed in names, f"{needed} is not in the wheel"
    assert not any(n.startswith(("tidemark/bench/", "tidemark/tests/")) for n in names)

    [info] = dist_info
    meta = email.parser.Parser().parsestr(zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode())
    requires = meta.get_all("Requires-Dist") or []
    base = [r for r in requires if "extra ==" not in r]
    pinned = [r for r in requires if "==" in r.partition(";")[0]]  # ranges for users; pins in requirements.lock
    assert base and pinned == [], f"exact pins in the metadata: {pinned}"
    assert not any(r.lower().startswith(("pyspark", "pyarrow", "grpcio-tools")) for r in base), base
    assert {"broker", "spark", "dev", "build", "compat"} <= set(meta.get_all("Provides-Extra") or [])
    entry_points = zipfile.ZipFile(wheel).read(f"{info}/entry_points.txt").decode()
    assert "tidemark = tidemark.client.cli.main:main" in entry_points


def test_base_install_is_the_client_library(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)  # this pip installs into it (ensurepip is slow)
    py, bindir = env_dir / "bin" / "python", env_dir / "bin"
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--quiet", "--disable-pip-version-check",
          "--constraint", ROOT / "requirements.lock", wheel], cwd=tmp_path, timeout=180)

    probe = ("import importlib.util, json, sys, tidemark.client, tidemark.v1.messaging_pb2\n"
             "from tidemark.client import Admin, Message, Producer, PushConsumer\n"
             "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m)]))\n"
             "print(tidemark.client.__file__)\n")
    out = _run([py, "-c", probe, *NOT_IN_BASE, *OLD_NAMES, "bench"], cwd=tmp_path, timeout=60).stdout.splitlines()
    found = json.loads(out[0])
    assert found == [], f"installed or importable with `pip install tidemark` only: {found}"
    assert out[1].startswith(str(env_dir)), f"tidemark.client imported from {out[1]}, not the venv"

    cli = _run([bindir / "tidemark", "--version"], cwd=tmp_path, timeout=60)
    assert cli.stdout.strip() == f"tidemark {version('tidemark')}"
    daemon = subprocess.run([bindir / "tidemark", "broker", "--data-dir", tmp_path / "d"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert daemon.returncode == 1 and "pip install 'tidemark[broker]'" in daemon.stderr, daemon.stderr


# Imports an editor resolves, each to the source file it must land in.
JUMPS = (("from tidemark.broker.operations import Operations", "broker/operations.py"),
         ("from tidemark.common.logs import get_logger", "common/logs.py"),
         ("from tidemark.client.consumer.allocate import AllocateStrategyName", "client/consumer/allocate.py"),
         ("from tidemark.v1.messaging_pb2 import ProduceRequest", "proto/tidemark/v1/messaging_pb2.pyi"))  # the generated stub


def _jumps(python: Path | str, root: Path, tmp: Path) -> dict[str, str]:
    """Where jedi (the engine of jedi-language-server, python-lsp-server and vim-jedi) takes "go to
    definition" on each import of JUMPS, for a file outside the tree with `python`'s environment: it reads
    the environment's path (site-packages and its .pth entries), never imports, as editors do."""
    import jedi
    code = "\n".join(line for line, _ in JUMPS) + "\n"
    script = jedi.Script(code, path=tmp / "probe.py", project=jedi.Project(tmp),
                         environment=jedi.create_environment(str(python), safe=False))
    found = {}
    for number, (line, _) in enumerate(JUMPS, 1):
        definitions = script.goto(number, len(line), follow_imports=True)
        paths = [os.path.relpath(os.path.realpath(d.module_path), root) for d in definitions if d.module_path]
        found[line] = paths[0] if paths else "(not found)"
    return found


def test_an_editor_jumps_from_an_import_to_the_source_file(tmp_path: Path) -> None:
    """The development install (make setup: setuptools' strict editable mode) is a tree of links static
    tools follow; the default editable install, an import hook, leaves them nowhere."""
    assert _jumps(sys.executable, ROOT, tmp_path) == dict(JUMPS)


def test_an_editable_install_from_a_fresh_clone_generates_and_links_everything(tmp_path: Path) -> None:
    if not _can_build_here():
        pytest.skip("this interpreter's setuptools cannot build without an index")
    src = _fresh_copy(tmp_path)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    # The build runs in the new environment (pip --python): it sees this one's packages (setuptools,
    # grpcio-tools, jedi) through a path entry, and not this one's install of tidemark (a .pth of a
    # directory on the path is not read).
    [site_dir] = (env_dir / "lib").glob("python3*/site-packages")
    (site_dir / "dev-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", env_dir / "bin" / "python", "install", "--quiet",
          "--disable-pip-version-check", "--no-deps", "--no-build-isolation", "--config-settings",
          "editable_mode=strict", "-e", src], cwd=tmp_path, timeout=180)
    assert (src / "proto" / "tidemark" / "v1" / "messaging_pb2.py").is_file(), "the build generated no code"
    assert _jumps(env_dir / "bin" / "python", src, tmp_path) == dict(JUMPS)


def _old_imports(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text("utf-8"), str(path))
    except (SyntaxError, UnicodeDecodeError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: import {a.name}" for a in node.names
                      if a.name.partition(".")[0] in OLD_NAMES]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.partition(".")[0] in OLD_NAMES:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import ...")
    return found


def test_no_import_uses_the_old_top_level_names() -> None:
    """In a checkout `import client` still resolves (the working directory is on sys.path), and would
    load a second copy of every module it touches: so it is caught here, not by an ImportError."""
    skip = {".git", ".venv", "venv", "build", "dist", "data", "node_modules", "__pycache__", ".hypothesis"}
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in skip and not d.endswith(".egg-info")]
        found += [line for f in files if f.endswith(".py") for line in _old_imports(Path(folder, f))]
    assert found == [], "imports of the old top-level names (use tidemark.broker / tidemark.client / " \
                        "tidemark.spark_connector):\n" + "\n".join(found)
