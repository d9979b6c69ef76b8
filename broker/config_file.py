"""Loading and saving the broker's small JSON config files (topics.json, subscriptionGroup.json).

Writes are atomic with the previous file kept as `.bak`; a load falls back to
the `.bak` when the main file is missing, empty or not valid JSON, and refuses
(ConfigFileError) when a present file is unreadable and no good backup exists.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from broker.errors import ConfigFileError
from tidemark.fsutil import atomic_write, backup_path


def _read(path: Path) -> tuple[dict[str, Any] | None, str]:
    """Parse a JSON object from path; (None, reason) when it cannot be used."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, "missing"
    except OSError as e:
        return None, f"unreadable ({e.strerror})"
    if not text.strip():
        return None, "empty"
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"not valid JSON ({e.msg} at line {e.lineno})"
    if not isinstance(doc, dict):
        return None, "not a JSON object"
    return doc, "ok"


def load_json(path: Path, log: logging.Logger) -> dict[str, Any] | None:
    """The file's JSON object, its backup's, or None on a first start (neither exists)."""
    doc, why = _read(path)
    if doc is not None:
        log.info("config file loaded", event="config_load", file=path, source="json")
        return doc
    bak = backup_path(path)
    bak_doc, bak_why = _read(bak)
    if bak_doc is not None:
        log.warning("config file fell back to backup", event="config_load", file=path, source="bak", reason=why)
        return bak_doc
    if why == "missing" and bak_why == "missing":
        return None
    raise ConfigFileError(f"{path} is {why} and its backup {bak.name} is {bak_why}; "
                          "refusing to start with an empty configuration")


def save_json(path: Path, doc: dict[str, Any]) -> None:
    atomic_write(path, json.dumps(doc, indent=4, sort_keys=True).encode("utf-8"), keep_backup=True)
