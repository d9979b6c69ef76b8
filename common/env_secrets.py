"""Secrets from the environment without putting them in it: `NAME_FILE` (Docker's and compose's secrets
convention) names a file that holds the value of `NAME`.

`docker inspect` shows a container's environment to anyone who may run it, and a process's environment
is readable in /proc by its user; a mounted file (mode 0400, the service's user) is not. The broker's
secret settings (init_user, controller_user), the name server's broker user and the client's secret key
all accept either form; the value wins when both are set.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

FILE_SUFFIX = "_FILE"


def secret_from_env(env: Mapping[str, str], key: str) -> str:
    """env[key] if set and not empty, else the content of the file env[key + "_FILE"] names (read_secret_file),
    else "". ValueError, in one line naming the variable, when that file cannot be read."""
    value = env.get(key, "")
    if value:
        return value
    path = env.get(key + FILE_SUFFIX, "")
    if not path:
        return ""
    try:
        return read_secret_file(path)
    except ValueError as e:
        raise ValueError(f"{key}{FILE_SUFFIX}={path}: {e}") from None


def read_secret_file(path: str | Path) -> str:
    """A secret kept in a file: its text without the line end an editor adds. ValueError saying why (one line)
    when it cannot be read."""
    try:
        text = Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ValueError(f"cannot read it ({reason})") from None
    return text.rstrip("\r\n")
