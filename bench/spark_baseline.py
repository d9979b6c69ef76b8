"""The Spark connector as it was at a git revision, importable beside the current one, for A/B runs of
bench.spark_read in one SparkSession (the same machine load for both).

    python -m bench.spark_baseline 3d382f2 /tmp/tidemark-base
    PYTHONPATH=/tmp/tidemark-base python -m bench.spark_read --baseline tidemark_base=tidemark_base_source:Source

Writes OUT/tidemark_base: the installed tidemark package with common/, client/ and spark_connector/
as they were at REV, its imports renamed to tidemark_base (the generated protobuf modules stay
shared: the wire format is the same, and the protobuf registry takes each .proto file once), and
OUT/tidemark_base_source.py, whose Source registers as format "tidemark_base".
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import tidemark
from bench.procs import REPO

NAME = "tidemark_base"
AT_REVISION = ("common", "client", "spark_connector")
_IMPORT = re.compile(r"\btidemark\.(common|client|broker|spark_connector)\b")
_SOURCE = f'''from {NAME}.spark_connector.source import TidemarkDataSource


class Source(TidemarkDataSource):
    @classmethod
    def name(cls) -> str:
        return "{NAME}"
'''


def copy_package(package: Path, rev: str, paths: tuple[str, ...]) -> None:
    """PACKAGE: a copy of the installed tidemark package in which `paths` (files or directories of the
    repository) are as they were at REV."""
    shutil.rmtree(package, ignore_errors=True)
    # The editable install is a tree of links into the repository: copy what they point at.
    shutil.copytree(Path(tidemark.__path__[0]), package, symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__"))
    files = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, *paths], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split()
    for name in paths:
        if (package / name).is_file():
            (package / name).unlink()
        else:
            shutil.rmtree(package / name, ignore_errors=True)
    for path in files:
        target = package / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, check=True,
                                          capture_output=True).stdout)


def build(rev: str, out: Path) -> Path:
    package = out / NAME
    copy_package(package, rev, AT_REVISION)
    for py in package.rglob("*.py"):
        text = py.read_text()
        renamed = _IMPORT.sub(rf"{NAME}.\1", text).replace("from tidemark import", f"from {NAME} import")
        if renamed != text:
            py.write_text(renamed)
    (out / f"{NAME}_source.py").write_text(_SOURCE)
    return package


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("rev", help="git revision of the connector to copy, e.g. HEAD or a commit")
    parser.add_argument("out", type=Path, help="directory to put on PYTHONPATH")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"{build(args.rev, args.out)} (at {args.rev})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
