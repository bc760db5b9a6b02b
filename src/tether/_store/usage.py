"""What a principal holds in the store, for its quotas (tether._engine.rules.quotas)."""

from __future__ import annotations

from tether._store._schema import SQLStore
from tether._store.base import Store
from tether._store.retention import payload_bytes

ACTIVE = ("queued", "running")


def _sql(store: Store) -> SQLStore:
    if not isinstance(store, SQLStore):
        raise TypeError(f"quotas need a SQL store, not {type(store).__name__}")
    return store


# Checked at every run's start, so it reads the few active runs (runs_status_created), never the principal's
# whole history: on `principal = ?` SQLite's planner took runs_principal_created and read every run the principal
# ever had, 1 ms a start at 1,000 runs and growing (bench/README.md, issue 24). `|| ''` keeps the comparison and
# takes the column out of index selection, in SQLite and Postgres alike.
_ACTIVE = "SELECT COUNT(*) FROM runs WHERE status IN (?, ?) AND principal || '' = ?"
_STARTED = "SELECT COUNT(*) FROM runs WHERE principal = ? AND created_at >= ?"


def active_runs(any_store: Store, principal: str) -> int:
    """Runs of ``principal`` queued or running now."""
    store = _sql(any_store)
    with store._transaction(write=False, single=True) as tx:
        return int(tx.run(_ACTIVE, (*ACTIVE, principal)).fetchone()[0])


def runs_started_since(any_store: Store, principal: str, since: float) -> int:
    store = _sql(any_store)
    with store._transaction(write=False, single=True) as tx:
        return int(tx.run(_STARTED, (principal, since)).fetchone()[0])


def start_counts(any_store: Store, principal: str, since: float) -> tuple[int, int]:
    """(runs of ``principal`` active now, runs it started since ``since``): what a start is checked against.

    One statement, so one transaction (SQLite) or one round trip (Postgres) per start, not two or six.
    """
    store = _sql(any_store)
    with store._transaction(write=False, single=True) as tx:
        row = tx.run(f"SELECT ({_ACTIVE}), ({_STARTED})", (*ACTIVE, principal, principal, since)).fetchone()
        return int(row[0]), int(row[1])


def stored_bytes(any_store: Store, principal: str) -> int:
    """Payload bytes of ``principal``'s runs (with their journals, snapshots, events) and REPL sessions."""
    store = _sql(any_store)
    mine = "run_id IN (SELECT run_id FROM runs WHERE principal = ?)"
    total = 0
    with store._transaction(write=False) as tx:
        for table in ("calls", "snapshots", "events"):
            total += int(tx.run(f"SELECT COALESCE(SUM({payload_bytes(store, table)}), 0) FROM {table} WHERE {mine}",
                                (principal,)).fetchone()[0])
        total += int(tx.run(f"SELECT COALESCE(SUM({payload_bytes(store, 'runs')}), 0) FROM runs WHERE principal = ?",
                            (principal,)).fetchone()[0])
        total += int(tx.run(f"SELECT COALESCE(SUM({store.octets.format('data')}), 0) FROM sessions "
                            "WHERE principal = ?", (principal,)).fetchone()[0])
    return total


def repl_sessions(any_store: Store, principal: str, now: float) -> set[str]:
    """Names of ``principal``'s REPL sessions kept and not expired."""
    store = _sql(any_store)
    with store._transaction(write=False) as tx:
        rows = tx.run("SELECT name FROM sessions WHERE principal = ? AND (expires_at IS NULL OR expires_at >= ?)",
                      (principal, now)).fetchall()
    return {row[0] for row in rows}


__all__ = ["active_runs", "repl_sessions", "runs_started_since", "start_counts", "stored_bytes"]
