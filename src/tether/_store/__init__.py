"""Durable storage: one protocol made of narrow ports, SQLite (embedded default) and Postgres.

The backends are a registry by URL scheme: :func:`open_store` and the config's check of ``[store] url``
and ``TETHER_STORE_URL`` both ask it, so a scheme is named once, where its backend registers
(docs/architecture.md, "A new store backend"). A backend inside tether is one module under ``_store/``
and one :func:`register_backend` line at the end of this file; one outside registers through the
public ``tether.store.register_backend`` from its own module.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

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

__all__ = ["BACKENDS", "Capabilities", "CallRecord", "Conflict", "EventRecord", "EventsPort", "JournalPort",
           "ListingCachePort", "OutboxPort", "RunRecord", "RunsPort", "SessionsPort", "SignOutsPort",
           "SnapshotRecord", "SnapshotsPort", "Store", "StoreBackend", "WaitsPort", "backend_for", "expected_url",
           "open_store", "register_backend"]


@dataclass(frozen=True)
class StoreBackend:
    """A store backend: the URL prefixes it opens, and how it opens one."""

    schemes: tuple[str, ...]  # e.g. ("postgresql://", "postgres://"); a URL starting with one is this backend's
    # ``"module:attribute"`` called with the URL, imported at the first open so that checking a config never
    # imports a database driver; or the callable itself.
    opener: str | Callable[[str], Store]
    example: str  # the URL as a config error shows it: "sqlite:///path"
    # How to install the driver the opener imports ("pip install 'tether[postgres]'"), for the error a
    # URL of this scheme gets where it is missing.
    install: str = ""

    def open(self, url: str) -> Store:
        opener = self.opener
        if isinstance(opener, str):
            module, attribute = opener.split(":")
            try:
                opener = getattr(importlib.import_module(module), attribute)
            except ModuleNotFoundError as exc:
                if not exc.name or exc.name.split(".")[0] == "tether":
                    raise  # tether's own module missing is a broken install, not a driver to add
                from tether.errors import ConfigError

                raise ConfigError(
                    f"a {self.example} store needs the Python package {exc.name!r}, which is not installed; "
                    "nothing was opened",
                    next_action=f"Install it ({self.install or 'pip install ' + exc.name}), or set [store] url "
                                "(or TETHER_STORE_URL) to another store.",
                    details={"package": exc.name},
                ) from None
        store: Store = opener(url)
        return store


# By scheme prefix, in registration order (the order config errors list them in).
BACKENDS: dict[str, StoreBackend] = {}


def register_backend(backend: StoreBackend) -> StoreBackend:
    """Make ``backend``'s schemes open through :func:`open_store` and pass the config's URL check."""
    taken = [scheme for scheme in backend.schemes if scheme in BACKENDS]
    if taken or not backend.schemes:
        raise ValueError(f"store scheme {', '.join(taken) or '(none)'} is registered twice or not at all")
    for scheme in backend.schemes:
        BACKENDS[scheme] = backend
    return backend


def backend_for(url: str) -> StoreBackend | None:
    """The backend whose scheme ``url`` starts with (the longest prefix wins), or None."""
    matches = [scheme for scheme in BACKENDS if url.startswith(scheme)]
    return BACKENDS[max(matches, key=len)] if matches else None


def expected_url() -> str:
    """What a store URL must be, in the words config errors use: "a sqlite:///path or postgresql:// URL"."""
    examples = list(dict.fromkeys(backend.example for backend in BACKENDS.values()))
    listed = examples[0] if len(examples) == 1 else f"{', '.join(examples[:-1])} or {examples[-1]}"
    return f"must be a {listed} URL"


def open_store(url: str) -> Store:
    """Open a store by URL: ``sqlite:///path/to/tether.db``, ``postgresql://...``, or a registered backend's."""
    backend = backend_for(url)
    if backend is None:
        from tether.errors import ConfigError

        raise ConfigError(
            # The scheme only: the rest of a URL may hold a password.
            f"the store url's scheme {url.partition(':')[0]!r} opens no store: a store url {expected_url()}; "
            "nothing was opened",
            next_action="Set [store] url (or TETHER_STORE_URL) to a URL of a backend this tether has.",
        )
    return backend.open(url)


register_backend(StoreBackend(("sqlite:///",), "tether._store.sqlite:SQLiteStore", example="sqlite:///path"))
register_backend(StoreBackend(("postgresql://", "postgres://"), "tether._store.postgres:PostgresStore",
                              example="postgresql://", install="pip install 'tether[postgres]'"))
