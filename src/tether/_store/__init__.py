"""Durable storage: one protocol, SQLite (embedded default) and Postgres."""

from tether._store.base import CallRecord, Conflict, EventRecord, RunRecord, SnapshotRecord, Store

__all__ = ["CallRecord", "Conflict", "EventRecord", "RunRecord", "SnapshotRecord", "Store", "open_store"]


def open_store(url: str) -> Store:
    """Open a store by URL: ``sqlite:///path/to/tether.db`` or ``postgresql://...``."""
    if url.startswith("sqlite:"):
        from tether._store.sqlite import SQLiteStore

        return SQLiteStore(url)
    if url.startswith(("postgres://", "postgresql://")):
        from tether._store.postgres import PostgresStore

        return PostgresStore(url)
    from tether.errors import ConfigError

    raise ConfigError(f"store url {url!r} is neither sqlite:/// nor postgresql://")
