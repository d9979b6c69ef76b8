"""The source folders and the packages they are installed as, read from pyproject.toml's package-dir, the
one place that says so: {"broker": "tidemark.broker", ..., "proto/tidemark": "tidemark"}."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _package_folders() -> dict[str, str]:
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"]["package-dir"]
    # "" maps the root of every package to a folder: there the root package is tidemark/.
    return {(f"{folder}/tidemark" if not package else folder): package or "tidemark"
            for package, folder in mapping.items()}


PACKAGE_FOLDERS = _package_folders()
