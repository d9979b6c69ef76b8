"""SmallDisk: a tmpfs of a few MiB to put a data dir on and fill, for full-disk faults.

`fill()` takes every free byte but `leave` with a filler file, as another
process writing logs would; `free()` deletes the filler. Needs root (mount);
`available()` says whether this machine allows it.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

__all__ = ["SmallDisk", "available"]


def available() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "mounting a small tmpfs needs root"
    return True, ""


class SmallDisk:
    def __init__(self, mount: Path, size_bytes: int) -> None:
        self.mount = Path(mount)
        self.mount.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(self.mount)], check=True)
        self.filler = self.mount / ".filler"

    def free_bytes(self) -> int:
        st = os.statvfs(self.mount)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int = 0) -> None:
        """Write zeros until at most `leave` bytes are free."""
        chunk = b"\0" * 65536
        with open(self.filler, "ab") as f:
            while (free := self.free_bytes()) > leave:
                try:
                    f.write(chunk[: max(4096, min(len(chunk), free - leave))])
                    f.flush()
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    return

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.mount)], check=False)

    def __enter__(self) -> SmallDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
