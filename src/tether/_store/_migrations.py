"""The tables' migrations: one list, rendered for each backend by its dialect. Append only.

Migrations are numbered, forward-only and never edited once released: a new
column is a new entry at the end of the list, written out as literal SQL (not
generated from the record field lists in ``_rows.py``, which change with the
code). Where the backends' SQL differs, a statement names the difference —
``{real}``, ``{blob}``, ``{serial}`` — and each dialect fills it in. A statement
only one backend needs is that backend's own (``Dialect.own``, given in its
module, so this list names no backend). ``schema_version`` holds one row per
applied migration. Entry n of the list is schema version n.

JSON is TEXT, not jsonb: jsonb refuses "\u0000" and would make the two
backends store different bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class Dialect:
    """How one backend spells what the SQL standard leaves open, and the statements only it runs."""

    name: str
    real: str  # a float column
    blob: str  # a bytes column
    serial: str  # an id column: the primary key, assigned in write order and never reused
    # Statements only this backend runs, by the schema version whose migration they end (after the shared
    # statements of that version): the hook that keeps a dialect's own tables in the backend's module.
    own: Mapping[int, tuple[str, ...]] = field(default_factory=dict, hash=False)


MIGRATIONS: list[tuple[str, ...]] = [
    (
        """CREATE TABLE runs (
            run_id TEXT PRIMARY KEY,
            status TEXT NOT NULL,
            program TEXT NOT NULL,
            environment TEXT NOT NULL,
            policy TEXT NOT NULL,
            limits TEXT NOT NULL,
            created_at {real} NOT NULL,
            updated_at {real} NOT NULL,
            principal TEXT,
            owner TEXT,
            lease_until {real},
            expires_at {real},
            result TEXT,
            error TEXT,
            pending TEXT,
            decision TEXT,
            session TEXT,
            meta TEXT NOT NULL
        )""",
        "CREATE INDEX runs_created ON runs (created_at)",
        "CREATE INDEX runs_status_created ON runs (status, created_at)",
        # Partial: the recovery and expiry sweeps only look at these statuses.
        "CREATE INDEX runs_lease ON runs (lease_until) WHERE status = 'running'",
        "CREATE INDEX runs_expiry ON runs (expires_at) WHERE status = 'paused'",
        # The primary key (run_id, seq) is also the index for reading a run's journal.
        """CREATE TABLE calls (
            run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            op TEXT NOT NULL,
            address TEXT NOT NULL,
            args TEXT NOT NULL,
            key TEXT NOT NULL,
            kind TEXT NOT NULL,
            state TEXT NOT NULL,
            outcome TEXT,
            error TEXT,
            started_at {real},
            finished_at {real},
            PRIMARY KEY (run_id, seq)
        )""",
        # {serial}: an id is never reused after a delete, so ids are write order.
        """CREATE TABLE snapshots (
            id {serial},
            run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
            kind TEXT NOT NULL,
            seq INTEGER NOT NULL,
            monty_version TEXT NOT NULL,
            data {blob} NOT NULL,
            mac TEXT NOT NULL,
            pending TEXT NOT NULL,
            created_at {real} NOT NULL,
            UNIQUE (run_id, kind)
        )""",
        """CREATE TABLE events (
            id {serial},
            run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
            type TEXT NOT NULL,
            data TEXT NOT NULL,
            created_at {real} NOT NULL
        )""",
        "CREATE INDEX events_run ON events (run_id, id)",
    ),
    (
        # 2: durable waits. No foreign key: a resolution may be buffered
        # before its run reaches the wait, and waits outlive nothing else.
        """CREATE TABLE waits (
            key TEXT PRIMARY KEY,
            run_id TEXT NOT NULL,
            name TEXT NOT NULL,
            status TEXT NOT NULL,
            created_at {real} NOT NULL,
            seq INTEGER,
            value TEXT,
            error TEXT,
            deadline {real},
            resolved_at {real},
            session TEXT
        )""",
        "CREATE INDEX waits_run ON waits (run_id, status)",
        "CREATE INDEX waits_session ON waits (session) WHERE session IS NOT NULL",
        "CREATE INDEX runs_wake ON runs (expires_at) WHERE status = 'waiting'",
    ),
    (
        # 3: REPL sessions.
        """CREATE TABLE sessions (
            name TEXT NOT NULL,
            principal TEXT NOT NULL,
            monty_version TEXT NOT NULL,
            data {blob} NOT NULL,
            mac TEXT NOT NULL,
            updated_at {real} NOT NULL,
            expires_at {real},
            PRIMARY KEY (name, principal)
        )""",
    ),
    (
        # 4: every run has an owner. Runs from before had none (the CLI and the
        # Python API set no principal) and skipped the owner check; they were
        # all started locally.
        "UPDATE runs SET principal = 'local' WHERE principal IS NULL",
    ),
    (
        # 5: idempotency keys (P-25) and how often a write was sent (P-31).
        "ALTER TABLE calls ADD COLUMN idempotency_key TEXT",
        "ALTER TABLE calls ADD COLUMN sends INTEGER NOT NULL DEFAULT 0",
    ),
    (
        # 6: the notification outbox (webhooks) and the console's change feed.
        """CREATE TABLE outbox (
            id {serial},
            target TEXT NOT NULL,
            event_id TEXT NOT NULL,
            body TEXT NOT NULL,
            status TEXT NOT NULL,
            attempts INTEGER NOT NULL,
            next_at {real} NOT NULL,
            claimed_until {real},
            last_error TEXT,
            created_at {real} NOT NULL,
            delivered_at {real},
            UNIQUE (target, event_id)
        )""",
        "CREATE INDEX outbox_due ON outbox (next_at) WHERE status = 'pending'",
        "CREATE INDEX runs_updated ON runs (updated_at)",
    ),
    (
        # 7: tool listings of sources, keyed by the source's definition, so a
        # command starts without spawning every MCP server it configures.
        "CREATE TABLE source_listings (key TEXT PRIMARY KEY, data TEXT NOT NULL, updated_at {real} NOT NULL)",
    ),
    (
        # 8: run and journal MACs (P-35). Rows written before stay NULL and are refused on resume.
        "ALTER TABLE runs ADD COLUMN mac TEXT",
        "ALTER TABLE calls ADD COLUMN mac TEXT",
    ),
    (
        # 9: run keys (P-36). The unique index, not a read before the insert, is what lets
        # two requests with one key start one run; rows without a key are not indexed.
        "ALTER TABLE runs ADD COLUMN run_key TEXT",
        "CREATE UNIQUE INDEX runs_key ON runs (principal, run_key) WHERE run_key IS NOT NULL",
    ),
    (
        # 10: the store holds no live capability (D-33). Outbox bodies carry a MAC
        # under the store's secret; console sessions signed out before they expire;
        # run lists filtered by principal in SQL.
        "ALTER TABLE outbox ADD COLUMN mac TEXT",
        "CREATE TABLE console_signouts (session TEXT PRIMARY KEY, expires_at {real} NOT NULL)",
        "CREATE INDEX runs_principal_created ON runs (principal, created_at)",
    ),
    (
        # 11: three columns called "key" get names that say which digest each holds (D-48): a call's
        # identity digest, a wait key's digest, a source definition's digest. Expand only: the new
        # columns are added and filled, and each backend's triggers (its Dialect.own) keep old and new
        # in step on insert, for replicas of the previous release still writing and reading "key"
        # during a rolling upgrade. Dropping the old columns is a later migration (docs/deploy.md).
        "ALTER TABLE calls ADD COLUMN identity_digest TEXT",
        "UPDATE calls SET identity_digest = key",
        "ALTER TABLE waits ADD COLUMN key_digest TEXT",
        "UPDATE waits SET key_digest = key",
        "CREATE UNIQUE INDEX waits_key_digest ON waits (key_digest)",
        "ALTER TABLE source_listings ADD COLUMN definition_digest TEXT",
        "UPDATE source_listings SET definition_digest = key",
        "CREATE UNIQUE INDEX source_listings_definition_digest ON source_listings (definition_digest)",
    ),
    (
        # 12: runs started per principal and time bucket (D-54), so a start's runs_per_period count
        # sums at most period/width + 1 rows instead of reading every run of the period. A bucket is
        # [ends_at - width, ends_at); width is the principal's period / 60 when the run started, so a
        # changed period adds rows of another width rather than meeting the old ones. The primary key
        # is the index the count reads (principal, then a range of ends_at). Each backend's own
        # statement (its Dialect.own) fills it from the runs already there, in 60 s buckets.
        """CREATE TABLE run_counts (
            principal TEXT NOT NULL,
            ends_at {real} NOT NULL,
            width {real} NOT NULL,
            runs INTEGER NOT NULL,
            PRIMARY KEY (principal, ends_at, width)
        )""",
    ),
    (
        # 13: what the periodic forgetting of quota counters reads (usage.forget_counts): the buckets that
        # ended longest ago (a range of ends_at, in batches), and the widest bucket stored (its width times
        # 60 is the longest period a replica sharing the store has counted in). The primary key leads with
        # the principal, so neither was index-backed.
        "CREATE INDEX run_counts_ends_at ON run_counts (ends_at)",
        "CREATE INDEX run_counts_width ON run_counts (width)",
    ),
    (
        # 14: lineage under a guarded policy (P-45, D-65). A journal entry's label and marks, or a write's
        # verdict and reasons, signed with it. And the cross-run index: a digest of each untrusted mark a
        # principal's runs were given, which a later run's write is looked up against by principal and
        # digest; the run's created_at and session bound the lookup to a window. Rows go with their run.
        "ALTER TABLE calls ADD COLUMN lineage TEXT",
        """CREATE TABLE lineage_marks (
            run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            digest TEXT NOT NULL,
            principal TEXT NOT NULL,
            session TEXT,
            created_at {real} NOT NULL,
            kind TEXT NOT NULL,
            address TEXT NOT NULL,
            path TEXT NOT NULL,
            PRIMARY KEY (run_id, seq, digest)
        )""",
        "CREATE INDEX lineage_marks_lookup ON lineage_marks (principal, digest, created_at)",
    ),
    (
        # 15: webhook events are reconciled from the runs (D-81): per webhook, a watermark: the time before which every
        # run's pause, park or end has been queued in the outbox. A replica that starts, or one that died
        # between a run's transition and its outbox row, reads runs changed since it; it moves only forward.
        "CREATE TABLE outbox_watermarks (target TEXT PRIMARY KEY, watermark {real} NOT NULL)",
    ),
]


# Migration 12's backfill, the one expression that differs: a bucket's end from a run's created_at (its
# 60 s bucket), where Postgres has FLOOR and SQLite truncates a positive number with CAST.
def backfill_run_counts(bucket_end: str) -> str:
    """The statement that counts the runs already stored into 60 s buckets (migration 12)."""
    return ("INSERT INTO run_counts (principal, ends_at, width, runs) "
            f"SELECT principal, {bucket_end}, 60, COUNT(*) FROM runs WHERE principal IS NOT NULL "
            f"GROUP BY principal, {bucket_end}")


def render(dialect: Dialect) -> list[tuple[str, ...]]:
    """The migrations as ``dialect`` runs them: entry n is schema version n, its shared statements, then
    the dialect's own."""
    beyond = sorted(version for version in dialect.own if not 1 <= version <= len(MIGRATIONS))
    if beyond:
        raise ValueError(f"dialect {dialect.name!r} adds statements to schema versions {beyond}, "
                         f"which the list (1 to {len(MIGRATIONS)}) does not have")
    fill = {"real": dialect.real, "blob": dialect.blob, "serial": dialect.serial}
    return [tuple(statement.format(**fill) for statement in (*migration, *dialect.own.get(version, ())))
            for version, migration in enumerate(MIGRATIONS, start=1)]


__all__ = ["MIGRATIONS", "Dialect", "backfill_run_counts", "render"]
