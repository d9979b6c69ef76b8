"""pytest's rewritten test modules, made once before the suite instead of in every xdist worker.

    .venv/bin/python tools/rewrite_cache.py tests    # `make test` runs this before pytest

pytest compiles each test module and conftest.py with its asserts rewritten, and keeps the result in
`__pycache__/<name>.cpython-311-pytest-<version>.pyc` unless the interpreter was told not to write
bytecode, as these machines tell it (PYTHONDONTWRITEBYTECODE). Then each of the suite's workers rewrote
every test module (237 of them) again on every run: about 5.5 s of CPU a worker, of a collection of
8.4 s (about 3 s with the cache). pytest still reads a cached file whenever one is there (a hash-checked
pyc: it is used only for the source it was made from), so this writes them, with pytest's own rewrite,
over the machine's cores. A module that does not compile is left to pytest, which reports it.

It uses pytest's private rewrite functions: if they are not there any more, it says so in one line and
exits 0 (the suite runs as before, only slower).
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def _modules(root: Path) -> list[Path]:
    """What pytest rewrites under root (its default python_files, and conftest.py)."""
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts
                  and (p.name == "conftest.py" or p.name.startswith("test_") or p.name.endswith("_test.py")))


def _write(path: str) -> bool:
    from _pytest.assertion import rewrite

    fn = Path(path)
    pyc = rewrite.get_cache_dir(fn) / (fn.name[:-3] + rewrite.PYC_TAIL)
    try:
        source_hash, code = rewrite._rewrite_test(fn, None)  # (None: the default ini, as this suite has)
    except (SyntaxError, ValueError, OSError):
        return False
    pyc.parent.mkdir(parents=True, exist_ok=True)
    partial = pyc.with_name(f"{pyc.name}.{os.getpid()}")
    with open(partial, "wb") as fp:
        rewrite._write_pyc_fp(fp, source_hash, code)
    os.replace(partial, pyc)
    return True


def main(argv: list[str]) -> int:
    try:
        from _pytest.assertion import rewrite
        missing = [name for name in ("get_cache_dir", "PYC_TAIL", "_rewrite_test", "_write_pyc_fp")
                   if not hasattr(rewrite, name)]
    except ImportError as e:
        missing = [str(e)]
    if missing:
        print(f"rewrite_cache: this pytest has no {', '.join(missing)}: every worker rewrites the tests itself")
        return 0
    modules = [str(p) for root in argv or ["tests"] for p in _modules(Path(root))]
    with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
        written = sum(pool.map(_write, modules, chunksize=8))
    print(f"rewrite_cache: {written} test modules rewritten for pytest")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
