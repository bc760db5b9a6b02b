"""Durable storage: one protocol made of narrow ports, SQLite (embedded default) and Postgres."""

from tether._store.base import (
    CallRecord,
    Capabilities,
    Conflict,
    EventRecord,
    EventsPort,
    JournalPort,
    ListingCachePort,
    OutboxPort,
    RunRecord,
    RunsPort,
    SessionsPort,
    SignOutsPort,
    SnapshotRecord,
    SnapshotsPort,
    Store,
    WaitsPort,
)

__all__ = ["Capabilities", "CallRecord", "Conflict", "EventRecord", "EventsPort", "JournalPort", "ListingCachePort",
           "OutboxPort", "RunRecord", "RunsPort", "SessionsPort", "SignOutsPort", "SnapshotRecord", "SnapshotsPort",
           "Store", "WaitsPort", "open_store"]


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
