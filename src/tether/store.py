"""The store interface: what keeps runs, their journals, waits, sessions and events.

Open one by URL with :func:`open_store` (``sqlite:///path/to/tether.db``, the
embedded default, or ``postgresql://...``) and pass it to
``Runtime(store=...)``. A new backend implements the :class:`Store` protocol
over these record types; the contract suite in tether's tests
(``tests/store/test_store_{runs,journal,events,schema,concurrency}.py``) is
what it must pass. Its module gives :func:`register_backend` a
:class:`StoreBackend` (its URL schemes and what opens one); ``open_store`` and the config's ``[store] url`` and
``TETHER_STORE_URL`` then accept its scheme.
"""

from tether._store import StoreBackend, open_store, register_backend
from tether._store.base import (
    CallRecord,
    Conflict,
    EventRecord,
    OutboxRecord,
    RunRecord,
    SessionRecord,
    SnapshotRecord,
    Store,
    WaitRecord,
)
from tether._store.states import CallState, RunStatus, WaitStatus

__all__ = [
    "CallRecord",
    "CallState",
    "Conflict",
    "EventRecord",
    "OutboxRecord",
    "RunRecord",
    "RunStatus",
    "SessionRecord",
    "SnapshotRecord",
    "Store",
    "StoreBackend",
    "WaitRecord",
    "WaitStatus",
    "open_store",
    "register_backend",
]
