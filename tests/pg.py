"""A throwaway PostgreSQL cluster for one test session (a helper, not a test).

``start()`` runs ``initdb`` into a fresh temporary directory and starts a
server listening only on a unix socket inside it, so parallel sessions never
share a port or a database. Postgres refuses to run as root: as root, the
cluster runs as the ``postgres`` system user (created by Debian's package).
``TETHER_TEST_PG_URL`` points the tests at an existing server instead.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Not a port anyone connects to over TCP: with no listen address it only names the socket file.
_PORT = 5432


@dataclass
class Cluster:
    url: str
    directory: Path
    _pg_ctl: str
    _as_user: list[str]

    def stop(self) -> None:
        subprocess.run(
            [*self._as_user, self._pg_ctl, "-D", str(self.directory / "data"), "-m", "immediate", "-w", "stop"],
            capture_output=True,
        )
        shutil.rmtree(self.directory, ignore_errors=True)


def find_bin_dir() -> str | None:
    """The directory holding ``initdb`` and ``pg_ctl``: PATH first, then Debian's versioned dirs, newest first."""
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return str(Path(initdb).resolve().parent)
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version, reverse=True)
    return str(Path(candidates[0]).parent) if candidates else None


def _version(path: str) -> float:
    try:
        return float(Path(path).parent.parent.name)
    except ValueError:
        return 0.0


def missing_reason() -> str | None:
    """Why a cluster cannot be started here, or None if it can."""
    if os.environ.get("TETHER_TEST_PG_URL"):
        return None
    if find_bin_dir() is None:
        return "PostgreSQL binaries (initdb, pg_ctl) not found; run .ci/setup-postgres.sh or set TETHER_TEST_PG_URL"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to run the cluster as"
    return None


def start() -> Cluster:
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise RuntimeError(missing_reason())
    # Short path: a unix socket path must fit in ~100 bytes.
    directory = Path(tempfile.mkdtemp(prefix="tether-pg-", dir="/tmp"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(directory, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    pg_ctl = f"{bin_dir}/pg_ctl"
    data = directory / "data"
    try:
        _run([*as_user, f"{bin_dir}/initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
        # Durability settings off: the cluster lives for one test session. Connections: a test that hands a
        # Runtime a store it opened leaves the store to the collector (a Runtime never closes what it was
        # given), so a whole session can hold a few dozen idle ones when the replica tests start theirs
        # (tests/server/test_chaos.py opens about 50); 100 was met once under load.
        options = (
            f"-c listen_addresses='' -k {directory} -p {_PORT} -c fsync=off"
            " -c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
        )
        _run([*as_user, pg_ctl, "-D", str(data), "-l", str(directory / "log"), "-w", "-t", "30", "-o", options, "start"])
    except Exception:
        log = directory / "log"
        detail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        shutil.rmtree(directory, ignore_errors=True)
        if detail:
            raise RuntimeError(f"postgres did not start; its log ends:\n{detail}") from None
        raise
    return Cluster(f"postgresql:///postgres?host={directory}&port={_PORT}&user=postgres", directory, pg_ctl, as_user)


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
