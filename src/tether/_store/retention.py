"""Retention: which ended runs a store may forget, and forgetting them in small batches.

Only completed, failed and cancelled runs are ever pruned: a queued, running,
paused or waiting run is never selected, whatever its age. What protects a run
lives exactly as long as it: its run key (P-36) is a column of the run row and
its approval and wait records are deleted in the same transaction as the run,
never before it. A run past its days loses its row, journal, snapshots,
events and waits — or, with ``keep_journals``, only its snapshots, events and
waits (the row, its result and its journal stay for audit).

Also forgotten: sessions expired for longer than completed runs are kept, and
webhook deliveries (outbox rows) that ended that long ago.

The byte counts are the payload columns' sizes, an estimate of what a prune
frees inside the store; a SQLite file gives the pages back to the file system
only after ``VACUUM`` (docs/deploy.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from tether._store._schema import SQLStore, Tx
from tether._store.base import Store

DAY = 86400.0
# Statuses a prune may select: nothing else, ever.
ENDED = ("completed", "failed", "cancelled", "rolled_back")
# Runs forgotten per transaction: short enough not to hold SQLite's one writer for long.
BATCH = 100

# Per table: the columns whose size the estimate counts (the payloads; keys and times are noise).
_PAYLOAD = {
    "runs": ("program", "environment", "policy", "limits", "result", "error", "pending", "decision", "meta"),
    "calls": ("args", "outcome", "error"),
    "snapshots": ("data", "pending"),
    "events": ("data",),
    "waits": ("value", "error"),
}
_JOURNAL_TABLES = ("snapshots", "events", "waits", "calls")


@dataclass(frozen=True)
class RetentionRules:
    """Days to keep ended runs, per status (None: keep forever), and whether pruning keeps journals."""

    days: Mapping[str, float | None] = field(default_factory=dict)
    keep_journals: bool = False

    def __post_init__(self) -> None:
        for status in self.days:
            if status not in ENDED:
                raise ValueError(f"retention applies to {', '.join(ENDED)} runs only, not {status!r}")

    def horizon(self) -> float | None:
        """The shortest number of days anything is kept (what expired sessions and old deliveries get)."""
        kept = [d for d in self.days.values() if d is not None]
        return min(kept) if kept else None


@dataclass
class PruneReport:
    """What a prune removed (or, dry, would remove): rows per table and their payload bytes."""

    runs: int = 0
    calls: int = 0
    snapshots: int = 0
    events: int = 0
    waits: int = 0
    sessions: int = 0
    outbox: int = 0
    bytes: int = 0
    dry_run: bool = False

    def add(self, other: "PruneReport") -> None:
        for name in ("runs", "calls", "snapshots", "events", "waits", "sessions", "outbox", "bytes"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sql(store: Store) -> SQLStore:
    if not isinstance(store, SQLStore):
        raise TypeError(f"retention needs a SQL store, not {type(store).__name__}")
    return store


def _where(rules: RetentionRules, now: float) -> tuple[str, list[Any]]:
    parts: list[str] = []
    params: list[Any] = []
    for status, days in sorted(rules.days.items()):
        if days is not None:
            parts.append("(status = ? AND updated_at < ?)")
            params += [status, now - days * DAY]
    if not parts:
        return "1 = 0", []
    where = "(" + " OR ".join(parts) + ")"
    if rules.keep_journals:
        # A run already stripped is not selected again.
        where += " AND (" + " OR ".join(f"EXISTS (SELECT 1 FROM {t} x WHERE x.run_id = runs.run_id)"
                                         for t in ("snapshots", "events", "waits")) + ")"
    return where, params


def payload_bytes(store: SQLStore, table: str) -> str:
    """SQL for one row's payload bytes in ``table`` (runs, calls, snapshots, events, waits)."""
    return _size(store, table)


def _size(store: SQLStore, table: str) -> str:
    return " + ".join(f"COALESCE({store.octets.format(c)}, 0)" for c in _PAYLOAD[table])


def _measure(store: SQLStore, tx: Tx, scope: str, params: list[Any], report: PruneReport, keep: bool) -> None:
    """Add the rows ``scope`` (a run_id IN (...) clause) selects, per table, and their bytes."""
    tables = ("snapshots", "events", "waits") if keep else _JOURNAL_TABLES
    for table in tables:
        n, size = tx.run(f"SELECT COUNT(*), COALESCE(SUM({_size(store, table)}), 0) FROM {table} WHERE {scope}",
                         params).fetchone()
        setattr(report, table, getattr(report, table) + int(n))
        report.bytes += int(size)


def prune(any_store: Store, rules: RetentionRules, now: float, *, limit: int | None = BATCH,
          dry_run: bool = False) -> PruneReport:
    """Forget up to ``limit`` ended runs past their days (all of them with None), in one transaction.

    ``dry_run`` counts what would go (every run past its days, whatever ``limit``) and changes nothing.
    """
    store = _sql(any_store)
    where, params = _where(rules, now)
    report = PruneReport(dry_run=dry_run)
    with store._transaction(write=not dry_run) as tx:
        if dry_run:
            scope, scope_params = f"run_id IN (SELECT run_id FROM runs WHERE {where})", params
            ids: list[str] = []
        else:
            sql = f"SELECT run_id FROM runs WHERE {where} ORDER BY updated_at"
            if limit is not None:
                sql += f" LIMIT {int(limit)}"
            ids = [row[0] for row in tx.run(sql, params).fetchall()]
            if not ids:
                _forget_leftovers(store, tx, rules, now, report)
                return report
            # Every statement re-checks that the run has ended, whatever happened since the select.
            scope = (f"run_id IN (SELECT run_id FROM runs WHERE run_id IN ({', '.join('?' for _ in ids)}) "
                     f"AND status IN ({', '.join('?' for _ in ENDED)}))")
            scope_params = list(ids) + list(ENDED)
        _measure(store, tx, scope, scope_params, report, rules.keep_journals)
        if not rules.keep_journals:
            n, size = tx.run(f"SELECT COUNT(*), COALESCE(SUM({_size(store, 'runs')}), 0) FROM runs WHERE {scope}",
                             scope_params).fetchone()
            report.runs, report.bytes = int(n), report.bytes + int(size)
        else:
            report.runs = int(tx.run(f"SELECT COUNT(*) FROM runs WHERE {scope}", scope_params).fetchone()[0])
        if not dry_run:
            # Waits have no foreign key to runs: deleted first, in the same transaction as the run.
            for table in ("waits", "snapshots", "events"):
                tx.run(f"DELETE FROM {table} WHERE {scope}", scope_params)
            if not rules.keep_journals:
                # The cross-run index of untrusted marks (P-45) is forgotten with the journal it was made from.
                tx.run(f"DELETE FROM lineage_marks WHERE {scope}", scope_params)
                tx.run(f"DELETE FROM calls WHERE {scope}", scope_params)
                tx.run(f"DELETE FROM runs WHERE {scope}", scope_params)
        _forget_leftovers(store, tx, rules, now, report)
    return report


def _forget_leftovers(store: SQLStore, tx: Tx, rules: RetentionRules, now: float, report: PruneReport) -> None:
    """Sessions expired, webhook deliveries ended and quota buckets ended longer ago than the shortest retention."""
    days = rules.horizon()
    if days is None:
        return
    before = now - days * DAY
    for table, where, params in (
        ("sessions", "expires_at IS NOT NULL AND expires_at < ?", [before]),
        ("outbox", "status IN ('delivered', 'failed') AND created_at < ?", [before]),
    ):
        column = "data" if table == "sessions" else "body"
        n, size = tx.run(f"SELECT COUNT(*), COALESCE(SUM({store.octets.format(column)}), 0) FROM {table} "
                         f"WHERE {where}", params).fetchone()
        setattr(report, table, getattr(report, table) + int(n))
        report.bytes += int(size)
        if not report.dry_run and n:
            tx.run(f"DELETE FROM {table} WHERE {where}", params)
    if not report.dry_run:
        # Quota buckets (D-54) that ended before the horizon: the runs they counted are prunable too, so
        # a period longer than the shortest retention counts no more than its runs still stored would.
        tx.run("DELETE FROM run_counts WHERE ends_at < ?", [before])


def prune_all(store: Store, rules: RetentionRules, now: float, *, batch: int = BATCH) -> PruneReport:
    """Prune in batches until nothing is left past its days."""
    total = PruneReport()
    while True:
        step = prune(store, rules, now, limit=batch)
        total.add(step)
        if step.runs < batch:
            return total


def stats(any_store: Store, rules: RetentionRules, now: float) -> dict[str, Any]:
    """The store's size, its rows, runs by status, and what a prune would free now."""
    store = _sql(any_store)
    with store._transaction(write=False) as tx:
        by_status = {row[0]: int(row[1]) for row in
                     tx.run("SELECT status, COUNT(*) FROM runs GROUP BY status ORDER BY status").fetchall()}
        rows = {t: int(tx.run(f"SELECT COUNT(*) FROM {t}").fetchone()[0])
                for t in ("runs", "calls", "snapshots", "events", "waits", "sessions", "outbox", "run_counts")}
    return {"size_bytes": store.store_size_bytes(), "runs_by_status": by_status, "rows": rows,
            "retention": {"days": dict(rules.days), "keep_journals": rules.keep_journals},
            "prune": prune(store, rules, now, dry_run=True).to_dict()}




def live_counts(any_store: Store, now: float) -> dict[str, Any]:
    """What metrics read at each scrape: runs by status, pauses with their oldest, outbox backlog, size."""
    store = _sql(any_store)
    with store._transaction(write=False) as tx:
        by_status = {row[0]: int(row[1]) for row in
                     tx.run("SELECT status, COUNT(*) FROM runs GROUP BY status").fetchall()}
        pauses = {row[0]: (int(row[1]), row[2]) for row in tx.run(
            "SELECT status, COUNT(*), MIN(updated_at) FROM runs WHERE status IN ('paused', 'waiting') "
            "GROUP BY status").fetchall()}
        backlog = int(tx.run("SELECT COUNT(*) FROM outbox WHERE status = 'pending'").fetchone()[0])
    return {"runs_by_status": by_status, "pauses": pauses, "outbox_pending": backlog,
            "size_bytes": store.store_size_bytes()}


__all__ = ["BATCH", "ENDED", "PruneReport", "RetentionRules", "live_counts", "payload_bytes", "prune", "prune_all", "stats"]
