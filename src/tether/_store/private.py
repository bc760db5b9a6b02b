"""Files that hold runs are the operator's alone: created 0600, in directories created 0700 (P-44).

A journal holds every call's arguments, secret-named ones included, so the
store, its WAL, shared-memory and rollback journal files, and a backup of it
are readable by the user tether runs as and nobody else, whatever the umask.
SQLite gives a database's WAL, ``-shm`` and ``-journal`` files the mode of the
database file itself, so creating that file 0600 before SQLite opens it is
what keeps them private too. Directories and files that already exist keep
their mode: the operator chose it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

FILE_MODE, DIR_MODE = 0o600, 0o700


def private_dir(path: Path) -> None:
    """``path`` and any missing parents, each one created here made 0700 (the umask notwithstanding)."""
    missing = []
    for part in (path, *path.parents):
        if part.exists():
            break
        missing.append(part)
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    for part in missing:
        os.chmod(part, DIR_MODE)


def private_file(path: Path, *, exclusive: bool = False) -> bool:
    """Create ``path`` empty with mode 0600 unless it exists (``exclusive``: FileExistsError); True if created."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        fd = os.open(path, flags, FILE_MODE)
    except FileExistsError:
        if exclusive:
            raise
        return False
    try:
        os.fchmod(fd, FILE_MODE)  # the umask may have taken bits away; it never adds any, but say it once
    finally:
        os.close(fd)
    return True


def mode_of(path: Path) -> str:
    """``0600``-style text of a file's permission bits, for what a command reports."""
    return f"{stat.S_IMODE(path.stat().st_mode):04o}"
