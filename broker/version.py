"""The broker's version: the installed package's, one value for the registration, broker status, the
data dir's format stamp and /metrics' build_info (`tidemark --version`, a client command, reads the same
package metadata itself)."""

from __future__ import annotations

import importlib.metadata


def package_version() -> str:
    try:
        return importlib.metadata.version("tidemark")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0.0.0+source"


VERSION = package_version()
