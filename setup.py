"""Package discovery for the layout in pyproject.toml (all other metadata is there).

[tool.setuptools.package-dir] maps the folders broker/, client/, spark_connector/ into the import
package tidemark (tidemark.broker, ...) and proto/ to the root (tidemark, tidemark.v1, ...).
pyproject.toml cannot list packages found under such a mapping, so they are found here, from that
same table: a new subpackage needs no edit. Used by `pip install`, `pip wheel`, `python -m build`
and editable installs (setuptools' finder then maps each root to its folder).
"""

import tomllib
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
roots = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"]["package-dir"]
packages = []
for name, folder in roots.items():
    found = find_packages(str(ROOT / folder), exclude=["*.tests", "*.tests.*"])
    packages += found if not name else [name, *(f"{name}.{sub}" for sub in found)]

setup(packages=sorted(packages))
