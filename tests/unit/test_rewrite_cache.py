"""tools/rewrite_cache.py writes the rewritten test modules pytest itself would write and then reads."""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULE = '''
def helper():
    return [1, 2]


def test_lists():
    assert helper() == [1, 3]
'''


def _pytest(where: Path, *args: str, write: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    if not write:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args, str(where)],
                          cwd=where, env=env, capture_output=True, text=True, timeout=120)


def _tool(where: Path) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "rewrite_cache.py"), str(where)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out


def _cached(where: Path) -> dict[str, object]:
    """The rewritten modules' code objects in where's caches, by file name (a pyc's header is 16 bytes)."""
    return {p.name: marshal.loads(p.read_bytes()[16:]) for p in where.rglob("*-pytest-*.pyc")}


def test_the_cache_holds_what_pytest_writes_and_pytest_reads_it(tmp_path):
    suite = tmp_path / "suite"
    (suite / "sub").mkdir(parents=True)
    (suite / "sub" / "test_one.py").write_text(MODULE)
    (suite / "conftest.py").write_text("")
    (suite / "helpers.py").write_text("X = 1\n")  # not a test module: pytest does not rewrite it

    out = _tool(suite)
    assert "2 test modules rewritten" in out.stdout
    ours = _cached(suite)
    tail = f".{sys.implementation.cache_tag}-pytest-{pytest.__version__}.pyc"
    assert sorted(ours) == [f"conftest{tail}", f"test_one{tail}"]

    # pytest, allowed to write, writes the same code where the tool did
    for pyc in suite.rglob("*-pytest-*.pyc"):
        pyc.unlink()
    _pytest(suite, "--collect-only", write=True)
    assert _cached(suite) == ours

    # and, not allowed to write, runs what the cache holds: a cached module whose assert was left plain
    # (no rewrite) fails with a bare AssertionError
    plain = compile(MODULE, str(suite / "sub" / "test_one.py"), "exec")
    pyc = next(suite.rglob("test_one.*-pytest-*.pyc"))
    pyc.write_bytes(pyc.read_bytes()[:16] + marshal.dumps(plain))
    assert "At index 1 diff: 2 != 3" not in _pytest(suite, write=False).stdout
    pyc.unlink()
    assert "At index 1 diff: 2 != 3" in _pytest(suite, write=False).stdout


def test_a_module_that_does_not_compile_is_left_to_pytest(tmp_path):
    (tmp_path / "test_broken.py").write_text("def test_x(:\n    pass\n")
    (tmp_path / "test_fine.py").write_text(MODULE)
    assert "1 test modules rewritten" in _tool(tmp_path).stdout
    assert [p.name.split(".")[0] for p in tmp_path.rglob("*-pytest-*.pyc")] == ["test_fine"]
    assert "SyntaxError" in _pytest(tmp_path, write=False).stdout  # pytest's own report of it
