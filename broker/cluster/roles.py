"""A broker's role across restarts, and what fences a replaced master.

`config/role.json` is written when a replica is promoted (`tidemark broker
promote`): from then on the broker is the master of its name with a new
**epoch**, whatever its command line says (`--broker-id 1 --master ...`
from before the promotion), until an operator removes the file. Masters
register with their epoch; the name servers refuse a master whose epoch is
older than the newest they know (broker/namesrv/routes.py), and a broker
refused so is **fenced**: it takes no writes until it restarts (as a replica
of the new master, or promoted again).

The file is written atomically (tidemark.common.fsutil) before the promotion takes
effect: a crash in between leaves the broker a replica, never a master that
forgot its epoch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tidemark.broker.disk.metadata_file import load_json
from tidemark.broker.errors import ConfigFileError
from tidemark.common.fsutil import atomic_write, backup_path, fsync_dir
from tidemark.common.logs import get_logger

log = get_logger("tidemark.broker.cluster.roles")

ROLE_FILE_NAME = "role.json"


@dataclass(frozen=True, slots=True)
class Role:
    broker_id: int  # 0 after a promotion
    epoch: int


def load_role(config_dir: Path) -> Role | None:
    """The persisted role, or None when the broker was never promoted. ConfigFileError when the file is
    not a role (starting without it could bring back a replaced master)."""
    doc = load_json(Path(config_dir) / ROLE_FILE_NAME, log)
    if doc is None:
        return None
    broker_id, epoch = doc.get("brokerId"), doc.get("epoch")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (broker_id, epoch)):
        raise ConfigFileError(f"{Path(config_dir) / ROLE_FILE_NAME} holds no role (brokerId and epoch, integers "
                              f">= 0); repair or remove it")
    return Role(broker_id, epoch)


def save_role(config_dir: Path, role: Role) -> None:
    """Write the role durably (OSError when it cannot be)."""
    data = json.dumps({"brokerId": role.broker_id, "epoch": role.epoch}, indent=2).encode()
    atomic_write(Path(config_dir) / ROLE_FILE_NAME, data, keep_backup=True)


def forget_role(config_dir: Path) -> None:
    """A former master follows from now on (controller mode): the role and its backup go, the file first
    (load_role falls back to the backup, which would bring back the master of an older epoch)."""
    for path in (Path(config_dir) / ROLE_FILE_NAME, backup_path(Path(config_dir) / ROLE_FILE_NAME)):
        path.unlink(missing_ok=True)
    fsync_dir(Path(config_dir))
