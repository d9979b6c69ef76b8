"""Crash-safe file replacement shared by the broker's config files and the client's local offsets."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make a rename or create inside `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, keep_backup: bool = False, mode: int | None = None,
                 sync: bool = True) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new file.

    Writes a temp file beside it, fsyncs it, optionally keeps the previous file as
    `<name>.bak` (a hard link, so the old content stays reachable at every instant),
    renames the temp file into place and fsyncs the directory. `mode` (e.g. 0o600
    for files holding secrets) is set before the first byte is written. Without
    `sync` nothing is fsynced: a process that dies still leaves the old or the new
    file, a machine that crashes may leave neither.
    """
    path = Path(path)
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{path.name}.tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666 if mode is None else mode), "wb") as f:
        if mode is not None:
            os.fchmod(f.fileno(), mode)  # the umask, or a temp file left by a crash, would decide otherwise
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())
    if keep_backup and path.exists():
        bak = backup_path(path)
        bak_tmp = directory / f".{bak.name}.tmp"
        if bak_tmp.exists():
            bak_tmp.unlink()
        os.link(path, bak_tmp)
        os.replace(bak_tmp, bak)
    os.replace(tmp, path)
    if sync:
        fsync_dir(directory)


def backup_path(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + ".bak")
