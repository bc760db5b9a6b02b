"""`tether store stats` and `tether runs prune`: how big the store is, and forgetting ended runs ([retention])."""

from __future__ import annotations

import argparse
import time
from typing import Any

from tether.cli._common import EXIT_OK, add_common, print_json


def _open(args: argparse.Namespace) -> tuple[Any, Any]:
    from tether._config import load_config
    from tether._store import open_store

    config = load_config(args.config)
    return open_store(config.store.url), config.retention.rules()


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def _kept(rules: Any) -> str:
    days = ", ".join(f"{s} {d:g} days" if d is not None else f"{s} forever" for s, d in sorted(rules.days.items()))
    return days + ("; journals kept" if rules.keep_journals else "")


async def cmd_store_stats(args: argparse.Namespace) -> int:
    from tether._store.retention import stats

    store, rules = _open(args)
    try:
        data = stats(store, rules, time.time())
    finally:
        store.close()
    if args.json:
        print_json(data)
        return EXIT_OK
    print(f"store size: {_size(data['size_bytes'])}")
    print("runs: " + (", ".join(f"{n} {s}" for s, n in data["runs_by_status"].items()) or "none"))
    print("rows: " + ", ".join(f"{n} {t}" for t, n in data["rows"].items()))
    p = data["prune"]
    print(f"retention: {_kept(rules)}")
    print(f"a prune now would remove {p['runs']} runs ({p['calls']} calls, {p['snapshots']} snapshots, "
          f"{p['events']} events, {p['waits']} waits), {p['sessions']} expired sessions and {p['outbox']} "
          f"deliveries: about {_size(p['bytes'])}")
    return EXIT_OK


async def cmd_runs_prune(args: argparse.Namespace) -> int:
    from tether._store.retention import prune, prune_all

    store, rules = _open(args)
    try:
        now = time.time()
        report = prune(store, rules, now, limit=None, dry_run=True) if args.dry_run else prune_all(store, rules, now)
    finally:
        store.close()
    if args.json:
        print_json(report.to_dict())
        return EXIT_OK
    verb = "would remove" if args.dry_run else "removed"
    print(f"{verb} {report.runs} ended runs past their days ({_kept(rules)}): {report.calls} calls, "
          f"{report.snapshots} snapshots, {report.events} events, {report.waits} waits, {report.sessions} expired "
          f"sessions, {report.outbox} deliveries; about {_size(report.bytes)}. Paused, waiting and running runs "
          "are never pruned.")
    return EXIT_OK


async def cmd_store_backup(args: argparse.Namespace) -> int:
    # A short burst of file work with nothing else on the loop.
    return _backup(args)


def _backup(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tether._store.sqlite import SQLiteStore
    from tether.errors import ConfigError

    store, _ = _open(args)
    try:
        if not isinstance(store, SQLiteStore) or store.path is None:
            raise ConfigError("tether store backup copies a SQLite store; nothing was written",
                              next_action="Back up Postgres with pg_dump (docs/deploy.md \"Backups\").")
        dest = Path(args.dest).expanduser().resolve()
        size = store.backup_to(dest)
        secret = Path(f"{store.path}.secret")
    finally:
        store.close()
    from tether._store.private import mode_of

    data = {"backup": str(dest), "bytes": size, "mode": mode_of(dest),
            "secret": str(secret) if secret.exists() else None}
    if args.json:
        print_json(data)
        return EXIT_OK
    # Where and with what mode: the copy holds every journal, so who can read it matters (P-44).
    print(f"backed up {store.path} to {dest} ({_size(size)}, mode {data['mode']}: readable by this user only)")
    if data["secret"]:
        print(f"not copied: the signing secret {secret}; keep a copy of it apart from the data and restore it "
              f"as {dest}.secret (or set TETHER_SECRET), or the copy's paused runs cannot be resumed")
    return EXIT_OK


def add_prune(runs: Any) -> None:
    sp = runs.add_parser("prune", help="forget ended runs past their [retention] days (never paused, waiting, running)")
    sp.add_argument("--dry-run", action="store_true", help="count what would go; change nothing")
    add_common(sp, tools=False)
    sp.set_defaults(func=cmd_runs_prune)


def add_store(sub: Any) -> None:
    store = sub.add_parser("store", help="the store: its size, what a prune would free, a backup").add_subparsers(
        dest="store_command", required=True)
    sp = store.add_parser("stats", help="size, rows, runs by status, what a prune would free")
    add_common(sp, tools=False)
    sp.set_defaults(func=cmd_store_stats)
    sp = store.add_parser("backup", help="a consistent copy of a SQLite store while it serves (not its secret)")
    sp.add_argument("dest", help="the new file to write")
    add_common(sp, tools=False)
    sp.set_defaults(func=cmd_store_backup)
