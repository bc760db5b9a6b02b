"""Who owns a running run, and whether that owner is provably gone.

A run is held through a lease in the store (P-11): when its process dies,
another takes it over once the lease lapses. When the owner ran on this very
host, waiting is needless: the owner's name says which process it was, and
the kernel says whether that process still exists. The name is

    <hostname>:<pid>:<random>;h=<host key>;t=<process start time>

The host key is a hash of the boot id, the pid namespace and the hostname: two
processes with the same key see the same pids, so "pid N is gone" means the
same thing to both (containers on one machine share a boot id but not a pid
namespace). The start time (clock ticks since boot, from /proc) tells a reused
pid from the owner. Without /proc (not Linux) there is no host key and only
the lease applies. An owner is never declared gone on a guess: anything that
cannot be read means "alive".
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
from functools import lru_cache


@lru_cache(maxsize=1)
def host_key() -> str | None:
    """This host's key, or None where processes cannot be checked (no /proc)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    raw = f"{boot}|{namespace}|{socket.gethostname()}".encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        if fields[0] in ("Z", "X"):
            return -1  # a zombie or dead task: the process has ended, only its entry is left
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def new_owner() -> str:
    """The owner name of a runtime in this process."""
    base = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
    key = host_key()
    if key is None:
        return base
    started = start_time(os.getpid())
    return f"{base};h={key}" + (f";t={started}" if started is not None and started >= 0 else "")


def _parse(owner: str) -> tuple[int, str, int | None] | None:
    head, *marks = owner.split(";")
    tags = dict(m.split("=", 1) for m in marks if "=" in m)
    parts = head.split(":")
    if "h" not in tags or len(parts) < 3:
        return None
    try:
        pid = int(parts[-2])
        started = int(tags["t"]) if "t" in tags else None
    except ValueError:
        return None
    return pid, tags["h"], started


def owner_gone(owner: str | None) -> bool:
    """True only when ``owner`` ran on this host and its process has certainly ended."""
    if not owner:
        return False
    parsed = _parse(owner)
    key = host_key()
    if parsed is None or key is None:
        return False
    pid, owner_key, started = parsed
    if owner_key != key or pid <= 0:
        return False
    if pid == os.getpid():
        return False  # this process: another runtime in it may hold the run
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # someone else's process exists with that pid
    except OSError:
        return False
    now_started = start_time(pid)
    if now_started == -1:
        return True
    # A live process with that pid: the owner only if it started when the owner did.
    return started is not None and now_started is not None and now_started != started
