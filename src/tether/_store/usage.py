"""What a principal holds in the store, for its quotas (tether._engine.rules.quotas)."""

from __future__ import annotations

import math
from typing import Callable

from tether._store._rows import _INSERT_RUN, RUN_COLUMNS, _check_status, _encode
from tether._store._schema import SQLStore
from tether._store.base import RunRecord, Store
from tether._store.retention import payload_bytes

ACTIVE = ("queued", "running")


def _sql(store: Store) -> SQLStore:
    if not isinstance(store, SQLStore):
        raise TypeError(f"quotas need a SQL store, not {type(store).__name__}")
    return store


# Checked at every run's start, so it reads the few active runs (runs_status_created), never the principal's
# whole history: on `principal = ?` SQLite's planner took runs_principal_created and read every run the principal
# ever had, 1 ms a start at 1,000 runs and growing (D-38). `|| ''` keeps the comparison and
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


# -- runs started per period, counted in buckets (D-54, store migration 12) ---------------------------
# A period's count sums the buckets it overlaps, at most BUCKETS + 1 rows whatever the runs in it, where
# counting the runs themselves read every run of the period (0.9 ms of Postgres per start at 4,000 runs,
# D-54). A whole bucket counts if any of it is in the window, so the count can include runs
# up to one width (period / BUCKETS) older than the window, never fewer than the exact count.
BUCKETS = 60
_WINDOW = "SELECT COALESCE(SUM(runs), 0) FROM run_counts WHERE principal = ? AND ends_at > ?"
_BUMP = ("INSERT INTO run_counts (principal, ends_at, width, runs) VALUES (?, ?, ?, 1) "
         "ON CONFLICT (principal, ends_at, width) DO UPDATE SET runs = run_counts.runs + 1")


def bucket_width(period: float) -> float:
    return period / BUCKETS


def bucket_end(at: float, width: float) -> float:
    """The end of the bucket of width ``width`` that holds the instant ``at``: buckets are [end - width, end)."""
    return (math.floor(at / width) + 1) * width


def started_in_window(any_store: Store, principal: str, since: float) -> int:
    """Runs ``principal`` started since ``since`` as the buckets count them: never fewer than the exact count."""
    store = _sql(any_store)
    with store._transaction(write=False, single=True) as tx:
        return int(tx.run(_WINDOW, (principal, since)).fetchone()[0])


def create_counted(any_store: Store, run: RunRecord, since: float, width: float,
                   admit: Callable[[int, int], None]) -> None:
    """Record ``run`` and count it in its principal's bucket, if ``admit(active, started)`` returns.

    ``active`` is the principal's runs queued or running, ``started`` its runs since ``since`` (bucketed),
    both without this run; ``admit`` raises to refuse, and then nothing is written (the transaction is
    rolled back; on Postgres the writes and the count are one statement, D-54). One transaction, holding the principal's lock
    from the count to the commit, so two starts (two replicas) never both take the last slot.
    """
    store = _sql(any_store)
    _check_status(run.status)
    principal = run.principal
    assert principal is not None, "a new run has its principal"
    values = [_encode(RUN_COLUMNS, n, getattr(run, n)) for n in RUN_COLUMNS]
    with store._transaction(write=True, conflict=f"run {run.run_id!r} already exists", pipelined=True) as tx:
        store._lock_principal(tx, principal)
        row = store._insert_counting(tx, (_INSERT_RUN, values), (_BUMP, (principal, bucket_end(run.created_at, width),
                                                                       width)),
                                     (f"SELECT ({_ACTIVE}), ({_WINDOW})", (*ACTIVE, principal, principal, since)))
        admit(int(row[0]), int(row[1]))  # counted before the run's writes; a refusal rolls them back


# -- forgetting buckets no window reaches (store migration 13) ------------------------------------
# Without it the counters only went with a retention prune: a server with no [retention] days kept one row
# per principal a minute it started runs in, for ever. A bucket that ended before the longest window any
# start can count is deleted by the runner's periodic maintenance (tether._engine.worker).
#
# Longest window: this process's longest period, and BUCKETS times the widest bucket stored, since a bucket's
# width is the period of the config that wrote it: a replica sharing the store with a longer period keeps
# its own buckets, and everyone's it can count, while it starts runs (D-56).
FORGET_BATCH = 1000  # rows per transaction: short enough not to hold SQLite's one writer for long
# Kept past the window: a start computes its window from its own clock before its transaction, and
# replicas' clocks differ; neither reaches minutes, and minutes of buckets are at most a few rows.
FORGET_SLACK = 300.0
_WIDEST = "SELECT MAX(width) FROM run_counts"
_FORGET = ("DELETE FROM run_counts WHERE (principal, ends_at, width) IN "
           "(SELECT principal, ends_at, width FROM run_counts WHERE ends_at < ? ORDER BY ends_at LIMIT ?)")


def forget_counts(any_store: Store, now: float, longest_period: float, *, limit: int = FORGET_BATCH) -> int:
    """Delete up to ``limit`` buckets that ended before any window can reach them; returns how many went.

    ``longest_period`` is the longest ``period_seconds`` this process counts runs in (0: none). Both
    statements are index-backed (migration 13): the widest bucket, then the oldest buckets by their end.
    """
    store = _sql(any_store)
    with store._transaction(write=True) as tx:
        widest = tx.run(_WIDEST).fetchone()[0]
        if widest is None:
            return 0
        before = now - max(longest_period, BUCKETS * float(widest)) - FORGET_SLACK
        return int(tx.run(_FORGET, (before, int(limit))).rowcount)


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


__all__ = ["BUCKETS", "FORGET_BATCH", "FORGET_SLACK", "active_runs", "bucket_end", "bucket_width", "create_counted",
           "forget_counts", "repl_sessions", "runs_started_since", "start_counts", "started_in_window", "stored_bytes"]
